"""``python -m child <loadout>``."""

import sys

from child._runtime import main

sys.exit(main())
