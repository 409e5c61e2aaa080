"""What the surfaces' plain-ASGI hot routes share: reading the whole body, sending one answer.

Why plain ASGI at all: a few routes carry most of a surface's traffic (host intake, character
history, knowledge memory write), and quart's request and response objects were a measurable
part of their cost, so each is a small ASGI callable behind the surface's gate.  The gate has
already bounded the body (``BodyLimit``), so reading it whole is safe; the answer is always one
complete body with its Content-Length.  Each surface keeps its own error mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


async def read_request_body(receive: Any) -> bytes | None:
    """The whole request body (the gate's ``BodyLimit`` bounds it), or None on disconnect."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_answer(send: Any, status: int, body: bytes, *, content_type: str,
                      headers: Mapping[str, str] | None = None) -> None:
    """One complete response: ``content_type``, Content-Length and ``headers`` (names lower-cased)."""
    start_headers = [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode("ascii")),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = ["read_request_body", "send_answer"]
