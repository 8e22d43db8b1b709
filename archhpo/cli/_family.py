"""The model family whose flags a command takes, and the values of those flags."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from archhpo.cli._options import argv_value, default
from archhpo.models import Family


def _family_from_argv(argv: Sequence[str], config: dict[str, Any] | None = None) -> str:
    """The family whose flags the parser takes: --family on the line, else the experiment file's,
    else (train --from) the best JSON's, else the default."""
    argv = list(argv)
    name = argv_value(argv, "--family") or (config or {}).get("family")
    if name is None:
        best = argv_value(argv, "--from")
        if best:
            try:
                name = json.loads(Path(best).read_text()).get("family")
            except (OSError, ValueError, AttributeError):
                name = None  # train reports the unreadable file itself
    return str(name) if name is not None else default("family")


def _family_values(args: argparse.Namespace, family: Family, with_defaults: bool) -> dict[str, Any]:
    values = {}
    for flag in family.flags:
        v = getattr(args, f"fam_{flag.name}", None)
        if v is not None:
            values[flag.name] = v
        elif with_defaults:
            values[flag.name] = flag.default
    return values
