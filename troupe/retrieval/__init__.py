"""troupe.retrieval."""
