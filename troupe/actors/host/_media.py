"""The extension point where messages meet media objects.

A message's ``media_ids`` are checked inside the entry actor's write transaction (so an upload
and its authorisation record are seen exactly as committed, and a refused reference rolls the
whole batch back).  ``HostMedia`` (the default, ``host_media``) accepts an id only when it
names a live host upload with its ``media_uploaded`` authorisation record whose entry the
token may reach; the message's own entry was already scope-checked by the gate.  ``NoMedia``
refuses everything (for tests of the entry actor alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from troupe.auth import TokenGrant

from ._media_store import media_ids_refused


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


class HostMedia:
    """The real check: see the module docstring and ``require_host_media``."""

    def refused_positions(
        self, connection: Any, grant: TokenGrant, entry_id: str, media_ids: Sequence[str]
    ) -> list[int]:
        del entry_id  # the gate checked the message's entry before the body was read
        return media_ids_refused(connection, grant.scope.allows, media_ids)


host_media = HostMedia()

__all__ = ["HostMedia", "MediaResolver", "NoMedia", "host_media", "no_media"]
