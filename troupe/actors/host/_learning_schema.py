"""The learning tables: batches and the model-call log (appended to ``host_migrations``).

Why these shapes:
- ``host_batches.id`` is ``AUTOINCREMENT``: batch ids only increase, so "the last 20 finished
  batches of an entry" is "the 20 highest ids" and ``/status`` lists batches ascending by id.
- ``learner_key`` is fixed when the batch is closed: one learner runs an entry's batches, in id
  order; ``(learner_key, state, id)`` is its claim lookup and ``(entry_id, state, id)`` the
  status lookups.
- ``result_json`` is the stored result (memory ids, counts, the error), ``reason`` the last
  failure or release reason, both kept with the batch forever.
- ``host_model_calls`` is a bounded log (two days) behind the 24-hour usage figures.
Kept free of imports from ``_schema`` so that ``_schema`` can import it.
"""

from __future__ import annotations

learning_tables_sql = """
    CREATE TABLE host_batches (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        entry_id TEXT NOT NULL,
        state TEXT NOT NULL,
        learner_key TEXT NOT NULL,
        trigger TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        first_message_id INTEGER NOT NULL,
        last_message_id INTEGER NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        reason TEXT,
        result_json TEXT
    );
    CREATE INDEX host_batches_by_learner ON host_batches (learner_key, state, id);
    CREATE INDEX host_batches_by_entry ON host_batches (entry_id, state, id);
    CREATE INDEX host_batches_by_state ON host_batches (state, id);
    CREATE INDEX host_messages_by_batch ON host_messages (batch_id);
    CREATE TABLE host_model_calls (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        seconds REAL NOT NULL,
        outcome TEXT NOT NULL,
        purpose TEXT NOT NULL,
        entry_id TEXT
    );
    CREATE INDEX host_model_calls_by_time ON host_model_calls (at);
"""

__all__ = ["learning_tables_sql"]
