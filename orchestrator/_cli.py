"""The ``fleet`` command line (placeholder until the CLI lands)."""

import sys


def main() -> None:
    print("fleet: not built yet", file=sys.stderr)
    sys.exit(2)
