"""A virtual loop clock for tests (the ``clock`` fixture in conftest.py).

The fixture makes the running loop's ``time()`` virtual and lets the selector jump it straight to
the next timer instead of blocking, so seconds of pacing run in microseconds and every start time
is exact (as aiolimiter's own tests patch the loop clock).
"""

from __future__ import annotations


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.timers = 0  # loop.call_at calls, to check that nothing polls
        self.lateness = 0.0  # how late every timer fires, as a real loop's do
        self.late_once = 0.0  # extra lateness of the next timer only (a busy loop iteration)

    def time(self) -> float:
        return self.now
