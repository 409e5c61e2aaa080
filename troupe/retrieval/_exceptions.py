"""Errors of ``troupe.retrieval``.

Hierarchy::

    RetrievalError                 base of everything this package raises on purpose
    ├── InvalidTimeWindow          a ``time`` string outside the grammar (the router may ignore it)
    ├── DuplicateItem              an item key already indexed (use ``replace``)
    └── EmbedderMismatch           vectors whose dimensions or fingerprint do not fit the index

Our own bugs are assertions, not members of this hierarchy.
"""

from __future__ import annotations


class RetrievalError(Exception):
    """Base class of the errors recall reports to its callers."""


class InvalidTimeWindow(RetrievalError, ValueError):
    """The time expression is not an hour, day, month, year or closed range of two."""


class DuplicateItem(RetrievalError):
    """An item with this key is already in the index."""


class EmbedderMismatch(RetrievalError):
    """Vectors do not match the index's dimensions or embedder fingerprint."""
