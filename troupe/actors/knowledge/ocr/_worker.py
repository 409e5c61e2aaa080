"""The OCR worker process: a loop of framed requests on stdin, one JSON line per answer on
stdout, alive as long as the server keeps it.

Why a separate process, run as a plain script (never imported by the server): onnxruntime
and usearch cannot share a process (importing onnxruntime after usearch crashes with a
segmentation fault, seen with onnxruntime 1.32 and usearch 2.26.6), and a native crash in an
OCR engine must never take the server down with it.  Why long-lived: loading the models takes
seconds, recognising a page a fraction of that; the server keeps one worker and restarts it
when it dies.  This file imports nothing from troupe.

Request: an 8-byte big-endian length, then that many bytes of an encoded image; a length of
zero or the end of stdin ends the worker.  Answer: ``{"lines": [...]}`` or
``{"error": "invalid_image" | "engine_unavailable" | "too_large"}``.  Anything the libraries
print goes to stderr (file descriptor 1 is moved there), so stdout carries answers only.
"""

import json
import os
import sys

frame_header_bytes = 8
image_bytes_max = 15 * 1024 * 1024 + 1024


def read_exactly(stream, count):
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray library output must never corrupt an answer line
    requests = sys.stdin.buffer
    engine = None
    while True:
        header = read_exactly(requests, frame_header_bytes)
        if header is None:
            return 0
        length = int.from_bytes(header, "big")
        if length == 0:
            return 0
        if length > image_bytes_max:
            answers.write(json.dumps({"error": "too_large"}) + "\n")
            answers.flush()
            return 0  # the stream cannot be resynchronised cheaply: end, the server restarts us
        image = read_exactly(requests, length)
        if image is None:
            return 0
        try:
            import cv2
            import numpy
            from rapidocr_onnxruntime import RapidOCR

            engine = engine or RapidOCR()
        except Exception:
            answers.write(json.dumps({"error": "engine_unavailable"}) + "\n")
            answers.flush()
            continue
        decoded = cv2.imdecode(numpy.frombuffer(image, dtype=numpy.uint8), cv2.IMREAD_COLOR)
        if decoded is None:
            answer = {"error": "invalid_image"}
        else:
            result, _ = engine(decoded)
            answer = {"lines": [str(line[1]) for line in (result or [])]}
        answers.write(json.dumps(answer, ensure_ascii=False) + "\n")
        answers.flush()


if __name__ == "__main__":
    sys.exit(main())
