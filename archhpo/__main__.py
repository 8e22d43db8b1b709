"""`python -m archhpo ...` is the `archhpo` command."""

import sys

from archhpo.search.cli import main

sys.exit(main())
