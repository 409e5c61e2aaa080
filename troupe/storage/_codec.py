"""CBOR encoding for everything the engine stores as a value: one canonical form, strict reads.

Why CBOR: compact, typed (bytes, datetimes, big integers), and with ``canonical=True`` the same
value always gives the same bytes, which keeps simulator traces byte-for-byte reproducible.
Trade-off: values must be CBOR-encodable (no arbitrary objects); naive datetimes are read as UTC
rather than rejected, because actors build them from ``Env.clock``.  Decoding is strict:
``cbor2.loads`` silently ignores trailing bytes, so we decode with a ``CBORDecoder`` and check
that it consumed everything, turning damage into ``CorruptRecord`` instead of a wrong value.
"""

from __future__ import annotations

import datetime
import io
from typing import Any

import cbor2

from ._exceptions import CorruptRecord


def encode(value: Any) -> bytes:
    """Canonical CBOR bytes of ``value``."""
    try:
        return cbor2.dumps(value, canonical=True, timezone=datetime.UTC)
    except cbor2.CBOREncodeError as exc:
        raise TypeError(f"value cannot be stored as CBOR: {exc}") from exc


def decode(data: bytes) -> Any:
    """Decode exactly one CBOR item that spans all of ``data``."""
    stream = io.BytesIO(data)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except (cbor2.CBORDecodeError, ValueError, EOFError) as exc:
        raise CorruptRecord(f"stored value is not valid CBOR: {exc}") from exc
    if stream.tell() != len(data):
        raise CorruptRecord(
            f"stored value has {len(data) - stream.tell()} trailing bytes after the CBOR item"
        )
    return value
