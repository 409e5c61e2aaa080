"""/memory/ocr: validation, the 20 MB limit at and over its boundary, 503 OCR_UNAVAILABLE
without an engine, and a fake engine through ``env.extras["ocr_engine"]``.  The real RapidOCR
engine (the ``ocr`` extra) is exercised when installed."""

from __future__ import annotations

import base64
import importlib.util
import io
import os
import signal
import sys
import types

import pytest
import trio

from troupe.actors.knowledge.ocr import (
    OcrBusy,
    OcrEngineFailed,
    OcrImageInvalid,
    OcrService,
    RapidOcrEngine,
    ocr_engine_extra,
    ocr_image_base64_characters_max,
    ocr_image_bytes_max,
    ocr_waiting_max,
)

from ._knowledge_harness import assert_error


class FakeEngine:
    name = "Fake"

    def recognise(self, image: bytes):
        if not image.startswith(b"\x89PNG"):
            raise OcrImageInvalid("not an image")
        return ["2026年4月家庭支出清单", "电费 210 元"]


png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


@pytest.fixture
def no_engine(knowledge_server):
    knowledge_server.env.extras[ocr_engine_extra] = None


@pytest.fixture
def fake_engine(knowledge_server):
    knowledge_server.env.extras[ocr_engine_extra] = FakeEngine()


async def test_no_engine_is_503(client, no_engine, tmp_path):
    body = {"image_base64": base64.b64encode(png).decode()}
    document = assert_error(await client.post("/memory/ocr", json=body), 503, "OCR_UNAVAILABLE")
    assert document["error"] == "OCR_UNAVAILABLE"
    assert_error(await client.post("/memory/ocr", json={"image_path": str(tmp_path / "x.png")}), 503,
                 "OCR_UNAVAILABLE")


async def test_bad_requests_are_400(client, fake_engine, tmp_path):
    for body in ({}, {"image_base64": "aGk=", "image_path": "/x"}, {"image_path": "relative.png"},
                 {"image_base64": 5}, {"image_base64": ""}, {"image_base64": "!!notbase64!!"},
                 {"image_path": str(tmp_path / "missing.png")}, {"image": "x"}, ["x"]):
        assert_error(await client.post("/memory/ocr", json=body), 400, "INVALID_REQUEST")
    not_image = base64.b64encode(b"GIF89a...").decode()
    assert_error(await client.post("/memory/ocr", json={"image_base64": not_image}), 400, "INVALID_REQUEST")


async def test_recognises_base64_and_files(client, fake_engine, tmp_path):
    response = await client.post("/memory/ocr", json={"image_base64": base64.b64encode(png).decode()})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text_lines"] == ["2026年4月家庭支出清单", "电费 210 元"]
    assert body["text"] == "2026年4月家庭支出清单\n电费 210 元"
    assert body["engine"] == "Fake" and isinstance(body["latency_ms"], int)
    path = tmp_path / "bill.png"
    path.write_bytes(png)
    from_file = (await client.post("/memory/ocr", json={"image_path": str(path)})).json()
    assert from_file["text_lines"] == body["text_lines"] and from_file["engine"] == "Fake"


async def test_twenty_megabytes_of_base64_at_and_over_the_limit(client, fake_engine):
    at_limit = "A" * ocr_image_base64_characters_max  # valid base64 (zero bytes), not a PNG: 400
    assert_error(await client.post("/memory/ocr", json={"image_base64": at_limit}), 400, "INVALID_REQUEST")
    over = at_limit + "AAAA"
    assert_error(await client.post("/memory/ocr", json={"image_base64": over}), 413, "PAYLOAD_TOO_LARGE")


@pytest.mark.skipif(importlib.util.find_spec("rapidocr_onnxruntime") is None,
                    reason="the ocr extra (rapidocr-onnxruntime) is not installed")
async def test_rapidocr_reads_text_offline_and_reuses_one_worker(client, knowledge_server):
    from PIL import Image, ImageDraw, ImageFont

    def page(text: str) -> str:
        image = Image.new("RGB", (480, 120), "white")
        ImageDraw.Draw(image).text((20, 30), text, fill="black", font=ImageFont.load_default(size=40))
        encoded = io.BytesIO()
        image.save(encoded, "PNG")
        return base64.b64encode(encoded.getvalue()).decode()

    engine = RapidOcrEngine()
    knowledge_server.env.extras[ocr_engine_extra] = engine
    try:
        first = await client.post("/memory/ocr", json={"image_base64": page("Hello OCR 2026")})
        assert first.status_code == 200, first.text
        assert first.json()["text_lines"] == ["Hello OCR 2026"] and first.json()["engine"] == "RapidOCR"
        pid = engine.worker_pid
        second = await client.post("/memory/ocr", json={"image_base64": page("Second page 42")})
        assert " ".join(second.json()["text_lines"]) == "Second page 42"
        assert engine.starts == 1 and engine.worker_pid == pid  # the models were loaded once
        assert second.json()["latency_ms"] < first.json()["latency_ms"]
    finally:
        await trio.to_thread.run_sync(engine.close)
    assert engine.worker_pid is None


fake_worker = """
import json, os, sys, time
answers = sys.stdout
while True:
    header = sys.stdin.buffer.read(8)
    if len(header) < 8:
        sys.exit(0)
    image = sys.stdin.buffer.read(int.from_bytes(header, "big"))
    if image == b"die":
        sys.exit(3)
    if image == b"hang":
        time.sleep(60)
    if image == b"garbage":
        answers.write("not json\\n")
    else:
        answers.write(json.dumps({"lines": [str(os.getpid())]}) + "\\n")
    answers.flush()
"""


def fake_engine_process(tmp_path, **options) -> RapidOcrEngine:
    script = tmp_path / "fake_worker.py"
    script.write_text(fake_worker)
    return RapidOcrEngine(command=[sys.executable, "-I", str(script)], **options)


def test_the_worker_is_reused_restarted_after_it_dies_and_stopped_on_close(tmp_path):
    engine = fake_engine_process(tmp_path)
    first = engine.recognise(b"page")
    assert engine.recognise(b"page") == first and engine.starts == 1
    with pytest.raises(OcrEngineFailed):
        engine.recognise(b"die")  # kills its worker, and the one fresh retry: it is the image
    assert engine.starts == 2 and engine.worker_pid is None
    again = engine.recognise(b"page")
    assert again != first and engine.starts == 3  # a fresh worker
    os.kill(int(again[0]), signal.SIGKILL)  # killed from outside while idle
    replaced = engine.recognise(b"page")  # answered by a fresh worker, not refused
    assert replaced != again and engine.starts == 4
    with pytest.raises(OcrEngineFailed):
        engine.recognise(b"garbage")
    assert engine.worker_pid is None  # out of step: stopped
    assert engine.recognise(b"page") and engine.starts == 5
    engine.close()
    assert engine.worker_pid is None


def test_a_worker_that_does_not_answer_in_time_is_killed(tmp_path):
    engine = fake_engine_process(tmp_path, timeout_seconds=0.5)
    with pytest.raises(OcrEngineFailed):
        engine.recognise(b"hang")
    assert engine.worker_pid is None
    assert engine.recognise(b"page") and engine.starts == 2
    engine.close()


async def test_waiting_is_bounded(tmp_path):
    class SlowEngine:
        name = "Slow"

        def recognise(self, image):
            import time

            time.sleep(0.05)
            return ["ok"]

    service = OcrService(SlowEngine())
    clock = types.SimpleNamespace(monotonic=trio.current_time)
    outcomes: list[str] = []

    async def one():
        try:
            await service.recognise(b"x", clock)
            outcomes.append("ok")
        except OcrBusy:
            outcomes.append("busy")

    async with trio.open_nursery() as nursery:
        for _ in range(ocr_waiting_max + 1):
            nursery.start_soon(one)
    assert sorted(outcomes) == ["busy"] + ["ok"] * ocr_waiting_max


async def test_image_path_limits(client, fake_engine, tmp_path):
    directory = tmp_path / "folder"
    directory.mkdir()
    assert_error(await client.post("/memory/ocr", json={"image_path": str(directory)}), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/ocr", json={"image_path": "./bill.png"}), 400, "INVALID_REQUEST")
    at_limit = tmp_path / "at.png"
    with open(at_limit, "wb") as handle:
        handle.write(png)
        handle.truncate(ocr_image_bytes_max)
    assert (await client.post("/memory/ocr", json={"image_path": str(at_limit)})).status_code == 200
    over = tmp_path / "over.png"
    with open(over, "wb") as handle:
        handle.write(png)
        handle.truncate(ocr_image_bytes_max + 1)
    assert_error(await client.post("/memory/ocr", json={"image_path": str(over)}), 413, "PAYLOAD_TOO_LARGE")
