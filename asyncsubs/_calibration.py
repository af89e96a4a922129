"""How far below a configured rate to pace: ``interval = per / n * (1 + margin) * slowdown``.

**Margin.** A server stamps a request somewhere between its due moment and its answer, so starts
``per / n`` apart can reach its limiter closer together by up to the spread of that lag. Each
answered light request gives ``answered - due``; the margin is the spread (99th less 1st
percentile) of the last ``2 n`` samples over ``per``, floored at ``Limits.safety_margin``,
capped at ``Limits.max_margin``, and the cap until ``n + 1`` samples exist. Heavy requests are
not sampled: their pages are built after the stamp. README's "How close to the limit" explains.

**Slowdown (AIMD).** A 429 raises it to ``n / accepted``, the starts of the window before the
refused one (a server at 40/s against 50/s: 1.25), or by one step when that count says nothing;
one widening per round trip. The excess over 1 halves every ``SLOWDOWN_HALF_LIFE`` seconds, so
a limit lowered for a while is given back within minutes, one that stays low costs a 429 about
every half minute (40/50).
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["MAX_SLOWDOWN", "SLOWDOWN_HALF_LIFE", "SLOWDOWN_STEP", "Jitter", "Slowdown"]

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
