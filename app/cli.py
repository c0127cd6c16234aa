"""Moved to :mod:`idg_client.cli` (``idg-client``, ``python -m idg_client``); ``python -m app.cli`` still runs it."""

from idg_client.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
