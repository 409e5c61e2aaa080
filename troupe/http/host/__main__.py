"""``python -m troupe.http.host persona ...`` (the same as ``troupe persona ...``)."""

from ._persona_cli import main

raise SystemExit(main())
