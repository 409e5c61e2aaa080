"""troupe.storage."""
