"""The ``asyncsubs`` command line: pull, sync (SQLite or PostgreSQL), demo, fake-server.

Each command is a module that registers its own arguments (``_pull``, ``_sync`` with
``_listen``, ``_status``, ``_dead_letters``, ``_demo``, ``_fake_server``); ``_app`` is the entry
point. The sync itself is ``asyncsubs.sync``: the commands show its events (``_progress``,
``_display``, ``_summaries``). Needs the ``cli`` extra (``pip install 'asyncsubs[cli]'``) only
for rich progress. The library never imports this package, and this package imports only the
library's public names.
"""

from __future__ import annotations

from ._app import main

__all__ = ["main"]
