"""``./dev``: its first run says what it installs as it goes."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Stands in for python3 and the venv's python: ``-m venv DIR`` makes DIR/bin/python (this
# script); ``-m pip install`` prints what pip prints (nothing with -q); anything else says so.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1 $2" = "-m pip" ]; then
  case " $* " in *" -q "*) exit 0 ;; esac
  echo "Collecting aiohttp>=3.9"
  echo "  Downloading aiohttp-3.9.0.whl (1.2 MB)"
  echo "WARNING: Location 'file:///nowhere' is ignored" >&2
  echo "Collecting attrs"
  echo "Installing collected packages: attrs, aiohttp, asyncsubs"
  echo "Successfully installed aiohttp-3.9.0 asyncsubs-0.1 attrs-23.1"
  exit 0
fi
echo "ran: $*"
"""


def test_first_run_shows_each_package_as_it_installs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.write_text(FAKE_PYTHON, encoding="utf-8")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["ASYNCSUBS_VENV"] = str(tmp_path / "venv")
    run = subprocess.run(
        [str(ROOT / "dev"), "demo", "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ran: -m asyncsubs demo --quick\n"
    assert run.stderr.splitlines() == [
        f"dev: installing into {tmp_path / 'venv'} (first run only, a minute or so)",
        "dev: upgrading pip",
        "dev: installing asyncsubs and its development dependencies",
        "dev:   Collecting aiohttp>=3.9",
        "dev:   Collecting attrs",
        "dev:   Installing collected packages: attrs, aiohttp, asyncsubs",
        "dev:   Successfully installed aiohttp-3.9.0 asyncsubs-0.1 attrs-23.1",
    ]
    # The second run installs nothing.
    again = subprocess.run(
        [str(ROOT / "dev"), "demo"], env=env, capture_output=True, text=True, check=False
    )
    assert (again.returncode, again.stderr) == (0, "")
