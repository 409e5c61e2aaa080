"""The character's persona: the description hosts put in front of their replies, with versions.

Why a versioned table and not a setting: prepare's ``persona`` section promises a host "the
current character description, its version and an update hint", so a host can cache the text
in its system prompt and replace it only when the version moves.  Every change is a new row
(``version`` = previous + 1, never reused), so the version a host saw is never re-used for
other text, and the history stays for operators.  The text is set by an operator
(``troupe persona set``, ``_persona_cli`` in ``troupe.http.host``), never by a host: a host
token cannot change who the character is.

The section (``persona_section``) is always well-formed, with every key present:

- no persona set yet: ``{"name": null, "text": null, "version": null, "updated_at": null,
  "update_hint": null}``;
- otherwise ``name`` (may be null), ``text``, ``version`` (1, 2, ...), ``updated_at`` (UTC
  ISO, whole seconds) and ``update_hint``: a sentence telling the host to replace a cached
  description when the current version was set less than ``persona_update_hint_seconds``
  ago, else null.  The hint is advice for the host, not a fact or an instruction to the
  character.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import apsw

persona_text_characters_max = 8_000
"""A persona is a description, not a knowledge base (it is sent with every prepare)."""
persona_name_characters_max = 200
persona_update_hint_seconds = 86_400.0
"""How long after a change prepare keeps saying "the persona changed, refresh your copy"."""

assert persona_text_characters_max > 0 and persona_update_hint_seconds > 0

persona_tables_sql = """
    CREATE TABLE host_persona_versions (
        version INTEGER PRIMARY KEY,
        name TEXT,
        text TEXT NOT NULL,
        updated_at REAL NOT NULL,
        source TEXT NOT NULL
    );
"""
"""One row per persona version; the current persona is the highest version."""


class PersonaRefused(ValueError):
    """A persona text or name that breaks the rules (the CLI reports it, nothing is written)."""


@dataclass(frozen=True)
class Persona:
    version: int
    name: str | None
    text: str
    updated_at: float
    source: str


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(int(seconds), tz=datetime.UTC).isoformat(timespec="seconds")


def persona_problem(text: str, name: str | None) -> str | None:
    """Why ``text`` / ``name`` cannot be a persona, or None."""
    if not text.strip():
        return "the persona text must not be blank"
    if len(text) > persona_text_characters_max:
        return f"the persona text is over {persona_text_characters_max} characters"
    if name is not None and not (1 <= len(name) <= persona_name_characters_max and name.strip()):
        return f"the name must be 1-{persona_name_characters_max} characters and not blank"
    return None


def current_persona(connection: apsw.Connection) -> Persona | None:
    row = connection.execute(
        "SELECT version, name, text, updated_at, source FROM host_persona_versions "
        "ORDER BY version DESC LIMIT 1"
    ).fetchone()
    return None if row is None else Persona(*row)


def persona_history(connection: apsw.Connection) -> list[Persona]:
    """Every version, oldest first."""
    rows = connection.execute(
        "SELECT version, name, text, updated_at, source FROM host_persona_versions ORDER BY version"
    )
    return [Persona(*row) for row in rows]


def set_persona(
    connection: apsw.Connection, *, text: str, name: str | None, updated_at: float, source: str
) -> Persona:
    """Write a new version (inside the caller's write transaction) unless it is identical to
    the current one, which is returned unchanged (setting the same text twice is idempotent)."""
    problem = persona_problem(text, name)
    if problem is not None:
        raise PersonaRefused(problem)
    current = current_persona(connection)
    if current is not None and current.text == text and current.name == name:
        return current
    version = 1 if current is None else current.version + 1
    connection.execute(
        "INSERT INTO host_persona_versions (version, name, text, updated_at, source) VALUES (?, ?, ?, ?, ?)",
        (version, name, text, updated_at, source),
    )
    return Persona(version, name, text, updated_at, source)


def persona_section(connection: apsw.Connection, now: float) -> dict[str, Any]:
    """Prepare's ``persona`` section (see the module docstring)."""
    persona = current_persona(connection)
    if persona is None:
        return {"name": None, "text": None, "version": None, "updated_at": None, "update_hint": None}
    hint = None
    if now - persona.updated_at < persona_update_hint_seconds:
        hint = (f"角色描述已于 {_iso(persona.updated_at)} 更新为第 {persona.version} 版；"
                "如宿主缓存了旧版本，请用本版替换。")
    return {
        "name": persona.name,
        "text": persona.text,
        "version": persona.version,
        "updated_at": _iso(persona.updated_at),
        "update_hint": hint,
    }


__all__ = [
    "Persona",
    "PersonaRefused",
    "current_persona",
    "persona_history",
    "persona_name_characters_max",
    "persona_problem",
    "persona_section",
    "persona_tables_sql",
    "persona_text_characters_max",
    "persona_update_hint_seconds",
    "set_persona",
]
