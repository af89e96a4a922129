"""Benchmarks: ``python -m benchmarks.<name>``.

A process started with ``ASYNCSUBS_CHECKOUT=<directory>`` in its environment imports asyncsubs
from that checkout instead: the page sources of ``overhead`` and the workers of ``workers`` run
an older commit beside today's in the same run when ``ASYNCSUBS_AGAINST=<directory>`` (e.g. a
``git worktree`` of the commit) is set for the benchmark.
"""

import os
import sys

if checkout := os.environ.get("ASYNCSUBS_CHECKOUT"):
    sys.path.insert(0, checkout)
