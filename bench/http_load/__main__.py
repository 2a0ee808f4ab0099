"""`python -m bench.http_load`: the HTTP server benchmark (see the package's docstring)."""

import sys

from bench.http_load.driver import main

sys.exit(main())
