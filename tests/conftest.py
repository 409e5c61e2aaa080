"""Suite-wide set-up.

A server started with the process environment (``troupe.server.serve`` without explicit
surfaces, as several tests do) would announce itself by mDNS on every interface and claim the
developer's D-Bus session name: the knowledge surface's desktop services default to on for
``troupe serve``.  The suite turns both off unless a test sets them itself (the discovery and
D-Bus tests do, on loopback and on a bus they start)."""

from __future__ import annotations

import os

os.environ.setdefault("TROUPE_KNOWLEDGE_DISCOVERY", "off")
os.environ.setdefault("TROUPE_KNOWLEDGE_DBUS", "off")
