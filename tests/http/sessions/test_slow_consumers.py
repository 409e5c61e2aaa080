"""Both slow-consumer policies over real HTTP, with a client that stops reading.

The client is a raw socket with a tiny receive buffer (h11 parses what it reads), so the
server's writes back up after a few frames; big turns (a large prompt is echoed in
``turn.started``) then fill the subscriber's queue.  The server runs with a 4 KiB
``maxSubscriberBufferBytes`` and a 0.3 s grace, set from the environment knobs like ``troupe
serve`` reads them (``EventStreamSettings.from_environ``).

- ``disconnect``: the stalled connection is ended by the server; what the client then reads is
  a prefix of the log (no gap frame), the stream ends, and an L1 reconnect with
  ``Last-Event-ID`` delivers the rest.
- ``drop-oldest``: the connection stays; the client, once it reads again, finds the in-band
  gap ``server.replay.gap`` with ``requestedAfterSeq: -1``, no ``oldestRetainedSeq``, no id,
  and a positive ``droppedEvents``; later events still arrive on the same connection.
"""

from __future__ import annotations

import socket

import h11
import pytest
import trio

from troupe.http.sessions import EventStreamSettings

from ._sessions_harness import start_sessions_server
from ._streams import data_of, follow, is_turn_end, seq_of, type_of

receive_buffer_bytes = 4096
big_prompt = "/say ok\n" + "x" * 200_000
big_turns = 12


class StalledReader:
    """An SSE client on a raw socket that reads only when told to."""

    def __init__(self, port: int, path: str, secret: str) -> None:
        self.port, self.path, self.secret = port, path, secret
        self.connection = h11.Connection(h11.CLIENT)
        self.body = b""
        self.ended = False
        self.stream: trio.SocketStream | None = None

    async def open(self) -> None:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        await sock.connect(("127.0.0.1", self.port))
        self.stream = trio.SocketStream(sock)
        request = h11.Request(method="GET", target=self.path, headers=[
            ("Host", f"127.0.0.1:{self.port}"), ("Authorization", f"Bearer {self.secret}")])
        await self.stream.send_all(self.connection.send(request) + self.connection.send(h11.EndOfMessage()))

    async def read_until(self, predicate, *, seconds: float = 10) -> None:
        assert self.stream is not None
        with trio.fail_after(seconds):
            while not predicate(self) and not self.ended:
                data = await self.stream.receive_some(65536)
                self.connection.receive_data(data)
                while True:
                    event = self.connection.next_event()
                    if event is h11.NEED_DATA:
                        break
                    if isinstance(event, h11.Response):
                        assert event.status_code == 200, event
                    elif isinstance(event, h11.Data):
                        self.body += bytes(event.data)
                    elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                        self.ended = True
                        break
                if not data:
                    self.ended = True

    @property
    def frames(self) -> list[bytes]:
        return [frame + b"\n\n" for frame in self.body.split(b"\n\n")[:-1]]

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


async def stalled_server(nursery, tmp_path, policy: str):
    settings = EventStreamSettings.from_environ({
        "TANSR_SERVE_SLOW_SUBSCRIBER_POLICY": policy,
        "TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES": "4096",
        "TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS": "300",
    })
    assert settings.slow_policy == policy and settings.max_buffer_bytes == 4096 and settings.grace_seconds == 0.3
    return await start_sessions_server(nursery, str(tmp_path / policy), events=settings)


async def flood(client, session_id: str) -> int:
    """Big turns, one after another; returns the last seq."""
    for _ in range(big_turns):
        response = await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": big_prompt})
        assert response.status_code == 202, response.text
        with trio.fail_after(10):
            while (meta := (await client.get(f"/v2/sessions/{session_id}")).json())["status"] != "idle":
                await trio.sleep(0.02)
    await trio.sleep(0.5)  # past the grace with the reader still stalled
    return meta["lastSeq"]


async def test_disconnect_policy_ends_a_stalled_stream_and_l1_recovers(nursery, tmp_path):
    server = await stalled_server(nursery, tmp_path, "disconnect")
    secret = await server.token("phone")
    async with server.client(secret) as client:
        session_id = (await client.post("/v2/sessions", json={})).json()["sessionId"]
        reader = StalledReader(server.port, f"/v2/sessions/{session_id}/events", secret)
        await reader.open()
        await reader.read_until(lambda reader: reader.body.startswith(b"retry: 3000\n\n"))
        last_seq = await flood(client, session_id)
        await reader.read_until(lambda reader: False)  # read on: the server has ended the stream
        assert reader.ended
        await reader.aclose()
        seqs = [seq_of(frame) for frame in reader.frames if seq_of(frame) is not None]
        assert not [frame for frame in reader.frames if type_of(frame) == "server.replay.gap"]
        assert seqs == list(range(1, len(seqs) + 1)) and seqs[-1] < last_seq
        rest = await follow(nursery, client, f"/v2/sessions/{session_id}/events", {"Last-Event-ID": str(seqs[-1])})
        await rest.wait_for(lambda frame: seq_of(frame) == last_seq)
        rest.close()
        assert [seq_of(frame) for frame in rest.frames[1:]] == list(range(seqs[-1] + 1, last_seq + 1))


async def test_drop_oldest_policy_keeps_the_stream_with_an_in_band_gap(nursery, tmp_path):
    server = await stalled_server(nursery, tmp_path, "drop-oldest")
    secret = await server.token("phone")
    async with server.client(secret) as client:
        session_id = (await client.post("/v2/sessions", json={})).json()["sessionId"]
        reader = StalledReader(server.port, f"/v2/sessions/{session_id}/events", secret)
        await reader.open()
        await reader.read_until(lambda reader: reader.body.startswith(b"retry: 3000\n\n"))
        last_seq = await flood(client, session_id)
        await reader.read_until(lambda reader: b"event: server.replay.gap" in reader.body)
        [gap] = [frame for frame in reader.frames if type_of(frame) == "server.replay.gap"][:1]
        assert gap.startswith(b"event: server.replay.gap\ndata: ") and seq_of(gap) is None
        notice = data_of(gap)
        assert notice["requestedAfterSeq"] == -1 and "oldestRetainedSeq" not in notice
        assert notice["droppedEvents"] > 0 and notice["sessionId"] == session_id
        # The connection is kept: a later turn's events arrive on it.  (On a loaded machine the
        # reader may fall behind again while the big frames drain; then those events are
        # dropped too and a further gap stands for them: the connection still stays.)
        gaps = len([frame for frame in reader.frames if type_of(frame) == "server.replay.gap"])
        assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "small"})).status_code == 202

        def later_turn_seen(reader: StalledReader) -> bool:
            frames = reader.frames
            return (any(is_turn_end(frame) and (seq_of(frame) or 0) > last_seq for frame in frames)
                    or len([frame for frame in frames if type_of(frame) == "server.replay.gap"]) > gaps)

        await reader.read_until(later_turn_seen)
        assert not reader.ended
        seqs = [seq_of(frame) for frame in reader.frames if seq_of(frame) is not None]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        await reader.aclose()


@pytest.mark.parametrize(("variables", "problem"), [
    ({"TANSR_SERVE_SLOW_SUBSCRIBER_POLICY": "drop-newest"}, "POLICY"),
    ({"TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES": "1023"}, "BUFFER_BYTES"),
    ({"TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES": "2MiB"}, "BUFFER_BYTES"),
    ({"TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS": "9"}, "GRACE_MS"),
])
def test_bad_knobs_stop_the_start(variables, problem):
    with pytest.raises(ValueError, match=problem):
        EventStreamSettings.from_environ(variables)


def test_knob_defaults_and_floors():
    assert EventStreamSettings.from_environ({}) == EventStreamSettings()
    assert EventStreamSettings.from_environ({"TANSR_SERVE_SLOW_SUBSCRIBER_POLICY": "DROP-OLDEST"}).slow_policy == "drop-oldest"
    at_floor = EventStreamSettings.from_environ({"TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES": "1024",
                                                 "TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS": "10"})
    assert at_floor.max_buffer_bytes == 1024 and at_floor.grace_seconds == 0.01
