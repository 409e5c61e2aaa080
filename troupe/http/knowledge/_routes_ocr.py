"""``POST /memory/ocr`` (§3.4): text from an uploaded image (``image_base64``) or a local file
(``image_path``, absolute).

Order of checks: the body's shape first (exactly one of the two fields; 400), then the size
(413 ``PAYLOAD_TOO_LARGE`` above the contract's 20 MB of base64 or the decoded-size limit for a
file), then whether an engine is installed (503 ``OCR_UNAVAILABLE``), then the bytes (bad
base64, an unreadable file or bytes that are not an image: 400).  ``image_path`` must be
absolute and is read in a worker thread, never more than the decoded-size limit plus one
byte.  The app keeps one ``OcrService`` per engine (``troupe.actors.knowledge.ocr``): the
installed engine's worker process is started by the first request and reused, and stopped
when the app stops; more than ``ocr_waiting_max`` waiting requests are 503
``OCR_UNAVAILABLE`` with ``Retry-After``.  Nothing is stored: recognition is a tool the client
uses before it writes evidence with ``source_type`` ``OCR``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from quart import Response

from troupe.actors.knowledge.ocr import (
    OcrBusy,
    OcrEngineFailed,
    OcrImageInvalid,
    OcrService,
    ocr_engine_extra,
    ocr_engine_of,
    ocr_image_base64_characters_max,
    ocr_image_bytes_max,
    read_image_file,
)

from ._errors import KnowledgeError, code_invalid_request, code_payload_too_large

code_ocr_unavailable = "OCR_UNAVAILABLE"
image_path_characters_max = 4_096
ocr_busy_retry_after_seconds = 5


def ocr_image_source(document: Any) -> tuple[str, str]:
    """``("base64", text)`` or ``("path", path)``; 400/413 ``KnowledgeError`` otherwise."""
    if not isinstance(document, Mapping):
        raise KnowledgeError(code_invalid_request, "the body must be a JSON object")
    unknown = sorted(set(document) - {"image_base64", "image_path"})
    if unknown:
        raise KnowledgeError(code_invalid_request, f"unknown field '{unknown[0]}'")
    given = [name for name in ("image_base64", "image_path") if document.get(name) is not None]
    if len(given) != 1:
        raise KnowledgeError(code_invalid_request, "give exactly one of 'image_base64' and 'image_path'")
    name = given[0]
    value = document[name]
    if not isinstance(value, str) or not value:
        raise KnowledgeError(code_invalid_request, f"field '{name}' must be a non-empty string")
    if name == "image_base64":
        if len(value) > ocr_image_base64_characters_max:
            raise KnowledgeError(code_payload_too_large,
                                 f"field 'image_base64' is longer than {ocr_image_base64_characters_max} characters")
        return "base64", value
    if len(value) > image_path_characters_max or "\x00" in value or not value.startswith("/"):
        raise KnowledgeError(code_invalid_request, "field 'image_path' must be an absolute path")
    return "path", value


async def _image_bytes(kind: str, value: str) -> bytes:
    if kind == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KnowledgeError(code_invalid_request, "field 'image_base64' is not valid base64") from exc
    read = await read_image_file(value, ocr_image_bytes_max)
    if read.problem == "too_large":
        raise KnowledgeError(code_payload_too_large, f"the image file is larger than {ocr_image_bytes_max} bytes")
    if read.content is None:
        raise KnowledgeError(code_invalid_request, f"field 'image_path' cannot be read ({read.problem})")
    return read.content


def install_ocr_routes(app: Any, dependencies: Any) -> None:
    from ._app import _body, _register, json_response

    services: dict[int, OcrService] = {}
    """One service per engine for this app's life: the installed engine is found once and
    kept, so its worker process lives until shutdown."""
    installed: list[Any] = []

    def current_engine() -> Any:
        extras = dependencies.env.extras
        if ocr_engine_extra in extras:  # tests and the simulator
            return extras[ocr_engine_extra]
        if not installed:
            installed.append(ocr_engine_of(dependencies.env))
        return installed[0]

    def service_of(engine: Any) -> OcrService:
        service = services.get(id(engine))
        if service is None or service.engine is not engine:
            service = services[id(engine)] = OcrService(engine)
        return service

    @_register(app, "memory_ocr")
    async def memory_ocr() -> Response:
        kind, value = ocr_image_source(await _body())
        engine = current_engine()
        if engine is None:
            raise KnowledgeError(code_ocr_unavailable, "no OCR engine is installed on this machine")
        image = await _image_bytes(kind, value)
        try:
            result = await service_of(engine).recognise(image, dependencies.env.clock)
        except OcrImageInvalid as exc:
            raise KnowledgeError(code_invalid_request, "the bytes are not an image the OCR engine can read") from exc
        except OcrBusy as exc:
            raise KnowledgeError(code_ocr_unavailable, "the OCR engine is busy; retry later",
                                 headers={"Retry-After": str(ocr_busy_retry_after_seconds)}) from exc
        except OcrEngineFailed as exc:
            raise KnowledgeError(code_ocr_unavailable, "the OCR engine failed; retry later") from exc
        return json_response(result.encode())

    @app.after_serving
    async def stop_ocr_workers() -> None:
        for service in list(services.values()):
            await service.aclose()
        services.clear()


__all__ = [
    "code_ocr_unavailable",
    "image_path_characters_max",
    "install_ocr_routes",
    "ocr_busy_retry_after_seconds",
    "ocr_image_source",
]
