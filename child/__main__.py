"""``python -m child <loadout>``."""

import os
import sys

from child._runtime import main

code = main()
# By now everything the child owns is closed: its channel, its backend and the backend's
# processes and directories. The interpreter's teardown (freeing every module and object one
# by one) would cost each child about 35 ms of CPU at stop, so flush and leave.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
