"""What the HTTP benchmarks share: the raw keep-alive client their load generators speak and
the hypercorn start-up of the server under test (as ``troupe serve`` configures it).

A helper module, not a benchmark (it prints nothing); the scripts import it as ``_load`` (their
own directory is first on ``sys.path`` when they run, in the server and in the load-generator
child process alike).
"""

from __future__ import annotations

from typing import Any

import trio


class RawConnection:
    """One keep-alive HTTP/1.1 connection: send pre-built requests, read length-framed replies."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        await self.stream.send_all(request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            await self._fill()
        head = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        length = None
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "transfer-encoding":
                raise ConnectionError("chunked responses are not expected here")
        if length is None:
            raise ConnectionError(f"a response without Content-Length: {head!r}")
        while len(self.buffer) < length:
            await self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return status, body


async def start_server(nursery: trio.Nursery, app: Any) -> int:
    import hypercorn.trio
    from hypercorn.config import Config

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.include_server_header = False  # as ``troupe serve``
    binds = await nursery.start(
        lambda task_status: hypercorn.trio.serve(app, config, task_status=task_status)
    )
    return int(binds[0].rsplit(":", 1)[1])


__all__ = ["RawConnection", "start_server"]
