"""troupe.sim."""
