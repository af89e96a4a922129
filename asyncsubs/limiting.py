"""The rate limiter's parts, for those who plug in a pacing backend or read its statistics.

Most code needs none of this: ``AdminClient(limiter=None)`` paces each store in the process, and
``asyncsubs.redis.RedisLimiter`` shares the budget between processes and hosts. Here are:

- :class:`Limiter` (pass one as ``AdminClient(limiter=...)``) over a :class:`PacingBackend`;
  ``Limiter()`` paces over a :class:`MemoryPacing` private to the instance;
- :class:`PacingBackend`, the contract a shared backend implements (see ``RedisLimiter``);
- :class:`StoreLimiter` and :class:`Slot`, one store's state in a loop (``Limiter.bind``);
- :class:`LimiterStats` and :class:`PoolStats`, what ``AdminClient.stats`` reports.
"""

from ._limiter import Limiter, MemoryPacing, PacingBackend, Slot, StoreLimiter
from ._stats import LimiterStats, PoolStats

__all__ = [
    "Limiter",
    "LimiterStats",
    "MemoryPacing",
    "PacingBackend",
    "PoolStats",
    "Slot",
    "StoreLimiter",
]
