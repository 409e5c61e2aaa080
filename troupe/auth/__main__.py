"""``python -m troupe.auth token ...`` (the same commands as ``troupe token``)."""

import sys

from ._cli import main

sys.exit(main())
