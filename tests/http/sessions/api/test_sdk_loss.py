"""What the SDK's other public flows prove (tansr-python ``integration/session_loss.py`` and
``integration/session_extra.py``), as our own black-box tests against ``troupe fixture tansr``:

- a real restart: the fixture process stops and a new one starts over the same data directory;
  the SDK resumes the dormant session, its processed watermark moves on without a gap, the
  history and the checkpoint bytes are intact, a cursor older than the new epoch gets the
  ``evicted`` gap and is reconciled from meta + history, and a process killed mid-turn loses
  only that turn;
- a reply lost after the server accepted a create or an interrupt: the SDK reports the outcome
  as unknown and does not retry; exactly one session exists, the interrupt took effect;
- media disabled: the audio operations are off in the closure, so the SDK refuses them without
  sending a write, and an image turn ends failed, not completed;
- the default configuration: the ``fake-main`` alias, the ``{policy, source}`` prompt summary,
  an unavailable family refused at discovery;
- a single-select question answered with two options is refused and stays open.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from queue import Queue
from urllib.parse import urlsplit

import pytest

pytest.importorskip("tansr_sdk")

from tansr_sdk.api import AuthToken, Client  # noqa: E402
from tansr_sdk.lifecycle import now_ms  # noqa: E402
from tansr_sdk.session import (  # noqa: E402
    Answer,
    CreateOptions,
    ImageBlock,
    SessionClient,
    SpeechRequest,
    TranscriptionRequest,
    TurnTracker,
    WriteOptions,
)
from tansr_sdk.transport import HttpTransport  # noqa: E402

from troupe._fixture_tansr import readiness_prefix  # noqa: E402

from .conftest import drain_lines, read_prefixed, readiness_seconds_max, send_command  # noqa: E402
from .test_sdk_flow import complete, finish, png, rejected, wait_idle, wait_kind  # noqa: E402

stream_ms = 25_000


class RestartableFixture:
    """``troupe fixture tansr DATA_DIR MODE`` as a subprocess that can be stopped (or killed)
    and started again over the same data directory: a new process, a new port, new tokens for
    the same two end users."""

    def __init__(self, data_dir: Path, mode: str = "session") -> None:
        self.data_dir, self.mode = data_dir, mode
        self.process: subprocess.Popen | None = None
        self.clients: list[Client] = []
        self.start()

    def start(self) -> dict:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "troupe.cli", "fixture", "tansr", str(self.data_dir), self.mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=(self.data_dir.parent / "fixture.log").open("a"), text=True, bufsize=1)
        self.lines: Queue[str] = Queue()
        threading.Thread(target=drain_lines, args=(self.process, self.lines), daemon=True).start()
        self.info = self.read(readiness_prefix, readiness_seconds_max)
        return self.info

    def read(self, prefix: str, seconds: float) -> dict:
        return read_prefixed(self.lines, prefix, seconds)

    def command(self, body: dict) -> dict:
        assert self.process is not None
        return send_command(self.process, self.lines, body)

    def client(self, *, family: str = "sdk1", transport=None, base_url: str | None = None) -> Client:
        token = self.info["token"]
        made = Client(base_url or self.info["baseURL"], lambda cancel: AuthToken(token, "fixture-owner"),
                      family=family, transport=transport)
        self.clients.append(made)
        return made

    def stop(self) -> int:
        assert all(client.close(10) for client in self.clients)
        self.clients.clear()
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        return self.process.wait(timeout=15)

    def kill(self) -> None:
        """Power off: no graceful close, no passivation, nothing sealed."""
        for client in self.clients:
            client.close(1)
        self.clients.clear()
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=15)

    def restart(self) -> dict:
        old = self.process.pid if self.process else None
        assert self.stop() == 0
        info = self.start()
        assert self.process.pid != old
        return info


@pytest.fixture
def restartable(tmp_path):
    made = []

    def make(mode: str = "session") -> RestartableFixture:
        fixture = RestartableFixture(tmp_path / "data", mode)
        made.append(fixture)
        return fixture

    yield make
    for fixture in made:
        if fixture.process is not None and fixture.process.poll() is None:
            assert fixture.stop() == 0


class RecordedTransport:
    """The SDK's own HTTP transport, counting the (method, path) of every request it sends."""

    def __init__(self) -> None:
        self.real = HttpTransport()
        self.requests: list[tuple[str, str]] = []

    def request(self, request):
        self.requests.append((request.method, urlsplit(request.url).path))
        return self.real.request(request)

    def stream(self, request):
        self.requests.append((request.method, urlsplit(request.url).path))
        return self.real.stream(request)

    def close(self, timeout=30):
        return self.real.close(timeout)


def test_a_real_restart_resumes_without_a_gap_and_an_old_cursor_is_reconciled(restartable):
    fixture = restartable()
    sessions = SessionClient(fixture.client())
    current = sessions.create()
    complete(current, "BEFORE-RESTART")
    checkpoint = current.checkpoint("before-restart")
    checkpoint_bytes = current.export_checkpoint(checkpoint.checkpoint_id)
    history = current.history(limit=50)
    stale_cursor = current.meta().last_seq - 2
    with current.events(str(current.meta().last_seq), deadline_ms=now_ms() + stream_ms) as stream:
        current.close()
        wait_kind(stream, "session.ended")
        processed = int(stream.last_event_id)

    info = fixture.restart()
    sessions = SessionClient(fixture.client())
    assert sessions.attach(current.id).meta().live is False
    resumed = sessions.resume(current.id)
    # Sealed epoch: the new one opens at exactly the old watermark + 1, and the 201 says so.
    assert resumed.id == current.id and resumed.created.resumed
    assert resumed.created.last_seq == processed + 1
    assert resumed.history(limit=50)["messages"] == history["messages"]
    assert resumed.export_checkpoint(checkpoint.checkpoint_id) == checkpoint_bytes
    with resumed.events(str(processed), deadline_ms=now_ms() + stream_ms) as replay:
        opening = next(replay)
        assert opening.kind == "session.resumed" and replay.last_event_id == str(processed + 1)
        assert opening.raw["previousLastSeq"] == processed

    # A cursor from before the restart that missed events: the evicted gap, no cursor guessed.
    with resumed.events(str(stale_cursor), deadline_ms=now_ms() + stream_ms) as replay:
        gap = next(replay)
        assert gap.kind == "server.replay.gap" and gap.raw["reason"] == "evicted"
        assert gap.raw["requestedAfterSeq"] == stale_cursor and replay.last_event_id == str(stale_cursor)
        tracker = TurnTracker.from_replay(stale_cursor)
        assert tracker.observe(gap) is None and tracker.needs_reconciliation
    # L2 reconciliation: meta, then history, then subscribe from history.lastSeq.
    meta = resumed.meta()
    reconciled = resumed.history(limit=50)
    assert meta.live is True and reconciled["lastSeq"] == meta.last_seq == processed + 1
    complete(resumed, "AFTER-RESTART")
    assert resumed.history(limit=0)["total"] == history["total"] + 2
    assert sessions.list().total == 1
    assert info["baseURL"] != ""  # a new listener, same data directory
    resumed.close()


def test_a_process_killed_mid_turn_loses_only_that_turn(restartable):
    fixture = restartable()
    sessions = SessionClient(fixture.client())
    current = sessions.create()
    complete(current, "KEPT")
    kept = current.history(limit=50)
    with current.events(str(current.meta().last_seq), deadline_ms=now_ms() + stream_ms) as stream:
        current.send("GO-BLOCK")
        wait_kind(stream, "msg.text.delta")
        seen = int(stream.last_event_id)
    fixture.kill()

    fixture.start()
    sessions = SessionClient(fixture.client())
    dormant = sessions.attach(current.id).meta()
    assert dormant.live is False and dormant.last_seq < seen  # the running turn never committed
    resumed = sessions.resume(current.id)
    # Unsealed: the new epoch starts above every seq the killed one may have streamed.
    assert resumed.created.resumed and resumed.created.last_seq > seen
    assert resumed.history(limit=50)["messages"] == kept["messages"]
    with resumed.events(str(seen), deadline_ms=now_ms() + stream_ms) as replay:
        gap = next(replay)
        assert gap.kind == "server.replay.gap" and gap.raw["reason"] == "evicted"
    complete(resumed, "AFTER-KILL")
    assert resumed.history(limit=0)["total"] == kept["total"] + 2
    resumed.close()


class _LosingProxy:
    """Forwards to the fixture; the first answer matching ``drop`` is read in full, then the
    client's connection is cut (the server accepted; the client never hears it)."""

    def __init__(self, origin: str, drop) -> None:
        import http.client
        import http.server

        target = urlsplit(origin)
        self.writes: list[tuple[str, str, int, bool]] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def forward(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=15)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    answer = response.read()
                finally:
                    upstream.close()
                dropped = drop(self.command, self.path, response.status) and not any(w[3] for w in owner.writes)
                if self.command == "POST":
                    owner.writes.append((self.command, self.path, response.status, dropped))
                if dropped:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("connection", "content-length", "transfer-encoding"):
                        self.send_header(key, value)
                self.send_header("content-length", str(len(answer)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(answer)
                self.close_connection = True

            do_GET = do_POST = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_a_lost_create_or_interrupt_reply_is_unknown_and_never_retried(restartable):
    fixture = restartable()
    sessions = SessionClient(fixture.client())
    before = sessions.list().total
    proxy = _LosingProxy(fixture.info["baseURL"], lambda method, path, status: path == "/api/sessions" and status == 201)
    try:
        losing = SessionClient(fixture.client(base_url=proxy.base_url))
        failure = rejected(lambda: losing.create(CreateOptions(
            prompt="LOST-CREATE", write=WriteOptions(request_key="lost-create", deadline_ms=now_ms() + stream_ms))))
        assert failure.code in ("network", "timeout")
        assert [(path, status) for _, path, status, _ in proxy.writes] == [("/api/sessions", 201)]
        assert sessions.list().total == before + 1  # created once, not twice, not zero
    finally:
        proxy.close()

    current = sessions.create()
    with current.events(deadline_ms=now_ms() + stream_ms) as observing:
        current.send("GO-BLOCK")
        wait_kind(observing, "msg.text.delta")
        target = current.input_capabilities()["target"]
    floor = current.meta().last_seq
    proxy = _LosingProxy(fixture.info["baseURL"], lambda method, path, status: path.endswith("/interrupt"))
    try:
        with current.events(str(floor), deadline_ms=now_ms() + stream_ms) as observing:
            retained = SessionClient(fixture.client(base_url=proxy.base_url)).attach(current.id)
            failure = rejected(lambda: retained.interrupt(
                WriteOptions(request_key="lost-interrupt", deadline_ms=now_ms() + stream_ms)))
            assert failure.code in ("network", "timeout")
            finish(observing, TurnTracker.resume(floor, target["turnId"]), "aborted")
        wait_idle(current)
        assert [(path.rsplit("/", 1)[1], status) for _, path, status, _ in proxy.writes] == [("interrupt", 202)]
    finally:
        proxy.close()
    current.close()


def test_media_disabled_refuses_audio_without_a_write_and_fails_an_image_turn(restartable):
    fixture = restartable("session-media-disabled")
    transport = RecordedTransport()
    session = SessionClient(fixture.client(transport=transport)).create()
    closure = session.capabilities()
    assert closure.operations["session.audio.transcribe"] == "disabled"
    assert closure.operations["session.audio.speak"] == "disabled"
    complete(session, "TEXT-STILL-WORKS")
    before = session.history(limit=0)["total"]
    start = len(transport.requests)
    rejected(lambda: session.transcribe(TranscriptionRequest("data:audio/wav;base64,UklGRg==")))
    rejected(lambda: session.speak(SpeechRequest("synthetic")))
    assert not [path for method, path in transport.requests[start:] if method == "POST"]
    assert session.history(limit=0)["total"] == before

    floor = session.meta().last_seq
    with session.events(str(floor), deadline_ms=now_ms() + stream_ms) as events:
        assert session.send_blocks([ImageBlock("image/png", png)]).accepted
        finish(events, TurnTracker(floor), "failed")
    wait_idle(session)
    complete(session, "TEXT-AFTER-THE-FAILED-TURN")
    session.close()


def test_the_default_configuration_as_the_sdk_reads_it(restartable):
    fixture = restartable()
    transport = RecordedTransport()
    offload = SessionClient(fixture.client(family="sdk2-offload-v1", transport=transport))
    refused = rejected(lambda: offload.create(CreateOptions(request_id="unavailable")), (404,))
    assert refused.code and not any(method == "POST" for method, _ in transport.requests)

    session = SessionClient(fixture.client()).create(CreateOptions(model="fake-main"))
    assert "applicationPrompt" not in session.meta().raw
    assert session.application_prompt_meta().raw["applicationPrompt"] == {"policy": "fallback", "source": "none"}
    complete(session, "USER-TEXT")
    assert session.application_prompt_meta().raw["applicationPrompt"] == {"policy": "fallback", "source": "none"}
    unknown = rejected(lambda: SessionClient(fixture.client()).create(CreateOptions(model="no-such-model")))
    assert unknown.detail["domainCode"] == "create_failed"
    session.close()


def test_a_single_select_question_takes_one_option(restartable):
    fixture = restartable()
    session = SessionClient(fixture.client()).create()
    floor = session.meta().last_seq
    with session.events(str(floor), deadline_ms=now_ms() + stream_ms) as stream:
        session.send("GO-QUESTION")
        request = wait_kind(stream, "server.question.request")
        question = request["questions"][0]
        assert question.get("multiSelect") is not True
        both = [option["id"] for option in question["options"][:2]]
        refused = rejected(lambda: session.answer(request["requestId"], [Answer(question["id"], both)]), (400,))
        assert refused.wire_code == "invalid_request" and refused.detail["domainCode"] == "validation_failed"
        assert refused.detail["domainReason"] == "single_select"
        # Still open: one option is accepted.
        assert session.answer(request["requestId"], [Answer(question["id"], both[:1])]).accepted
    with session.events(str(floor), deadline_ms=now_ms() + stream_ms) as replay:
        finish(replay, TurnTracker(floor))
    session.close()
