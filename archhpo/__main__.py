"""`python -m archhpo ...` is the `archhpo` command."""

import sys

from archhpo.cli import main

sys.exit(main())
