"""troupe.http."""
