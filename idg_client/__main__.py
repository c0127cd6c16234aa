"""``python -m idg_client ...``: the ``idg-client`` command."""

from idg_client.cli import main

raise SystemExit(main())
