"""``python -m lookahead_client.bench``: the same as the ``lookahead-bench`` command."""

from .cli import main

raise SystemExit(main())
