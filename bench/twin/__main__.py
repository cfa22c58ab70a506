"""``python -m bench.twin`` (see :mod:`bench.twin.cli`)."""

import sys

from bench.twin.cli import main

sys.exit(main())
