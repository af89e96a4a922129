"""``python -m asyncsubs.dlt``: the source's demo (see ``_demo``)."""

import sys

from ._demo import main

if __name__ == "__main__":
    sys.exit(main())
