"""The extension point where messages meet media objects.

A message's ``media_ids`` are checked inside the entry actor's write transaction (so an upload
and its authorisation record are seen exactly as committed, and a refused reference rolls the
whole batch back).  Until ``POST /media`` exists no object can be referenced, so the default
resolver refuses every id; the media work replaces it with one that reads its tables and checks
that the token may reach the upload's entry as well as the message's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from troupe.auth import TokenGrant


class MediaResolver(Protocol):
    """Decides which media ids a new message may not reference."""

    def refused_positions(
        self, connection: Any, grant: TokenGrant, entry_id: str, media_ids: Sequence[str]
    ) -> list[int]:
        """Positions in ``media_ids`` that are unknown, cleaned, not host uploads or outside
        ``grant``'s scope (all answer 404: guessing an id grants nothing).  Runs inside the
        message transaction on its write connection."""
        ...


class NoMedia:
    """No media objects exist yet: every reference is refused."""

    def refused_positions(
        self, connection: Any, grant: TokenGrant, entry_id: str, media_ids: Sequence[str]
    ) -> list[int]:
        del connection, grant, entry_id
        return list(range(len(media_ids)))


no_media = NoMedia()

__all__ = ["MediaResolver", "NoMedia", "no_media"]
