"""troupe.actors.knowledge.ocr: image text recognition behind a port (``/memory/ocr``, §3.4).

- ``_engine``: the ``OcrEngine`` port, RapidOCR (the ``ocr`` extra; models inside its wheel)
  run in one long-lived worker process, ``OcrService`` (one per app: serialised, bounded
  waiting, stopped at shutdown), the image limits and the bounded readers;
- ``_worker.py``: the worker script (never imported by the server).
"""

from ._engine import (
    ImageRead,
    OcrBusy,
    OcrEngine,
    OcrEngineFailed,
    OcrImageInvalid,
    OcrResult,
    OcrService,
    RapidOcrEngine,
    installed_engine,
    ocr_answer_bytes_max,
    ocr_concurrent_max,
    ocr_engine_extra,
    ocr_engine_of,
    ocr_image_base64_characters_max,
    ocr_image_bytes_max,
    ocr_lines_max,
    ocr_waiting_max,
    ocr_worker_stop_seconds,
    ocr_worker_timeout_seconds,
    read_image_file,
    recognise,
)

__all__ = [
    "ImageRead",
    "OcrBusy",
    "OcrEngine",
    "OcrEngineFailed",
    "OcrImageInvalid",
    "OcrResult",
    "OcrService",
    "RapidOcrEngine",
    "installed_engine",
    "ocr_concurrent_max",
    "ocr_engine_extra",
    "ocr_engine_of",
    "ocr_image_base64_characters_max",
    "ocr_answer_bytes_max",
    "ocr_image_bytes_max",
    "ocr_lines_max",
    "ocr_waiting_max",
    "ocr_worker_stop_seconds",
    "ocr_worker_timeout_seconds",
    "read_image_file",
    "recognise",
]
