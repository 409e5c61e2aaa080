import sys

from troupe.cli import main

sys.exit(main())
