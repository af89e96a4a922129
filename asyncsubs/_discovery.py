"""What a pool learns of a server that does not tell its limits: pure state, no I/O.

The interface shows neither the heavy pools' sizes nor pageSize's maximum, and a bulk pull runs at
(pool's rate) x (records per page). A pool given ``Rate.discover()`` finds its rate
(:class:`RateSearch`), a pull given ``page_size="max"`` the largest page (:mod:`._page_size`),
and :class:`Learned` is what a key knows in the form that backends share and clients export
(:mod:`._learned`), so that the next worker or run starts where this one stopped. Times inside
a search are the event loop's; times in a ``Learned`` are durations from now, which each holder
converts on its clock.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._calibration import MAX_SLOWDOWN, SLOWDOWN_STEP
from ._config import Discovery, Rate
from .errors import ConfigError

__all__ = [
    "LEARNED_FORMAT",
    "LEARNED_MAX_AGE",
    "PROBE_HOLD",
    "Learned",
    "RateSearch",
    "export_learned",
    "import_learned",
    "merged",
]

#: A raise far from any refusal doubles the rate: from 1/s, a 10/s pool is reached in four steps.
FAR_STEP: Final = 2.0
#: A raise once a refusal is known (a probe) is small: the pool sits just under it.
NEAR_STEP: Final = 1.05
#: A refused pool paces this much under what the server evidently allowed: its stamps may come
#: later than its starts, unevenly, by more than the margin covers.
UNDER: Final = 0.02
#: Windows a rate must run clean before the next raise: two far from any refusal (a token
#: bucket lets a rate above its refill through until it is empty: one twice the limit for a
#: window of a bucket of a window's tokens), more near one (a rate a little above the server's
#: is refused only when the starts happen to bunch, or a bucket runs dry).
FAR_WINDOWS: Final = 2
NEAR_WINDOWS: Final = 5
#: Seconds a pool holds its rate after a 429 before it probes again; doubled for every refusal in
#: a row (the server's limit stays where it was), up to ``MAX_HOLD``.
PROBE_HOLD: Final = 300.0
MAX_HOLD: Final = 3600.0
#: Seconds after which a learned record is probed again from its rate (a server's limits change).
LEARNED_MAX_AGE: Final = 86_400.0


def _rate(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None and attribute.default is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and attribute.name in ("rate", "good", "refused")):
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def _count(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None and attribute.default is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def _size(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _label(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None and attribute.default is None:
        return
    if not isinstance(value, str) or not value.isprintable() or not 0 < len(value) <= 32:
        raise ValueError(f"{attribute.name} must be a short word, got {value!r}")


@attrs.frozen
class Learned:
    """What one pool of one store has learned of the server, as shared and exported.

    ``rate`` (requests per second paced before the margin; None: nothing learned), what set it
    (``rate_by``), the highest rate that ran clean (``good``) and the lowest a 429 refused
    (``refused``, the ceiling found), refusals in a row (``strikes``) and the seconds until the
    next probe (``hold``); the largest page the server serves (``page_size``, once known) and
    what told it (``page_by``), with the largest size it accepted and the smallest it refused;
    ``age``: seconds since the record last changed. ``hold`` and ``age`` drift with time, so
    two records are equal when all else is."""

    rate: float | None = attrs.field(default=None, validator=_rate)
    rate_by: str = attrs.field(default="start", validator=_label)
    good: float | None = attrs.field(default=None, validator=_rate)
    refused: float | None = attrs.field(default=None, validator=_rate)
    strikes: int = attrs.field(default=0, validator=_count)
    hold: float = attrs.field(default=0.0, validator=_rate, eq=False)
    page_size: int | None = attrs.field(default=None, validator=_size)
    page_by: str | None = attrs.field(default=None, validator=_label)
    page_accepted: int = attrs.field(default=0, validator=_count)
    page_refused: int | None = attrs.field(default=None, validator=_size)
    age: float = attrs.field(default=0.0, validator=_rate, eq=False)

    def expired(self) -> bool:
        return self.age > LEARNED_MAX_AGE

    def aged(self, seconds: float) -> Learned:
        """The record ``seconds`` later: its hold shorter, its age longer."""
        return attrs.evolve(self, hold=max(0.0, self.hold - seconds), age=self.age + seconds)


def merged(mine: Learned, theirs: Learned) -> Learned:
    """Two records of one pool changed at once (two workers): the lower rate's rate fields (a
    refusal wins over a raise, which is tried again later), and the page evidence of both."""
    rated = mine if theirs.rate is None or (mine.rate or math.inf) < theirs.rate else theirs
    refused = [r for r in (mine.page_refused, theirs.page_refused) if r is not None]
    sized = mine if mine.page_size is not None else theirs
    return attrs.evolve(
        rated,
        page_size=sized.page_size,
        page_by=sized.page_by,
        page_accepted=max(mine.page_accepted, theirs.page_accepted),
        page_refused=min(refused, default=None),
        age=min(mine.age, theirs.age),
    )


def rate_of(per_second: float, window: float) -> Rate:
    """``per_second`` as a Rate counted in ``window``: ``n`` starts in ``n / per_second`` s."""
    n = max(1, math.ceil(per_second * window - 1e-9))
    return Rate(n, per=n / per_second)


class RateSearch:
    """A discovering pool's rate, from its start up to its ceiling.

    - **Raise** after clean time at saturation: starts that each waited for their slot (the
      pool, not the caller, was the bottleneck; a start that did not wait begins the count
      anew) for two windows (five once a refusal is known), without a 429 or an announced
      limit. Far from any refusal it doubles; once one is known it steps 5% (a probe).
    - **429 to a rate that ran clean**: another 2% under it (at the server's edge: the stamps'
      spread outgrew the margin, and the window's count would say a start too few); 5% for
      another such 429 before the next raise (a leaky bucket lets a rate above its leak run
      clean until it fills); and no faster than the share of its paced starts the server let
      through since the last 429, pauses included, after two windows or more of saturated
      starts (a bucket full at both let through what it leaked in between), 2% under.
    - **429 to a raise**: at least 5% under the refused rate, 2% under what the server
      evidently allowed in the window before (the starts this loop saw accepted; when other
      processes pace the pool too, fewer than the last clean rate needs means theirs went
      unseen, and only halving counts), no faster than halfway back to the highest rate below
      it that ran clean, and not below just under that one.
    - After a 429, a hold of ``PROBE_HOLD`` s, doubled for each refusal in a row, before the
      next raise; a run that starts from an imported refusal holds as long from its start. A
      refused rate that later runs clean is forgotten: the server changed.
    - **Announced** limits replace the search (``announce``).
    """

    __slots__ = (
        "_clean",
        "_edge",
        "_goods",
        "_run_since",
        "_since_refusal",
        "announced",
        "by",
        "ceiling",
        "changed_at",
        "counted",
        "good",
        "hold_until",
        "lowest",
        "most",
        "rate",
        "refused",
        "strikes",
        "window",
    )

    def __init__(self, discovery: Discovery) -> None:
        self.window = discovery.ceiling.per
        self.ceiling = discovery.ceiling.per_second
        self.most = discovery.ceiling.n  # starts in a window at the ceiling
        self.lowest = discovery.start.per_second / MAX_SLOWDOWN
        self.rate, self.by = discovery.start.per_second, "start"
        self.good: float | None = None
        self.refused: float | None = None
        self.strikes, self.hold_until, self.announced = 0, -math.inf, False
        self.changed_at, self._clean, self._run_since = -math.inf, 0, -math.inf
        self._goods: list[float] = []  # every rate that ran clean, ascending: ``good`` is last
        self._edge = 0  # rates that ran clean refused since the last raise
        # When the pool's requests were due that were not refused: the starts the server
        # counted, as far as this loop knows (a 429 counts its window).
        self.counted = deque[float](maxlen=2 * self.most + 2)
        # The last refusal's due time and the starts since (None: one did not wait).
        self._since_refusal: tuple[float, int | None] = (-math.inf, None)

    def pace(self) -> Rate:
        return rate_of(self.rate, self.window)

    def _set(self, now: float, rate: float, by: str) -> None:
        self.rate, self.by, self.changed_at, self._clean = rate, by, now, 0

    def started(self, now: float, waited: bool) -> bool:
        """A request of the pool started (``waited``: it queued for its slot, so the pool was
        the bottleneck); True when that raised the rate."""
        self.counted.append(now)
        refused_at, starts = self._since_refusal
        self._since_refusal = refused_at, None if starts is None or not waited else starts + 1
        if not waited:  # the caller, not the pool, set the pace: no evidence of this rate
            self._clean = 0
            return False
        if self._clean == 0:
            self._run_since = now
        self._clean += 1
        windows = FAR_WINDOWS if self.refused is None else NEAR_WINDOWS
        ran = now - max(self._run_since, self.changed_at)
        if self.announced or self._clean < 2 or ran < windows * self.window:
            return False
        if self.good is None or self.rate > self.good:  # it ran clean
            self.good = self.rate
            self._goods.append(self.rate)
            if self.refused is not None and self.good >= self.refused:
                self.refused, self.strikes = None, 0  # the server allows what it refused
        if self.rate >= self.ceiling or now < self.hold_until:
            return False
        rate = self.rate * (FAR_STEP if self.refused is None else NEAR_STEP)
        self._set(now, min(self.ceiling, rate), "probe")
        self._edge = 0
        return True

    def refused_start(
        self, due: float, now: float, paused_until: float, workers: int, interval: float
    ) -> bool:
        """A 429 answered the request due at ``due`` (``paused_until``: the pool's last pause in
        this process; ``workers``: the processes pacing it; ``interval``: between the pool's
        starts, its margin included); True when that changed the rate (False: sent before the
        rate last changed)."""
        with contextlib.suppress(ValueError):
            self.counted.remove(due)  # refused, not counted
        # Saturated since the last refusal, the share of the pace's starts in that span, pause
        # included, the server accepted (a token bucket full at both refilled that many; one
        # that could empty in a long pause, or a count of a span under two windows, says little).
        (last, starts), let_through = self._since_refusal, None
        if due > last:  # else sent before the last refusal
            later = sum(start > due for start in self.counted)  # sent since: not answered yet
            span = due - last
            running = span >= FAR_WINDOWS * self.window and paused_until - last <= span / 2
            if starts is not None and running:
                let_through = (starts - 1 - later) * workers * interval / span
            self._since_refusal = due, later
        if due <= self.changed_at:
            return False
        # What the server evidently allowed: the starts it accepted in the window before, as a
        # sliding window counts them (pauses in it change nothing: the server counted these);
        # refused again at a rate a 429 set, no more than it accepted since the pause after
        # that 429 (a fixed window counts fewer than the last second holds, a token bucket
        # refills more slowly than it lets a burst through).
        per, counted = self.window, self.counted
        allowed = sum(due - per < start < due for start in counted) / per
        since = max(self.changed_at, paused_until, counted[0] if counted else due)
        if self.by == "429" and due - since >= per:
            allowed = min(allowed, sum(since <= start < due for start in counted) / (due - since))
        # Shared through Redis, the other workers' starts went unseen: as many again per worker
        # (they claim the pool's slots in turn).
        seen = allowed * workers or None
        self.refused_at(now, seen, every_start=workers == 1, let_through=let_through)
        return True

    def refused_at(
        self,
        now: float,
        allowed: float | None,
        *,
        every_start: bool = True,
        let_through: float | None = None,
    ) -> None:
        """A 429 answered a request paced at the current rate; ``allowed``: the rate the server
        evidently allowed in the window before (None: unknown), counted from ``every_start``
        of the pool, or from this process's only (others pace it too, unseen); ``let_through``:
        the share of the pool's paced starts it accepted since its last refusal, when the pool
        ran saturated since."""
        if self.announced:
            return
        paced = self.rate
        if self.good is not None and paced <= self.good:
            # A rate that ran clean for windows, refused now: at the server's edge (the stamps'
            # spread outgrew the margin), not far above it; the window's count would say a
            # start too few (one of two at 2/s). The margin grows by one more UNDER; by a
            # slowdown's step for a second such refusal since the last raise. A leaky bucket
            # lets a rate above its leak run clean until it fills: full at both refusals, it
            # let through what it leaked in between, so no more than that.
            self._goods = [rate for rate in self._goods if rate < paced]
            self.good = self._goods[-1] if self._goods else None
            rate = paced / (1 + (SLOWDOWN_STEP if self._edge else UNDER))
            if let_through is not None:
                rate = min(rate, paced * let_through / (1 + UNDER))
            self._refuse(now, paced, rate)
            self._edge += 1
            return
        # A rate refused is no longer one that ran clean (a token bucket let it through for a
        # while), nor is one above what the server just accepted of all the pool's starts (it
        # lowered its limit), give or take the start one window's count may miss (its window
        # is not quite the server's): the highest one below both is.
        top = allowed + 1 / self.window if allowed is not None and every_start else paced
        self._goods = [rate for rate in self._goods if rate < paced and rate <= top]
        good = self._goods[-1] if self._goods else None
        rate = paced / (1 + SLOWDOWN_STEP)
        # Counted from this process's starts alone, fewer than a rate that ran clean needs
        # means other workers' went unseen: only the rate that ran clean bounds the limit.
        if allowed is not None and (every_start or good is None or allowed >= good):
            rate = min(rate, allowed / (1 + UNDER))
        if good is not None:
            # Never below the rate that ran clean, just under it: it may have run at the edge.
            rate = max(good / (1 + UNDER), min(rate, (good + paced) / 2))
        self.good = good
        self._refuse(now, paced, rate)

    def _refuse(self, now: float, paced: float, rate: float) -> None:
        self.refused = paced if self.refused is None else min(self.refused, paced)
        self.strikes += 1
        self.hold_until = now + self._hold()
        self._set(now, max(self.lowest, rate), "429")

    def _hold(self) -> float:
        """Seconds a refused level is held before the next probe, for the refusals in a row."""
        return min(MAX_HOLD, PROBE_HOLD * 2.0 ** (self.strikes - 1))

    def announce(self, now: float, rate: float) -> bool:
        """The server announced its quota: pace by it and stop searching; True when the rate
        changed."""
        before = self.rate
        if not self.announced or not math.isclose(rate, self.rate):
            self._set(now, min(self.ceiling, max(self.lowest, rate)), "server")
        self.announced = True
        return self.rate != before

    def snapshot(self, now: float) -> dict[str, object]:
        return {
            "rate": self.rate,
            "rate_by": self.by,
            "good": self.good,
            "refused": self.refused,
            "strikes": self.strikes,
            "hold": max(0.0, self.hold_until - now),
        }

    def take(self, learned: Learned, now: float, *, imported: bool) -> None:
        self.restore(learned, now, by="remembered" if imported else None)
        if imported and self.strikes:
            # A new run knows no more of a refused level than the last one did: it holds it
            # from its start as a 429 would, not probing again at once (its 429s would be a
            # search's all over again).
            self.hold_until = max(self.hold_until, now + self._hold())

    def stats(self) -> dict[str, Any]:
        return {"rate_by": self.by, "ceiling_found": self.refused, "good": self.good}

    def restore(self, learned: Learned, now: float, *, by: str | None = None) -> None:
        """Start from what was learned before (``learned.rate`` is set; a probe not run clean
        yet from the rate before it), said to be set ``by`` that (default: what set it there);
        an expired record is probed again from its rate."""
        if learned.rate is None:
            return
        same = (learned.rate, learned.good, learned.refused, learned.strikes, learned.rate_by)
        if same == (self.rate, self.good, self.refused, self.strikes, self.by):
            return  # what this search knows already (written back by another holder)
        expired = learned.expired()
        self.good = None if expired else learned.good
        self._goods = [] if self.good is None else [self.good]
        self.refused = None if expired else learned.refused
        self.strikes = 0 if expired else learned.strikes
        self.hold_until = now + (0.0 if expired else learned.hold)
        self.announced = False
        # A probe the server has not answered yet is no evidence: start where it ran clean.
        rate = learned.rate
        if learned.rate_by == "probe" and learned.good is not None and not expired:
            rate = learned.good
        rate = min(self.ceiling, max(self.lowest, rate))
        self._set(now, rate, by or learned.rate_by)


#: The ``format`` of an export: its version, for whoever reads a file written by another.
LEARNED_FORMAT: Final = "asyncsubs.learned/1"
_TIMES: Final = ("hold", "age")


def export_learned(
    base_url: str, store: str, records: Mapping[str, Learned], now: float
) -> dict[str, Any]:
    """What a store's pools learned as JSON-ready data, its times as Unix times (``now``)."""
    pools = {}
    for key, record in records.items():
        fields = attrs.asdict(record)
        hold, age = fields.pop("hold"), fields.pop("age")
        pools[key] = {**fields, "hold_until": now + hold, "learned_at": now - age}
    return {"format": LEARNED_FORMAT, "base_url": base_url, "store": store, "pools": pools}


def import_learned(
    data: Mapping[str, Any], base_url: str, store: str, now: float
) -> dict[str, Learned]:
    """The records of an export of ``store`` at ``base_url`` (its times read against Unix time
    ``now``); ConfigError naming the part that is not one."""
    if not isinstance(data, Mapping) or data.get("format") != LEARNED_FORMAT:
        raise ConfigError(f"learned must be what export_learned() returned ({LEARNED_FORMAT})")
    if (data.get("base_url"), data.get("store")) != (base_url, store):
        raise ConfigError(
            f"learned was exported for store {data.get('store')!r} at another address or of "
            f"another store than {store!r}: it describes another server's limits"
        )
    pools = data.get("pools")
    if not isinstance(pools, Mapping):
        raise ConfigError("learned.pools must be a mapping of pool -> record")
    names = {a.name for a in attrs.fields(Learned)} - set(_TIMES)
    records = {}
    for key, fields in pools.items():
        try:
            if not isinstance(key, str) or not key or not isinstance(fields, Mapping):
                raise ValueError("expected a record under a pool's name")
            if unknown := set(fields) - names - {"hold_until", "learned_at"}:
                raise ValueError(f"unknown fields {sorted(unknown)}")
            hold_until, learned_at = fields.get("hold_until", now), fields.get("learned_at", now)
            if not all(
                type(t) in (int, float) and math.isfinite(t) for t in (hold_until, learned_at)
            ):
                raise ValueError("hold_until and learned_at must be Unix times")
            kept = {name: value for name, value in fields.items() if name in names}
            records[key] = Learned(
                **kept, hold=max(0.0, hold_until - now), age=max(0.0, now - learned_at)
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"learned.pools[{key!r}]: {exc}") from None
    return records
