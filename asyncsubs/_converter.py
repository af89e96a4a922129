"""The package's one cattrs Converter, configured once; never cattrs' global converter.

Wire names are camelCase, attributes snake_case. Unknown fields are never rejected. A class
with a ``raw`` attribute gets the record itself there. Our own models take each known field
as-is (no conversion), which keeps structuring cheap and never fails on surprising types; a
caller's attrs class is structured by cattrs with its declared types.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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


def _own_model_hooks(cls: type[Any]) -> tuple[Callable[..., Any], Callable[[list[Any]], Any]]:
    """The structuring functions of one of our models, of a record and of a page's records: the
    hot path of a pull.

    Generated once per class: one ``record.get`` per known field, each value written straight
    into its slot of a new instance. The models have no validators or converters (they keep what
    the server sent), so this is what their ``__init__`` does, less its call and the lookup of
    ``object.__setattr__`` that a frozen class makes per field: a quarter less time; a page's
    records in one loop, without a call per record, a tenth less again. The first is callable
    as a cattrs hook ``(record, type)`` and as ``(record)``.
    """
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = []
    for a in attrs.fields(cls):
        namespace[f"set_{a.name}"] = cls.__dict__[a.name].__set__  # the slot's own setter
        value = "record" if a.name == RAW else f"get({camel(a.name)!r})"
        lines.append(f"set_{a.name}(self, {value})")
    one = "\n    ".join(lines)
    many = "\n        ".join(lines)
    source = (
        "def structure(record, _=None):\n"
        "    if not isinstance(record, dict):\n"
        "        raise TypeError(f'expected a JSON object, got {type(record).__name__}')\n"
        "    get = record.get\n"
        "    self = new(cls)\n"
        f"    {one}\n"
        "    return self\n"
        "def structure_all(records):\n"
        "    out = []\n"
        "    append = out.append\n"
        "    for record in records:\n"
        "        if not isinstance(record, dict):\n"
        "            raise TypeError(f'expected a JSON object, got {type(record).__name__}')\n"
        "        get = record.get\n"
        "        self = new(cls)\n"
        f"        {many}\n"
        "        append(self)\n"
        "    return out\n"
    )
    exec(compile(source, f"<asyncsubs structure {cls.__qualname__}>", "exec"), namespace)
    return namespace["structure"], namespace["structure_all"]


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


def _fails(structure: Callable[[Any], Any], record: Any) -> bool:
    try:
        structure(record)
    except _FAILURES:
        return True
    return False


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
        failed = exc
    # Off the hot path: which record, and (for a caller's class, through cattrs) which fields.
    index = next((i for i, r in enumerate(records) if _fails(structure, r)), "?")
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
