"""Helpers for tests that need a real hypercorn: serve an ASGI app on a free loopback port,
and upload a chunked body over a raw socket while watching whether the server hangs up
(``upload_over_raw_socket`` also serves the host harness's uploads)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import hypercorn.trio
import trio
from hypercorn.config import Config

upload_bytes_cap = 64 * 1024 * 1024
"""A server that reads this much of an upload it already answered did not close early."""

upload_chunk_bytes = 64 * 1024


async def start_hypercorn(nursery: trio.Nursery, app, shutdown: trio.Event | None = None) -> int:
    """Serve ``app`` on 127.0.0.1 with a free port; returns the port."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    trigger = shutdown.wait if shutdown is not None else None
    binds = await nursery.start(lambda task_status: hypercorn.trio.serve(app, config, shutdown_trigger=trigger, task_status=task_status))
    return int(binds[0].rsplit(":", 1)[1])


@dataclass
class UploadOutcome:
    closed_by_server: bool
    body_bytes_sent: int
    response: bytes

    @property
    def status(self) -> int:
        return int(self.response.split(b" ", 2)[1])


class UploadProgress:
    """What an upload has sent of its body and read of the response so far."""

    def __init__(self) -> None:
        self.body_bytes_sent = 0
        self.response = bytearray()


async def upload_over_raw_socket(
    port: int, send_body: Callable[[trio.SocketStream, UploadProgress], Awaitable[None]]
) -> UploadOutcome:
    """Run ``send_body(stream, progress)`` on a raw connection to 127.0.0.1:``port`` beside a
    reader of the response.

    Why shared: every raw-socket upload must tell a server that hung up (``closed_by_server``)
    from one that kept reading, the same way.  Ends when the server closes the connection or
    when ``send_body`` returns.  ``send_body`` counts what it sends in
    ``progress.body_bytes_sent`` and may wait on ``progress.response``; a broken or closed
    connection while it sends means the server hung up (the reader sees EOF next).
    """
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    progress = UploadProgress()
    closed = False
    async with stream, trio.open_nursery() as nursery:

        async def read() -> None:
            nonlocal closed
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    closed = True
                    nursery.cancel_scope.cancel()
                    return
                progress.response.extend(data)

        async def write() -> None:
            try:
                await send_body(stream, progress)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the server hung up: the reader sees EOF next
            nursery.cancel_scope.cancel()

        nursery.start_soon(read)
        nursery.start_soon(write)
    return UploadOutcome(closed, progress.body_bytes_sent, bytes(progress.response))


async def chunked_upload(port: int, path: str, *, host: str = "127.0.0.1", declared_bytes: int | None = None) -> UploadOutcome:
    """POST an endless chunked body (capped at ``upload_bytes_cap``) and read the response.

    With ``declared_bytes`` the body is plain (``Content-Length: declared_bytes``) instead.

    Ends when the server closes the connection (``closed_by_server``) or when the cap is
    reached (the server kept reading).  No timing is involved: the cap is in bytes.
    """
    chunk = b"x" * upload_chunk_bytes
    if declared_bytes is None:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    else:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared_bytes}\r\n\r\n"
        frame = chunk

    async def send_body(stream: trio.SocketStream, progress: UploadProgress) -> None:
        await stream.send_all(head.encode("ascii"))
        while progress.body_bytes_sent < upload_bytes_cap:
            await stream.send_all(frame)
            progress.body_bytes_sent += len(chunk)

    return await upload_over_raw_socket(port, send_body)
