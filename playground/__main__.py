"""``python -m playground`` is the ``playground`` command."""

from playground.cli import main

raise SystemExit(main())
