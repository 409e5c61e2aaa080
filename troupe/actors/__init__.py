"""troupe.actors."""
