"""The package's one cattrs Converter, configured once; never cattrs' global converter.

Wire names are camelCase, attributes snake_case. Unknown fields are never rejected. A class
with a ``raw`` attribute gets the record itself there. Our own models take each known field
as-is (no conversion), which keeps structuring cheap and never fails on surprising types; a
caller's attrs class is structured by cattrs with its declared types.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any, Final, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

from ._models import Customer, Order, Subscription
from .errors import ConfigError, ProtocolError

__all__ = ["camel", "converter", "structure_records", "structurer_for"]

T = TypeVar("T")
RAW: Final = "raw"


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


#: Runs a ``map`` to its end in C, keeping nothing (a deque of no length).
_consume: Final = deque[Any](maxlen=0).extend
#: Records a page holds at least for its fields to go in passes (below, a pass's own cost, a
#: few microseconds a field, outweighs what it saves a record).
_PASSES_FROM: Final = 16


def _own_model_hooks(cls: type[Any]) -> tuple[Callable[..., Any], Callable[[list[Any]], Any]]:
    """The structuring functions of one of our models, of a record and of a page's records: the
    hot path of a pull.

    The models have no validators or converters (they keep what the server sent), so a record's
    known fields go straight into the slots of a new instance, without the call to ``__init__``
    and the lookup of ``object.__setattr__`` a frozen class makes per field. A page's records go
    field by field, each pass a ``map`` run in C: 100 small records in 0.65 of the time a loop
    over them takes, 20 in 0.9; under ``_PASSES_FROM`` the loop is quicker. The first function
    is callable as a cattrs hook ``(record, type)`` and as ``(record)``; the second raises
    TypeError at a record that is not an object."""
    new = object.__new__
    get = dict.get
    #: (the field slot's own setter, the record's key; None for ``raw``: the record itself)
    fields = [
        (cls.__dict__[a.name].__set__, None if a.name == RAW else camel(a.name))
        for a in attrs.fields(cls)
    ]

    def structure(record: Any, _: Any = None) -> Any:
        if not isinstance(record, dict):
            raise TypeError(f"expected a JSON object, got {type(record).__name__}")
        self = new(cls)
        for set_field, key in fields:
            set_field(self, record if key is None else get(record, key))
        return self

    def structure_all(records: list[Any]) -> list[Any]:
        if (n := len(records)) < _PASSES_FROM:
            return [structure(record) for record in records]
        out = list(map(new, repeat(cls, n)))
        for set_field, key in fields:
            _consume(
                map(set_field, out, records if key is None else map(get, records, repeat(key, n)))
            )
        return out

    return structure, structure_all


def _user_class_hook(conv: cattrs.Converter, cls: type[Any]) -> Callable[[Any, type[Any]], Any]:
    names = [a.name for a in attrs.fields(cls)]
    overrides = {n: override(rename=camel(n)) for n in names if n != RAW}
    if RAW not in names:
        return make_dict_structure_fn(cls, conv, **overrides)  # type: ignore[arg-type]
    # The raw record rides along under a key no server sends.
    overrides[RAW] = override(rename="\x00raw", struct_hook=lambda v, _: v)
    inner = make_dict_structure_fn(cls, conv, **overrides)  # type: ignore[arg-type]

    def structure(record: Any, typ: type[Any]) -> Any:
        return inner({**record, "\x00raw": record}, typ)

    return structure


_OWN_HOOKS: Final = {model: _own_model_hooks(model) for model in (Subscription, Customer, Order)}
#: Our own models' structuring functions, also used directly (no cattrs dispatch) by
#: ``structurer_for``; and each one's function of a page's records.
_OWN_STRUCTURERS: Final[dict[type[Any], Callable[..., Any]]] = {
    model: one for model, (one, _) in _OWN_HOOKS.items()
}
_ALL_AT_ONCE: Final[dict[Callable[..., Any], Callable[[list[Any]], list[Any]]]] = {
    one: many for one, many in _OWN_HOOKS.values()
}


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=False)
    for model, hook in _OWN_STRUCTURERS.items():
        conv.register_structure_hook(model, hook)
    conv.register_structure_hook_factory(attrs.has, functools.partial(_user_class_hook, conv))
    return conv


#: The package's converter: records here; the sync's config file registers its tables on it.
converter: Final = _make_converter()


def structurer_for(model: Any) -> Callable[[Any], Any] | None:
    """A function structuring one record into ``model``; None for ``model=dict`` (no cost)."""
    if model is dict:
        return None
    if not (isinstance(model, type) and attrs.has(model)):
        raise ConfigError(f"model must be dict or an attrs class, got {model!r}")
    own = _OWN_STRUCTURERS.get(model)
    if own is not None:
        return own
    hook = converter.get_structure_hook(model)
    return lambda record: hook(record, model)


_FAILURES = (cattrs.BaseValidationError, TypeError, ValueError, KeyError, AttributeError)


def _failure(structure: Callable[[Any], Any], record: Any) -> Exception | None:
    try:
        structure(record)
    except _FAILURES as exc:
        return exc
    return None


def structure_records(
    records: list[Any], structure: Callable[[Any], Any] | None, *, method: str, path: str
) -> list[Any]:
    if structure is None:
        return records
    try:
        if (structure_all := _ALL_AT_ONCE.get(structure)) is not None:
            return structure_all(records)
        return [structure(r) for r in records]
    except _FAILURES as exc:
        failed: Exception = exc
    # Off the hot path: which record, and why (a page's pass, field by field, says neither);
    # for a caller's class, through cattrs, which fields.
    index: int | str = "?"
    for i, record in enumerate(records):
        if (error := _failure(structure, record)) is not None:
            index, failed = i, error
            break
    cause: BaseException | None = failed
    if isinstance(failed, cattrs.BaseValidationError):
        detail = "; ".join(cattrs.transform_error(failed, path=f"$[{index}]"))
        # Said whole in the detail; its tree of exceptions, as deep as the record, may be too
        # deep to print or pickle.
        cause = None
    else:
        detail = f"record {index}: {type(failed).__name__}: {failed}"
    raise ProtocolError(
        f"{method} {path}: a record could not be structured: {detail}", method=method, path=path
    ) from cause
