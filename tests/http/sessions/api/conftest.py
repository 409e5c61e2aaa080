"""The fixture program (``troupe fixture tansr``) as a subprocess for the SDK-driven tests:
real hypercorn on 127.0.0.1, driven over real sockets by ``tansr_sdk``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue

import pytest

from troupe._fixture_tansr import control_prefix, readiness_prefix

readiness_seconds_max = 30.0
control_seconds_max = 10.0


def drain_lines(process: subprocess.Popen, lines: Queue[str]) -> None:
    """Every stdout line of the fixture ``process`` into ``lines`` (run on a reader thread)."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))


def read_prefixed(lines: Queue[str], prefix: str, seconds: float) -> dict:
    """The JSON after ``prefix`` of the next line that starts with it (others are skipped)."""
    while True:
        try:
            line = lines.get(timeout=seconds)
        except Empty:
            raise AssertionError(f"no {prefix.strip()} line within {seconds} s") from None
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])


def send_command(process: subprocess.Popen, lines: Queue[str], body: dict) -> dict:
    """One control command (a fresh ``requestId`` unless ``body`` names one); its ok answer."""
    body = {**body, "requestId": body.get("requestId") or uuid.uuid4().hex}
    assert process.stdin is not None
    process.stdin.write(json.dumps(body) + "\n")
    process.stdin.flush()
    answer = read_prefixed(lines, control_prefix, control_seconds_max)
    assert answer["requestId"] == body["requestId"] and answer["ok"] is True, answer
    return answer


class FixtureProcess:
    """The harness side of the fixture protocol: readiness line, JSON controls, ``stop``."""

    def __init__(self, data_dir: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *(["-O"] if sys.flags.optimize else []), "-m", "troupe.cli", "fixture", "tansr",
             str(data_dir), "session"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(data_dir.parent / "fixture.log").open("w"),
            text=True, bufsize=1)
        self.lines: Queue[str] = Queue()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.info = self.read(readiness_prefix, readiness_seconds_max)

    def _drain(self) -> None:
        drain_lines(self.process, self.lines)

    def read(self, prefix: str, seconds: float) -> dict:
        return read_prefixed(self.lines, prefix, seconds)

    def command(self, body: dict) -> dict:
        return send_command(self.process, self.lines, body)

    def stop(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        code = self.process.wait(timeout=15)
        self.reader.join(5)
        return code


@pytest.fixture(scope="module")
def fixture_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureProcess]:
    root = tmp_path_factory.mktemp("tansr-fixture")
    process = FixtureProcess(root / "data")
    try:
        yield process
    finally:
        assert process.stop() == 0
