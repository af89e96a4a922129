"""A throwaway PostgreSQL cluster for tests and benchmarks (``initdb`` + ``pg_ctl``).

``initdb`` and ``pg_ctl`` come from ``/usr/lib/postgresql/*/bin`` (Debian's ``postgresql``
package) or ``pg_config --bindir``. PostgreSQL refuses to run as root, so as root the cluster
belongs to the ``postgres`` user (``nobody`` without one) and the server runs as that user.
Durability is off (``fsync=off``): what is tested is transactions, not disks.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from ._ports import free_port

__all__ = ["PostgresServer", "postgres_bindir"]


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are, or None."""
    for initdb in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True):
        return Path(initdb).parent
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    return None


class PostgresServer:
    """A throwaway cluster in a temporary directory, listening on a loopback port (trust auth,
    superuser ``asyncsubs``)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="asyncsubs-pg-"))
        self.data = self.root / "data"
        self.port = free_port()  # stable across a restart (pause, resume)
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres").pw_name
            except KeyError:
                self.user = "nobody"
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            user=self.user,
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {result.stdout}{result.stderr}")

    def start(self) -> None:
        self._run(
            *("initdb", "-D", str(self.data), "-U", "asyncsubs", "--auth=trust", "-E", "UTF8"),
            "--no-sync",
        )
        self.resume()

    def resume(self) -> None:
        """Start the cluster's server (again, after ``pause``), on the same port."""
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def pause(self) -> None:
        """Stop the server as an administrator's restart does (``pg_ctl stop -m fast``: every
        connection is cut), keeping the cluster for ``resume``."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://asyncsubs@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self) -> str:
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)
