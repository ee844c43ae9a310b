"""``python -m fxmobile``: the command line (see ``fxmobile --help``)."""

from fxmobile.cli import main

raise SystemExit(main())
