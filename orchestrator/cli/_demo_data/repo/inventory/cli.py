"""`python -m inventory.cli FILE value` prints the stock value of a JSON inventory."""

import json
import sys

from inventory.store import Item, Store


def main(argv: list[str]) -> int:
    path, command = argv
    store = Store()
    for row in json.load(open(path)):
        store.add(Item(**row))
    if command == "value":
        print(store.value())
        return 0
    print(f"unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
