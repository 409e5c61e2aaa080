"""The workloads' shared plumbing: traced requests, envelope checks, bounded retries, the
weighted choice of a client step's operation, and checkpoint reads."""

from __future__ import annotations

import json
import random
from typing import Any

import cbor2
import pytest
import trio

from troupe.runtime import Tracer
from troupe.sim import (
    HttpExchange,
    World,
    check_shares,
    choose_by_share,
    json_or_none,
    read_checkpoint,
    retry_seconds,
    send_retrying,
    send_traced,
)
from troupe.sim._asgi import AsgiDriver, AsgiResponse, AsgiTimeout
from troupe.sim._workload_http import retry_sleep_seconds_max_default
from troupe.storage import StorageIOError


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/ok`` 200 JSON; ``/bad`` 400 with a body the envelope check refuses; ``/busy`` 503
    with ``Retry-After: 2``; ``/crash`` raises; ``/slow`` never answers; ``/text`` 200 text."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/crash":
        raise RuntimeError("boom")
    if path == "/slow":
        await trio.sleep_forever()
    status, headers, body = {
        "/ok": (200, [(b"content-type", b"application/json")], json.dumps({"ok": True}).encode()),
        "/bad": (400, [(b"content-type", b"application/json")], b'{"error": "nope"}'),
        "/busy": (503, [(b"retry-after", b"2")], b""),
        "/text": (200, [(b"content-type", b"text/plain")], b"hello"),
    }[path]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def make_world(seed: int = 1) -> World:
    return World(env=None, random=random.Random(seed), tracer=Tracer(keep_in_memory=True),
                 planted_bugs=frozenset())


def records(world: World) -> list[list[Any]]:
    return [cbor2.loads(encoded) for encoded in world.tracer.records]


def envelope_wants_object(response: AsgiResponse, document: Any) -> str | None:
    return None if isinstance(document, dict) and isinstance(document.get("error"), dict) else "no error object"


async def test_a_response_is_traced_with_its_labels_and_decoded() -> None:
    world, driver = make_world(), AsgiDriver(raw_app)
    exchange = await send_traced(world, driver, "host", "GET", "/ok", labels={"client": 3},
                                 invoke_labels={"token": "reader"})
    assert (exchange.status, exchange.document, exchange.error) == (200, {"ok": True}, None)
    assert exchange.sequences == (1, 2) == (exchange.invoke_seq, exchange.complete_seq)
    [invoked, completed] = records(world)
    assert invoked[2:] == ["http_invoke", "http", "host", {"client": 3, "method": "GET", "path": "/ok",
                                                           "token": "reader"}]
    assert completed[2:] == ["http_ok", "http", "host", {"client": 3, "status": 200}]


async def test_a_body_that_is_not_json_decodes_to_none() -> None:
    exchange = await send_traced(make_world(), AsgiDriver(raw_app), "host", "GET", "/text")
    assert (exchange.status, exchange.document) == (200, None)


async def test_a_failed_exchange_is_traced_as_http_fail_and_has_no_response(autojump_clock: Any) -> None:
    world, found = make_world(), []
    exchange = await send_traced(world, AsgiDriver(raw_app), "host", "GET", "/slow", seconds_max=5,
                                 violate=lambda text, sequences: found.append(text))
    assert exchange.response is None and isinstance(exchange.error, AsgiTimeout)
    assert (exchange.status, exchange.document, found) == (0, None, [])
    assert [record[2] for record in records(world)] == ["http_invoke", "http_fail"]
    assert records(world)[1][5] == {"error": "AsgiTimeout"}


async def test_an_app_that_raised_is_reported_with_the_exchange() -> None:
    found: list[tuple[str, tuple[int, ...]]] = []
    exchange = await send_traced(make_world(), AsgiDriver(raw_app), "knowledge", "POST", "/crash",
                                 violate=lambda text, sequences: found.append((text, sequences)))
    assert exchange.status == 500
    assert found == [("the app raised on POST /crash: POST /crash: RuntimeError('boom')", (1, 2))]


async def test_an_error_body_outside_the_envelope_is_reported_and_a_good_answer_is_not() -> None:
    world, driver, found = make_world(), AsgiDriver(raw_app), []
    for path in ("/ok", "/bad"):
        await send_traced(world, driver, "host", "GET", path, envelope=envelope_wants_object,
                          violate=lambda text, sequences: found.append((text, sequences)))
    assert found == [("GET /bad answered 400: no error object", (3, 4))]


async def test_the_envelope_is_not_checked_without_violate() -> None:
    def never(response: AsgiResponse, document: Any) -> str | None:
        raise AssertionError("checked")

    exchange = await send_traced(make_world(), AsgiDriver(raw_app), "host", "GET", "/bad", envelope=never)
    assert exchange.status == 400


async def test_transient_answers_are_resent_up_to_the_attempts_max(autojump_clock: Any) -> None:
    world, driver = make_world(), AsgiDriver(raw_app)
    began = trio.current_time()
    exchange = await send_retrying(world, lambda: send_traced(world, driver, "host", "GET", "/busy"),
                                   attempts_max=3, transient_statuses={503})
    assert exchange.status == 503
    assert exchange.sequences == (1, 2, 3, 4, 5, 6)  # every attempt's records, the last one's last
    assert (exchange.invoke_seq, exchange.complete_seq) == (5, 6)
    assert trio.current_time() - began == pytest.approx(4.0)  # Retry-After 2, twice: not after the last


async def test_a_final_answer_stops_the_retries_at_once(autojump_clock: Any) -> None:
    world, driver, calls = make_world(), AsgiDriver(raw_app), []

    async def send() -> HttpExchange:
        calls.append(1)
        return await send_traced(world, driver, "host", "GET", "/bad" if len(calls) > 1 else "/busy")

    exchange = await send_retrying(world, send, attempts_max=4, transient_statuses=(503,))
    assert (exchange.status, len(calls), exchange.sequences) == (400, 2, (1, 2, 3, 4))


async def test_one_attempt_is_never_retried(autojump_clock: Any) -> None:
    world, driver = make_world(), AsgiDriver(raw_app)
    exchange = await send_retrying(world, lambda: send_traced(world, driver, "host", "GET", "/busy"),
                                   attempts_max=1, transient_statuses={503})
    assert exchange.sequences == (1, 2) and trio.current_time() == 0


def response_with(retry_after: str | None) -> AsgiResponse:
    headers = () if retry_after is None else (("retry-after", retry_after),)
    return AsgiResponse(503, headers, b"")


def test_retry_seconds_follows_retry_after_up_to_its_cap() -> None:
    world = make_world()
    assert retry_seconds(response_with("2"), world) == 2.0
    assert retry_seconds(response_with(str(retry_sleep_seconds_max_default)), world) == retry_sleep_seconds_max_default
    assert retry_seconds(response_with("3.5"), world) == retry_sleep_seconds_max_default
    assert retry_seconds(response_with("3.5"), world, seconds_max=10) == 3.5
    assert retry_seconds(response_with(None), world) == 1.0


def test_retry_seconds_without_a_usable_answer_draws_from_the_world() -> None:
    expected = random.Random(5)
    world = make_world(5)
    assert retry_seconds(None, world) == 0.5 + expected.random()
    assert retry_seconds(response_with("soon"), world) == 0.5 + expected.random()


def test_json_or_none() -> None:
    assert json_or_none(b'{"a": [1]}') == {"a": [1]}
    assert json_or_none(b"") is None
    assert json_or_none(b"{not json") is None
    assert json_or_none(b"\xff\xfe") is None


def test_choose_by_share_falls_on_each_share_at_its_boundaries() -> None:
    table = ((0.25, "a"), (0.5, "b"), (0.25, "c"))
    assert [choose_by_share(roll, table) for roll in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999)] == [
        "a", "a", "b", "b", "c", "c"]
    assert choose_by_share(1.0, table) is None  # past the last share: no operation


def test_check_shares_wants_a_sum_of_one() -> None:
    check_shares(((0.3, "a"), (0.7, "b")))
    with pytest.raises(AssertionError):
        check_shares(((0.3, "a"), (0.6, "b")))


class Engine:
    """Just ``read``: answers with the reader's result over a fake connection, or refuses."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    async def read(self, reader: Any) -> Any:
        if self.refuse:
            raise StorageIOError("disk I/O error: injected")
        return reader("connection")


async def test_read_checkpoint_reads_or_reports_an_unreadable_database() -> None:
    world, found = make_world(), []
    world.engine = Engine(refuse=False)
    assert await read_checkpoint(world, lambda connection: (connection, 1), found.append) == ("connection", 1)
    world.engine = Engine(refuse=True)
    assert await read_checkpoint(world, lambda connection: 1, found.append) is None
    assert found == ["durable state unreadable at a checkpoint: StorageIOError"]
