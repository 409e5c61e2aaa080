"""troupe.models."""
