"""``python -m asyncsubs.dlt``: the source's ``demo``, its arguments read by ``cli``."""

import sys

from ..cli._dlt_demo import main

if __name__ == "__main__":
    sys.exit(main())
