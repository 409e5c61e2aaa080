"""A structured trace of what the runtime did: activations, messages, crashes, restarts...

Each record is canonical CBOR ``[seq, time, event, kind, key, fields]`` so that the same run
gives the same bytes; the tracer folds every record into a running SHA-256, which is how the
simulator proves that a seed replays identically.  In ``serve`` the trace is optional: with no
sink and no memory it costs one branch per event.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, BinaryIO

import cbor2

from ._limits import trace_records_in_memory_max


class Tracer:
    """Collects trace records; ``enabled`` False makes ``record`` a no-op."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        time_source: Callable[[], float] | None = None,
        keep_in_memory: bool = False,
        sink: BinaryIO | None = None,
    ) -> None:
        self.enabled = enabled
        self._time_source = time_source or (lambda: 0.0)
        self._keep_in_memory = keep_in_memory
        self._sink = sink
        self._digest = hashlib.sha256()
        self.records: list[bytes] = []
        self.sequence = 0
        self.counts: dict[str, int] = {}

    def record(self, event: str, kind: str = "", key: str = "", **fields: Any) -> int:
        """Record one event; return its sequence number (0 when the tracer is disabled), which
        is how a violation names the events it concerns."""
        self.counts[event] = self.counts.get(event, 0) + 1
        if not self.enabled:
            return 0
        self.sequence += 1
        # Microsecond rounding keeps float formatting out of the digest.
        moment = round(self._time_source() * 1_000_000)
        encoded = cbor2.dumps([self.sequence, moment, event, kind, key, fields], canonical=True)
        self._digest.update(encoded)
        if self._keep_in_memory and len(self.records) < trace_records_in_memory_max:
            self.records.append(encoded)
        if self._sink is not None:
            self._sink.write(encoded)
        return self.sequence

    def sha256(self) -> str:
        return self._digest.hexdigest()


def read_trace(data: bytes) -> list[list[Any]]:
    """Decodes a trace file (concatenated CBOR records) back into lists."""
    import io

    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream)
    records = []
    while stream.tell() < len(data):
        records.append(decoder.decode())
    return records
