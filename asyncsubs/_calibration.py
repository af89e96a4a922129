"""How far below a configured rate to pace: ``interval = per / n * (1 + margin) * slowdown``.

The margin covers the spread of when a server stamps requests (:class:`Jitter`), the slowdown
what 429s taught (:class:`Slowdown`, AIMD); README's "How close to the limit" gives the rules.
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
#: Seconds for a slowdown's excess over 1 to halve without a 429: a limit lowered for a while
#: is given back within minutes; one that stays low (40/s against 50) costs a 429 every ~30 s.
SLOWDOWN_HALF_LIFE = 120.0
#: Samples before a first spread and between recomputations (each a pass over 2 n samples), and
#: at least an eighth of the samples held between them: a pool paced at a high rate (2 n of
#: thousands) pays a few comparisons per sample, not a pass over them every 16.
_RECOMPUTE_EVERY = 16


class Jitter:
    """The spread (largest less smallest, None before ``needed`` samples) of the last two windows'
    ``answered - due`` of light requests, each stamped within that span. A new largest counts at
    once, no outlier: a stalled server stamps what it held at once, overflowing a window."""

    __slots__ = ("__weakref__", "_fresh", "_samples", "_top", "needed", "spread")

    def __init__(self, n: int) -> None:
        self.needed, self._samples = min(n + 1, _RECOMPUTE_EVERY), deque[float](maxlen=2 * n + 2)
        self._fresh, self._top = _RECOMPUTE_EVERY, math.inf  # the first spread at ``needed``
        self.spread: float | None = None

    def add(self, sample: float) -> None:
        self._samples.append(sample)
        self._fresh += 1
        due = self._fresh >= max(_RECOMPUTE_EVERY, len(self._samples) >> 3) or sample > self._top
        if due and len(self._samples) >= self.needed:
            self._fresh, self._top = 0, max(self._samples)
            self.spread = self._top - min(self._samples)


class Slowdown:
    """A pool's AIMD slowdown (>= 1), decaying to 1 on the caller's clock. A 429 widens it a step
    and to at least ``target``, the rate the server evidently allowed; once per round trip."""

    __slots__ = ("_at", "_excess", "widened_at")

    def __init__(self) -> None:
        self._excess, self._at, self.widened_at = 0.0, 0.0, -math.inf

    def value(self, now: float) -> float:
        if not self._excess:  # most of the time, on every request
            return 1.0
        return 1.0 + self._excess * math.pow(0.5, max(0.0, now - self._at) / SLOWDOWN_HALF_LIFE)

    def widen(self, now: float, target: float) -> float:
        """After a 429: at least one step slower, and at least ``target``; the new factor."""
        factor = min(MAX_SLOWDOWN, max(self.value(now) * (1 + SLOWDOWN_STEP), target))
        self._excess, self._at, self.widened_at = factor - 1.0, now, now
        return factor

    def set(self, now: float, factor: float) -> None:
        """Adopt ``factor`` (from another process) if it is larger than the current value."""
        if factor > self.value(now):
            self._excess, self._at = factor - 1.0, now
