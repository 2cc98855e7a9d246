"""``python -m envlink``: the ``envlink`` command."""

from envlink._cli.main import main

raise SystemExit(main())
