"""``python -m headsurgeon.cli``: the same as the ``headsurgeon`` command."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
