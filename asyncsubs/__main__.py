"""``python -m asyncsubs`` and the ``asyncsubs`` console script."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 done, 1 API/transport, 2 usage/config)."""
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:  # Ctrl-C while the command line loads: as later, no traceback
        return 130
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
