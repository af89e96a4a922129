"""``asyncsubs fake-server``: the fake admin server for a user's own development, with what to
paste to use it: each store's token, a ``pull`` command and a ``stores.toml`` for ``sync``."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any, Final

from ..errors import ConfigError
from ..settings import is_loopback
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    non_negative_float,
    non_negative_int,
    port,
    positive_int,
)
from ._output import Output

if TYPE_CHECKING:
    from ..testing import FakeAdminServer, ServerRateLimits

__all__ = ["add_parser", "env_name", "paste_url"]


def add_parser(commands: Any) -> None:
    fake = commands.add_parser(
        "fake-server",
        help="run the fake admin server for your own development",
        description=(
            "Serve the admin interface on loopback with deterministic records, cursor "
            "pagination, auth and rate limits; prints each store's base URL and token. "
            "Ctrl-C stops it."
        ),
    )
    fake.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0: every interface; what it prints reaches it on "
        "loopback)",
    )
    fake.add_argument("--port", type=port, default=8080, help="0 = any free port")
    fake.add_argument("--stores", type=positive_int, default=2, metavar="N", help="stores")
    fake.add_argument(
        "--records", type=non_negative_int, default=1000, metavar="N", help="records per resource"
    )
    fake.add_argument("--seed", type=int, default=0, help="data seed (same seed, same records)")
    fake.add_argument(
        "--latency-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="added to every answer",
    )
    fake.add_argument(
        "--no-rate-limits", action="store_true", help="never answer 429 (default: 50/s global)"
    )
    fake.add_argument("--debug", action="store_true", help="tracebacks on errors")
    fake.set_defaults(handler=cmd_fake_server)


def env_name(store: str) -> str:
    """The token variable ``fake-server``'s ``stores.toml`` names for ``store``."""
    return "FAKE_" + "".join(c if c.isalnum() else "_" for c in store).upper() + "_TOKEN"


#: Hosts that listen on every interface: a client on this machine reaches them on loopback.
_EVERY_INTERFACE: Final = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}


def paste_url(host: str, port: int) -> tuple[str, bool]:
    """The base URL a client on this machine pastes for a server on ``host``, and whether it
    needs plain http allowed (a host that is not loopback: the client refuses it otherwise)."""
    if (local := _EVERY_INTERFACE.get(host)) is not None:
        return f"http://{local}:{port}", False
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}", not is_loopback(host)


def _usage(server: FakeAdminServer, limits: ServerRateLimits | None) -> list[str]:
    envs = {name: env_name(name) for name in server.tokens}
    first, first_token = next(iter(server.tokens.items()))
    url, insecure = paste_url(server.host, server.port)
    pull_rate = "" if limits is None else f" --rate {limits.heavy['subscriptions']}"
    allow = " --allow-insecure" if insecure else ""
    where = f"{url} (API base {url}/admin/{server.version}/)"
    if server.host in _EVERY_INTERFACE:
        where = (
            f"every interface, port {server.port}: {where} from this machine; from another, "
            f"http://THIS-HOST:{server.port} with --allow-insecure (allow_insecure = true in "
            "stores.toml): plain http, for a trusted network only"
        )
    elif insecure:
        where += ": plain http off loopback, allowed below for a trusted network only"
    lines = [
        f"fake admin server on {where}; Ctrl-C stops it",
        "",
        *(f"store {name}: token {token}" for name, token in server.tokens.items()),
        "",
        f"# pull from {first}:",
        f"export ASYNCSUBS_BASE_URL={url}",
        f"export ASYNCSUBS_TOKEN={first_token}",
        f"asyncsubs pull subscriptions --store {first} --limit 5{pull_rate}{allow}",
        "",
        "# sync every store: save the TOML below as stores.toml, then",
        *(f"export {envs[name]}={token}" for name, token in server.tokens.items()),
        "asyncsubs sync --config stores.toml --db sqlite:///fake.db",
        "",
        "[defaults]",
        f"page_size = {server.max_page_size}  # the fake server's largest page",
        *(["allow_insecure = true  # plain http off loopback: a trusted network only"] * insecure),
        "",
    ]
    if limits is not None:
        heavy = ", ".join(f'{path} = "{rate}"' for path, rate in limits.heavy.items())
        lines += [
            "[defaults.limits]  # the limits the fake server enforces",
            f'global = "{limits.global_rate}"',
            f"heavy = {{ {heavy} }}",
            "",
        ]
    for name in server.tokens:
        lines += [f"[stores.{name}]", f'base_url = "{url}"']
        lines += [f'token_env = "{envs[name]}"', ""]
    return lines


def cmd_fake_server(args: argparse.Namespace, out: Output) -> int:
    from ..testing import ServerRateLimits, serve_forever

    limits = None if args.no_rate_limits else ServerRateLimits()
    served = False

    def ready(server: FakeAdminServer) -> None:
        nonlocal served
        served = True
        sys.stdout.write("\n".join(_usage(server, limits)))
        sys.stdout.flush()

    try:
        stopped_by = serve_forever(
            ready=ready,
            make_records=True,
            stores=args.stores,
            records=args.records,
            seed=args.seed,
            host=args.host,
            port=args.port,
            latency=args.latency_ms / 1000.0 if args.latency_ms > 0 else None,
            rate_limits=limits,
        )
    except KeyboardInterrupt:
        stopped_by = signal.SIGINT
    except OSError as exc:  # an address that cannot be bound is a usage error, as for --listen
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    if served or stopped_by is None:  # Ctrl-C is how a server that served ends: done
        return 0
    # Stopped while it made its records, before it printed how to use it: nothing was served.
    out.note("interrupted before it served")
    return EXIT_TERMINATED if stopped_by == signal.SIGTERM else EXIT_INTERRUPTED
