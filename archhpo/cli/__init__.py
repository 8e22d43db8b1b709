"""The `archhpo` command line: the parser derived from `archhpo.cli._options`, the commands, the
train command and the dashboard. Nothing below the command line imports it."""

from archhpo.cli._main import main

__all__ = ["main"]
