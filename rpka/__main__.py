"""``python -m rpka COMMAND [options]``: see ``rpka.cli``."""

import sys

from rpka.cli import main

if __name__ == "__main__":
    sys.exit(main())
