"""``python -m troupe.server`` = ``troupe serve``, usable before (or without) the full CLI."""

import sys

from ._serve import main

sys.exit(main())
