"""``asyncsubs fake-server``: the fake admin server for a user's own development, with what to
paste to use it: each store's token, a ``pull`` command and a ``stores.toml`` for ``sync``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._common import non_negative_int, positive_int
from ._output import Output

if TYPE_CHECKING:
    from ..testing import FakeAdminServer, ServerRateLimits

__all__ = ["add_parser", "env_name"]


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
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on")
    fake.add_argument("--port", type=non_negative_int, default=8080, help="0 = any free port")
    fake.add_argument("--stores", type=positive_int, default=2, metavar="N", help="stores")
    fake.add_argument(
        "--records", type=non_negative_int, default=1000, metavar="N", help="records per resource"
    )
    fake.add_argument("--seed", type=int, default=0, help="data seed (same seed, same records)")
    fake.add_argument(
        "--latency-ms", type=float, default=0.0, metavar="MS", help="added to every answer"
    )
    fake.add_argument(
        "--no-rate-limits", action="store_true", help="never answer 429 (default: 50/s global)"
    )
    fake.add_argument("--debug", action="store_true", help="tracebacks on errors")
    fake.set_defaults(handler=cmd_fake_server)


def env_name(store: str) -> str:
    """The token variable ``fake-server``'s ``stores.toml`` names for ``store``."""
    return "FAKE_" + "".join(c if c.isalnum() else "_" for c in store).upper() + "_TOKEN"


def _usage(server: FakeAdminServer, limits: ServerRateLimits | None) -> list[str]:
    envs = {name: env_name(name) for name in server.tokens}
    first, first_token = next(iter(server.tokens.items()))
    pull_rate = "" if limits is None else f" --rate {limits.heavy['subscriptions']}"
    lines = [
        f"fake admin server on {server.base_url} (API base {server.api_url}); Ctrl-C stops it",
        "",
        *(f"store {name}: token {token}" for name, token in server.tokens.items()),
        "",
        f"# pull from {first}:",
        f"export ASYNCSUBS_BASE_URL={server.base_url}",
        f"export ASYNCSUBS_TOKEN={first_token}",
        f"asyncsubs pull subscriptions --store {first} --limit 5{pull_rate}",
        "",
        "# sync every store: save the TOML below as stores.toml, then",
        *(f"export {envs[name]}={token}" for name, token in server.tokens.items()),
        "asyncsubs sync --config stores.toml --db sqlite:///fake.db",
        "",
        "[defaults]",
        f"page_size = {server.max_page_size}  # the fake server's largest page",
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
        lines += [f"[stores.{name}]", f'base_url = "{server.base_url}"']
        lines += [f'token_env = "{envs[name]}"', ""]
    return lines


def cmd_fake_server(args: argparse.Namespace, out: Output) -> int:
    from ..testing import ServerRateLimits, serve_forever

    limits = None if args.no_rate_limits else ServerRateLimits()

    def ready(server: FakeAdminServer) -> None:
        server.make_records()
        sys.stdout.write("\n".join(_usage(server, limits)))
        sys.stdout.flush()

    try:
        serve_forever(
            ready=ready,
            stores=args.stores,
            records=args.records,
            seed=args.seed,
            host=args.host,
            port=args.port,
            latency=args.latency_ms / 1000.0 if args.latency_ms > 0 else None,
            rate_limits=limits,
        )
    except KeyboardInterrupt:
        return 0
    except OSError as exc:  # an address that cannot be bound is a usage error, as for --listen
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0
