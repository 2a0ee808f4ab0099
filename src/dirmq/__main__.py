"""`python -m dirmq ...` runs the `dirmq` command."""

from __future__ import annotations

from dirmq.cli import main

raise SystemExit(main())
