"""Image text recognition for ``POST /memory/ocr`` (§3.4), behind a port.

Why a port: an OCR engine is optional native code (the contract names Kylin's kysdk-ocr; this
build can use RapidOCR, whose ONNX models ship inside its wheel, so nothing is downloaded at
run time), and the simulator and tests must be able to replace it.  ``ocr_engine_of(env)``
returns ``env.extras["ocr_engine"]`` when set, else RapidOCR when the ``ocr`` extra is
installed, else None: the route then answers 503 ``OCR_UNAVAILABLE``, as the contract wants
on a machine without an engine.

Recognition is CPU-bound and blocking: it runs in one long-lived worker process
(``_worker.py``, started lazily, restarted when it dies, stopped at shutdown) waited on from a
worker thread (``trio.to_thread``), one at a time (``ocr_concurrent_max``) with at most
``ocr_waiting_max`` waiting (``OcrService``), so two large images cannot take both cores from
the event loop.  Images are bounded: ``ocr_image_bytes_max`` decoded bytes (what 20 MB of base64
decodes to), whether uploaded or read from ``image_path``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

ocr_engine_extra = "ocr_engine"
ocr_image_base64_characters_max = 20 * 1024 * 1024
"""The contract's limit on ``image_base64`` (20 MB of base64 text)."""
ocr_image_bytes_max = ocr_image_base64_characters_max // 4 * 3
"""What the largest accepted base64 decodes to; also the limit for ``image_path`` files."""
ocr_concurrent_max = 1
ocr_worker_timeout_seconds = 120.0
"""One recognition in the worker process, model loading included."""
ocr_lines_max = 10_000
"""Lines one answer carries (a page rarely has a few hundred)."""
ocr_waiting_max = 8
"""Recognitions that may wait for the worker; one more is 503 ``OCR_UNAVAILABLE`` (busy)."""
ocr_worker_stop_seconds = 5.0
"""How long a stopping worker may take to end before it is killed."""
ocr_answer_bytes_max = 8 * 1024 * 1024
"""One answer line from the worker."""
frame_header_bytes = 8

assert ocr_image_bytes_max < ocr_image_base64_characters_max


class OcrEngine(Protocol):
    name: str

    def recognise(self, image: bytes) -> Sequence[str]:
        """The text lines found in ``image`` (encoded PNG/JPEG/...), top to bottom.  Blocking;
        raises ``OcrImageInvalid`` for bytes that are not an image."""


class OcrImageInvalid(ValueError):
    """The bytes are not an image the engine can read (400 ``INVALID_REQUEST``)."""


class OcrEngineFailed(RuntimeError):
    """The engine could not answer (crashed, timed out): 503 ``OCR_UNAVAILABLE``."""


@dataclass(frozen=True)
class OcrResult:
    text_lines: tuple[str, ...]
    engine: str
    latency_ms: int

    def encode(self) -> dict[str, Any]:
        return {"text_lines": list(self.text_lines), "text": "\n".join(self.text_lines), "engine": self.engine,
                "latency_ms": self.latency_ms}


class RapidOcrEngine:
    """RapidOCR (PaddleOCR's PP-OCRv4 models on onnxruntime, Chinese and English); the models
    are files inside the ``rapidocr_onnxruntime`` wheel.  Recognition runs in one long-lived
    worker process (``_worker.py``, a plain script): onnxruntime crashes a process that has
    loaded usearch, and a native crash must not take the server down.

    The worker is started by the first recognition (loading the models takes seconds; later
    pages reuse them), serves one image at a time (callers are serialised by a lock; the
    route bounds how many wait), is started again when it died (a worker found dead at a
    request, even one killed while idle, is replaced and the request tried once more on the
    fresh one) or timed out (killed), and is stopped by ``close()`` (the app's shutdown).  ``command`` replaces the
    worker (tests)."""

    name = "RapidOCR"

    def __init__(self, python: str = sys.executable, *, command: Sequence[str] | None = None,
                 timeout_seconds: float = ocr_worker_timeout_seconds) -> None:
        self._command = list(command) if command is not None else [
            python, "-I", str(pathlib.Path(__file__).with_name("_worker.py"))]
        self._timeout_seconds = timeout_seconds
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._fresh = False
        self.starts = 0
        """Worker processes started so far (one per model load)."""

    @property
    def worker_pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def recognise(self, image: bytes) -> Sequence[str]:
        with self._lock:
            line = self._exchange(image)
            if line is None and not self._fresh:
                # The worker had died while idle (killed, out of memory): one fresh try.
                line = self._exchange(image)
            if line is None:
                raise OcrEngineFailed("the OCR worker ended or took too long")
            try:
                answer = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                self._stop_worker()  # out of step with us: never trust its next line
                raise OcrEngineFailed("the OCR worker answered something that is not JSON") from exc
        if answer.get("error") == "invalid_image":
            raise OcrImageInvalid("the image could not be decoded")
        if "lines" not in answer:
            raise OcrEngineFailed(f"the OCR worker failed: {answer.get('error')}")
        return [str(line) for line in answer["lines"]][:ocr_lines_max]

    def _exchange(self, image: bytes) -> bytes | None:
        """Send ``image`` to the worker (started when there is none) and read its answer line;
        None (and the worker stopped) when it ended or timed out."""
        process = self._running_worker()
        try:
            assert process.stdin is not None
            process.stdin.write(len(image).to_bytes(frame_header_bytes, "big") + image)
            process.stdin.flush()
            line = _read_line(process, self._timeout_seconds)
        except OSError:  # a broken pipe: the worker is gone
            line = None
        if line is None:
            self._stop_worker()
        return line

    def close(self) -> None:
        """Stop the worker (it ends on the end of its input; killed after a grace period)."""
        with self._lock:
            self._stop_worker()

    def _running_worker(self) -> subprocess.Popen[bytes]:
        self._fresh = False
        if self._process is not None and self._process.poll() is not None:
            self._stop_worker()
        if self._process is None:
            self._process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL)
            self.starts += 1
            self._fresh = True
        return self._process

    def _stop_worker(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=ocr_worker_stop_seconds)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()


def _read_line(process: subprocess.Popen[bytes], timeout_seconds: float) -> bytes | None:
    """One answer line from the worker (at most ``ocr_answer_bytes_max``), or None when it
    ended or did not answer in time (a timer kills it then, which ends the read)."""
    assert process.stdout is not None
    killer = threading.Timer(timeout_seconds, process.kill)
    killer.daemon = True
    killer.start()
    try:
        line = process.stdout.readline(ocr_answer_bytes_max + 1)
    finally:
        killer.cancel()
    if not line.endswith(b"\n"):
        return None
    return line[:-1]


def installed_engine() -> OcrEngine | None:
    """RapidOCR when the ``ocr`` extra is installed (found without importing it: see
    ``RapidOcrEngine``), else None."""
    if importlib.util.find_spec("rapidocr_onnxruntime") is None:
        return None
    return RapidOcrEngine()


def ocr_engine_of(env: Any) -> OcrEngine | None:
    extras = getattr(env, "extras", {})
    if ocr_engine_extra in extras:
        return extras[ocr_engine_extra]
    return installed_engine()


class OcrBusy(RuntimeError):
    """More recognitions wait than ``ocr_waiting_max``: 503 ``OCR_UNAVAILABLE``, retry later."""


class OcrService:
    """One engine for one app: recognitions run one at a time in a worker thread (so two large
    images cannot take both cores from the event loop), at most ``ocr_waiting_max`` wait, and
    ``aclose`` stops the engine's worker at shutdown."""

    def __init__(self, engine: OcrEngine) -> None:
        self.engine = engine
        self._limiter: trio.CapacityLimiter | None = None
        self.waiting = 0

    async def recognise(self, image: bytes, clock: Any) -> OcrResult:
        if self.waiting >= ocr_waiting_max:
            raise OcrBusy(f"{ocr_waiting_max} recognitions are already waiting")
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(ocr_concurrent_max)
        self.waiting += 1
        try:
            started = clock.monotonic()
            lines = await trio.to_thread.run_sync(self.engine.recognise, image, limiter=self._limiter)
        finally:
            self.waiting -= 1
        return OcrResult(tuple(lines), self.engine.name, max(0, round((clock.monotonic() - started) * 1000)))

    async def aclose(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(close)


async def recognise(engine: OcrEngine, image: bytes, clock: Any) -> OcrResult:
    """Run ``engine`` on ``image`` once (a service of its own; the route keeps one)."""
    return await OcrService(engine).recognise(image, clock)


@dataclass(frozen=True)
class ImageRead:
    content: bytes | None = None
    problem: str | None = None
    """``missing`` | ``unreadable`` | ``too_large`` | ``not_a_file``."""


def _read_image(path: str, bytes_max: int) -> ImageRead:
    try:
        if not os.path.exists(path):
            return ImageRead(problem="missing")
        if not os.path.isfile(path):
            return ImageRead(problem="not_a_file")
        with open(path, "rb") as handle:
            content = handle.read(bytes_max + 1)
    except OSError:
        return ImageRead(problem="unreadable")
    return ImageRead(problem="too_large") if len(content) > bytes_max else ImageRead(content=content)


async def read_image_file(path: str, bytes_max: int = ocr_image_bytes_max) -> ImageRead:
    """At most ``bytes_max`` bytes of the file at ``path``, in a worker thread."""
    return await trio.to_thread.run_sync(_read_image, path, bytes_max)


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
