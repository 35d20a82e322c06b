"""``python -m pagedserve``: the ``pagedserve`` command."""

from pagedserve.cli.main import main

raise SystemExit(main())
