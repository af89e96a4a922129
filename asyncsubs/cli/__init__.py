"""The ``asyncsubs`` command line: pull, sync into SQLite, demo, fake-server.

Needs the ``cli`` extra (``pip install 'asyncsubs[cli]'``) only for rich progress; everything
else is stdlib. The library never imports this package.
"""

from __future__ import annotations

from ._app import main

__all__ = ["main"]
