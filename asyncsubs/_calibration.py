"""How far below a configured rate to pace: a measured margin, and a slowdown learnt from 429s.

The interval between two starts of a pool is ``per / n * (1 + margin) * slowdown``.

**Margin (arrival jitter).** A server stamps a request somewhere between the moment it was due
to start and the moment its response came back; requests paced exactly ``per / n`` apart can
reach its limiter closer together by up to the spread of that lag. So every answered request
gives a sample ``answered - due`` (its own lateness, the network and any queue in front of the
server's limiter, plus the work after the stamp), and the margin is the spread of recent
samples (the 99th percentile less the 1st, over the last ``2 n``: about two windows) over
``per``, floored at ``Limits.safety_margin`` and capped at ``Limits.max_margin``. Until ``n + 1``
samples exist a pool paces at the cap: a fresh server (cold caches, connections being opened)
stamps its first requests unevenly. Only the global pool's
light requests are sampled: a heavy list page spends 100-800 ms being built *after* the stamp,
which would widen the spread for nothing; heavy pools use the global pool's spread in seconds
(over their own ``per``), or the floor when their store sends no light requests.

**Slowdown (429 feedback, AIMD).** A 429 raises the pool's slowdown to ``n / accepted``, where
``accepted`` is how many starts the pool made in the window before the refused one (or since it
last came back from idle, if later), reckoned from its interval so that the starts of every
process sharing the backend count, not this one's alone: a server enforcing 40/s against a client
pacing 50/s refuses the 41st request of a window, so one 429 learns 1.25. When that count says
nothing (a pause lies within the window: the server may still count requests from before it;
or it is under 3, and one start stamped late would skew it), or less than a step, the slowdown
grows by ``1 + SLOWDOWN_STEP``. The excess over 1 halves every ``SLOWDOWN_HALF_LIFE`` seconds
without a 429, so a limit lowered for a while is given back within minutes, and one that stays
low costs a 429 about every ``SLOWDOWN_HALF_LIFE * log2(1 + SLOWDOWN_STEP / excess)`` seconds
(about half a minute at 40/50).
The 429s of requests already on their way when the first came back say nothing new: one
widening per round trip.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = [
    "MAX_SLOWDOWN",
    "SLOWDOWN_HALF_LIFE",
    "SLOWDOWN_STEP",
    "Jitter",
    "Slowdown",
]

#: Smallest widening per 429: a 429 after a long run at the learnt rate still means "slower".
SLOWDOWN_STEP = 0.05
#: The largest slowdown: a server enforcing less than a quarter of the configured rate is
#: misconfigured on one side, and its 429s and Retry-After still hold the pool.
MAX_SLOWDOWN = 4.0
#: Seconds for the excess of a slowdown over 1 to halve without a 429.
SLOWDOWN_HALF_LIFE = 120.0
#: Samples between two recomputations of a spread (sorting 4 n samples each time).
_RECOMPUTE_EVERY = 16


class Jitter:
    """Recent ``answered - due`` samples of one pool and their spread in seconds."""

    __slots__ = ("_fresh", "_samples", "needed", "spread")

    def __init__(self, n: int) -> None:
        self.needed = n + 1
        self._samples: deque[float] = deque(maxlen=2 * n + 2)
        self._fresh = 0
        self.spread: float | None = None  #: None until ``needed`` samples exist

    def add(self, sample: float) -> bool:
        """Record a sample; True when the spread was recomputed."""
        self._samples.append(sample)
        self._fresh += 1
        if len(self._samples) < self.needed or (
            self.spread is not None and self._fresh < _RECOMPUTE_EVERY
        ):
            return False
        self._fresh = 0
        ordered = sorted(self._samples)
        trim = len(ordered) // 100
        self.spread = ordered[-1 - trim] - ordered[trim]
        return True


class Slowdown:
    """A pool's AIMD slowdown factor (>= 1), decaying towards 1 on the caller's clock."""

    __slots__ = ("_at", "_excess", "widened_at")

    def __init__(self) -> None:
        self._excess = 0.0
        self._at = 0.0
        self.widened_at = -math.inf  #: when the last widening was made

    def value(self, now: float) -> float:
        if not self._excess:
            return 1.0
        decay: float = 0.5 ** (max(0.0, now - self._at) / SLOWDOWN_HALF_LIFE)
        return 1.0 + self._excess * decay

    def widen(self, now: float, target: float) -> float:
        """After a 429: at least one step slower, and at least ``target``; the new factor."""
        self.set(now, min(MAX_SLOWDOWN, max(self.value(now) * (1 + SLOWDOWN_STEP), target)))
        self.widened_at = now
        return self.value(now)

    def set(self, now: float, factor: float) -> None:
        """Adopt ``factor`` (from another process) if it is larger than the current value."""
        if factor > self.value(now):
            self._excess, self._at = factor - 1.0, now
