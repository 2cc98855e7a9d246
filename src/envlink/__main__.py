"""``python -m envlink``: the ``envlink`` command."""

from envlink._cli import main

raise SystemExit(main())
