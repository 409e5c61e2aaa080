"""troupe.auth: bearer tokens, scopes and rate buckets shared by every token-protected surface.

- ``TokenScope`` (all / entry list / raw-character prefix) and the entry-id rules it is
  checked against (``entry_id_problem``);
- the token table (``auth_migrations``) and its functions: ``token_create``, ``token_list``,
  ``token_revoke``, ``token_lookup``; ``authenticate`` is the per-request lookup (which is
  also the revocation check) and ``bearer_secret`` reads the ``Authorization`` header;
- ``RateBuckets``: per-token token buckets on the Env clock;
- ``add_token_commands`` / ``run_token_command``: ``troupe token create|list|revoke``
  (``--surface host|sessions``; sessions tokens are bound to one end user,
  ``TokenScope.of_end_user``, audience ``sessions_audience``).

Errors are in ``_exceptions`` (``AuthError`` and its subclasses).
"""

from ._cli import add_token_commands, run_token_command, token_surfaces
from ._entry_ids import (
    entry_id_character_problem,
    entry_id_characters_max,
    entry_id_problem,
    entry_prefix_problem,
)
from ._exceptions import AuthError, InvalidScope, InvalidTokenName, TokenNameTaken, UnknownToken
from ._lookups import TokenLookups, secrets_per_round_max
from ._rate import (
    RateBuckets,
    burst_default,
    rate_per_second_default,
    retry_after_whole_seconds,
)
from ._schema import auth_component, auth_migrations
from ._scope import TokenScope, end_user_id_characters_max, end_user_id_problem, scope_entries_max
from ._tokens import (
    TokenGrant,
    TokenRecord,
    authenticate,
    bearer_secret,
    host_audience,
    new_token_secret,
    secret_digest,
    sessions_audience,
    token_create,
    token_list,
    token_lookup,
    token_revoke,
)

__all__ = [
    "AuthError",
    "InvalidScope",
    "InvalidTokenName",
    "RateBuckets",
    "TokenGrant",
    "TokenNameTaken",
    "TokenLookups",
    "TokenRecord",
    "TokenScope",
    "UnknownToken",
    "add_token_commands",
    "auth_component",
    "auth_migrations",
    "authenticate",
    "bearer_secret",
    "burst_default",
    "end_user_id_characters_max",
    "end_user_id_problem",
    "entry_id_character_problem",
    "entry_id_characters_max",
    "entry_id_problem",
    "entry_prefix_problem",
    "host_audience",
    "new_token_secret",
    "rate_per_second_default",
    "retry_after_whole_seconds",
    "run_token_command",
    "scope_entries_max",
    "secret_digest",
    "secrets_per_round_max",
    "sessions_audience",
    "token_create",
    "token_list",
    "token_lookup",
    "token_revoke",
    "token_surfaces",
]
