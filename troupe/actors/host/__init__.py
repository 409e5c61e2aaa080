"""troupe.actors.host: the domain actors behind the host surface (Iris host API v1).

- ``EntryActor`` (kind ``entry``, key = entry id): stores message batches atomically with
  dedupe, creates its entry on the first message, answers ``pending_count``;
- ``Pace`` and ``named_paces``: when pending messages become a learning batch;
- ``MediaResolver``: the check of ``media_ids`` inside the message transaction;
- ``host_migrations``: the tables (entries, messages, message media).
"""

from ._entry import (
    AcceptMessages,
    EntryActor,
    EntryRecord,
    MediaRefused,
    MessagesAccepted,
    NewMessage,
    StorageUnavailable,
    accept_messages,
    entry_actor_kind,
    entry_kind_name,
    load_entry,
    messages_per_batch_max,
    pending_count,
)
from ._media import MediaResolver, NoMedia, no_media
from ._pace import (
    Pace,
    named_paces,
    pace_count_max,
    pace_idle_seconds_max,
    pace_idle_seconds_min,
    pace_max_wait_seconds_max,
    pace_name_default,
)
from ._schema import (
    host_component,
    host_migrations,
    learning_state_batched,
    learning_state_pending,
    learning_states_unlearned,
)

__all__ = [
    "AcceptMessages",
    "EntryActor",
    "EntryRecord",
    "MediaRefused",
    "MediaResolver",
    "MessagesAccepted",
    "NewMessage",
    "NoMedia",
    "Pace",
    "StorageUnavailable",
    "accept_messages",
    "entry_actor_kind",
    "entry_kind_name",
    "host_component",
    "host_migrations",
    "learning_state_batched",
    "learning_state_pending",
    "learning_states_unlearned",
    "load_entry",
    "messages_per_batch_max",
    "named_paces",
    "no_media",
    "pace_count_max",
    "pace_idle_seconds_max",
    "pace_idle_seconds_min",
    "pace_max_wait_seconds_max",
    "pace_name_default",
    "pending_count",
]
