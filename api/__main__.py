"""`python -m portkern` runs the command line."""

import sys

from portkern.cli.main import main

sys.exit(main())
