"""The ``auth`` component's migrations: the token table in the shared SQLite engine.

Why in the shared database: the CLI (``troupe token ...``, another process) and the running
server must agree on every token at every request, and revocation must take effect on the
next request.  One table in the one database file gives both for free: the CLI commits, the
server's next lookup reads the committed row.  Secrets are never stored, only their SHA-256.

``audience`` separates surfaces (``host`` now; sessions and knowledge later) so that one
surface's token never opens another surface.  Names are unique among a surface's *active*
tokens (a partial index), so a revoked name can be issued again.
"""

from __future__ import annotations

from troupe.storage import Migration

auth_component = "auth"

auth_migrations: tuple[Migration, ...] = (
    Migration(
        component=auth_component,
        number=1,
        name="tokens",
        sql="""
            CREATE TABLE auth_tokens (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                audience TEXT NOT NULL,
                name TEXT NOT NULL,
                secret_sha256 TEXT NOT NULL UNIQUE,
                scope_kind TEXT NOT NULL,
                scope_value TEXT NOT NULL,
                created_at REAL NOT NULL,
                revoked_at REAL
            );
            CREATE UNIQUE INDEX auth_tokens_active_name
                ON auth_tokens (audience, name) WHERE revoked_at IS NULL;
        """,
    ),
)

__all__ = ["auth_component", "auth_migrations"]
