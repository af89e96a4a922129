"""The ``asyncsubs`` command line: pull, sync (SQLite or PostgreSQL), demo, fake-server.

Each command is a module that registers its own arguments (``_pull``, ``_sync``, ``_status``,
``_dead_letters``, ``_demo``, ``_fake_server``); ``_app`` is the entry point. The commands show
the runtime's events (``_progress``, ``_display``, ``_summaries``); rich, for the live table,
is the ``cli`` extra. The library never imports this package, and this package imports only
the library's public names.
"""

from __future__ import annotations

from ._app import main

__all__ = ["main"]
