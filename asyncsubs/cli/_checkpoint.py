"""The checkpoint of ``pull -o FILE``: where a rerun of the same command continues.

``FILE.asyncsubs-checkpoint`` holds the cursor after the last whole page written and FILE's size
then, replaced atomically after each page: whatever stops the pull (even SIGKILL), a rerun cuts
FILE back to whole pages and continues from the cursor.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Final

import attrs

from ..errors import ConfigError
from ..json import dumps, loads

__all__ = ["CHECKPOINT_SUFFIX", "PullCheckpoint", "open_output"]

CHECKPOINT_SUFFIX: Final = ".asyncsubs-checkpoint"
#: A checkpoint's fields, as a damaged or hand-edited file may not hold them.
_TEXT: Final = attrs.validators.instance_of(str)
_COUNT: Final = attrs.validators.and_(attrs.validators.instance_of(int), attrs.validators.ge(0))


@attrs.frozen
class PullCheckpoint:
    """A pull's position: ``offset`` bytes of FILE hold ``records`` records in ``pages``
    pages, and ``cursor`` continues after them. ``resource``, ``base_url``, ``credentials`` (a
    one-way fingerprint of base URL and token: the token chooses the store), ``after_cursor``
    and ``params`` (``--after-cursor``, ``--param``) say which pull it belongs to."""

    resource: str = attrs.field(validator=_TEXT)
    base_url: str = attrs.field(validator=_TEXT)
    credentials: str = attrs.field(validator=_TEXT)
    after_cursor: str | None = attrs.field(validator=attrs.validators.optional(_TEXT))
    cursor: str = attrs.field(validator=_TEXT)
    offset: int = attrs.field(validator=_COUNT)
    records: int = attrs.field(validator=_COUNT)
    pages: int = attrs.field(validator=_COUNT)
    params: Mapping[str, str] = attrs.field(
        factory=dict, validator=attrs.validators.deep_mapping(_TEXT, _TEXT)
    )

    @staticmethod
    def path_for(output: Path) -> Path:
        return output.with_name(output.name + CHECKPOINT_SUFFIX)

    @classmethod
    def temporary_for(cls, output: Path) -> Path:
        """Where a checkpoint is written before it replaces the last one."""
        path = cls.path_for(output)
        return path.with_name(path.name + ".tmp")

    @classmethod
    def load(cls, output: Path) -> PullCheckpoint | None:
        """The checkpoint beside ``output``, None when there is none."""
        path = cls.path_for(output)
        try:
            data = loads(path.read_bytes())
            # A checkpoint from before --param has none.
            return cls(**{f.name: data.get(f.name, {}) for f in attrs.fields(cls)})
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except (ValueError, AttributeError, TypeError):
            raise ConfigError(
                f"{path} is not a pull checkpoint; remove it or pass --restart"
            ) from None

    def save(self, output: Path) -> None:
        temporary = self.temporary_for(output)
        temporary.write_bytes(dumps(attrs.asdict(self)))
        os.replace(temporary, self.path_for(output))  # atomic: the old one or the new, whole

    @classmethod
    def remove(cls, output: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            cls.path_for(output).unlink()


def _check_belongs(output: Path, saved: PullCheckpoint, pull: Mapping[str, Any]) -> None:
    """ConfigError unless ``saved`` is of the pull whose identifying fields are ``pull``."""
    if all(getattr(saved, name) == value for name, value in pull.items()):
        return
    token = "" if saved.credentials == pull["credentials"] else " with another token"
    after = "" if saved.after_cursor == pull["after_cursor"] else " after another cursor"
    params = "" if saved.params == pull["params"] else " with other --param filters"
    raise ConfigError(
        f"{output} has a checkpoint of a pull of {saved.resource} from {saved.base_url}"
        f"{token}{after}{params}; pass --restart to start over"
    )


def _cannot_resume(output: Path) -> ConfigError:
    return ConfigError(
        f"cannot write {output}: -o needs a file a rerun can resume (this one cannot seek); "
        "write to stdout without -o instead"
    )


def open_output(
    given: str, pull: Mapping[str, Any], *, restart: bool
) -> tuple[IO[bytes], PullCheckpoint | None]:
    """FILE (``given``, as on the command line) opened to write at the end of its checkpointed
    prefix, when it has a checkpoint of the pull ``pull`` identifies (a rerun continues), or
    from the start (none, or ``restart``)."""
    output = Path(given)
    if not output.name:  # "", ".", "/": no file, and no name for a checkpoint beside it
        raise ConfigError(f"cannot write {given!r}: not a file name")
    try:
        fifo = stat.S_ISFIFO(os.stat(output).st_mode)
    except OSError:  # none yet, or not to be looked at: said when it is opened, below
        fifo = False
    if fifo:  # opening it would wait for a reader; a rerun could not resume it anyway
        raise _cannot_resume(output)
    saved = None if restart else PullCheckpoint.load(output)
    if saved is not None:
        _check_belongs(output, saved, pull)
    # The checkpoint is written after each page: a directory that cannot take it fails the
    # pull here, before FILE is truncated, not after its first page.
    probe = PullCheckpoint.temporary_for(output)
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except FileNotFoundError:
        pass  # no such directory: said below, as for FILE
    except OSError as exc:
        raise ConfigError(
            f"cannot write {PullCheckpoint.path_for(output)}: {exc.strerror} (-o keeps a "
            "checkpoint beside FILE, to resume; write to stdout without -o instead)"
        ) from None
    try:
        if saved is None:
            PullCheckpoint.remove(output)
        out = open(output, "wb" if saved is None else "r+b")  # noqa: SIM115 - the pull closes it
    except FileNotFoundError as exc:
        if saved is not None:
            raise ConfigError(
                f"{output} is gone but its checkpoint is not; pass --restart to start over"
            ) from None
        why = exc.strerror if output.parent.is_dir() else "no such directory"
        raise ConfigError(f"cannot write {output}: {why}") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror}") from None
    if not out.seekable():  # a pipe or a terminal: a rerun could not cut it back to whole pages
        out.close()
        raise _cannot_resume(output)
    if saved is None:
        return out, None
    size = out.seek(0, os.SEEK_END)
    if size < saved.offset:
        out.close()
        raise ConfigError(
            f"{output} is shorter than its checkpoint says ({size:,} < {saved.offset:,} "
            "bytes); pass --restart to start over"
        )
    # Bytes after the checkpoint belong to a page whose checkpoint was never written.
    out.truncate(saved.offset)
    out.seek(saved.offset)
    return out, saved
