"""An architecture named in words, every key and choice of it, with what differs from the winner marked.

Two architectures that differ only in heads (or d_ff, or a categorical choice) must never read as the
same one: wherever the report, the summary CSV or a dashboard note names an architecture, it prints
d_model, layers, heads, d_ff and each choice, and a runner-up (a confirmed rank, a baseline rule's
shape) marks each value that is not the winner's with the winner's value beside it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from archhpo.schema import ARCH_KEYS

# How each architecture key reads in a sentence: "d_model 64", "2 layers", "4 heads", "d_ff 256".
_WORDS = {"d_model": "d_model {}", "n_layers": "{} layers", "n_heads": "{} heads", "d_ff": "d_ff {}"}


def _whole(v: Any) -> Any:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return int(f) if math.isfinite(f) and f.is_integer() else f


def arch_fields(arch: Any, choices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every architecture key (None where unknown) and each categorical choice, in display order.
    `arch` is a frame row, a summary row or an architecture dict; choices default to its own."""
    get = arch.get if hasattr(arch, "get") else (lambda k, d=None: d)
    if choices is None:
        own = get("choices", None)
        choices = own if isinstance(own, Mapping) else {}
    out: dict[str, Any] = {k: _whole(get(k, None)) for k in ARCH_KEYS}
    out.update({str(k): v for k, v in sorted(choices.items())})
    return out


def _word(key: str, value: Any) -> str:
    shown = "–" if value is None or (isinstance(value, float) and not math.isfinite(value)) else value
    return _WORDS.get(key, key + " {}").format(shown)


def differences(fields: Mapping[str, Any], winner: Mapping[str, Any] | None) -> list[str]:
    """The keys (architecture keys and choices) whose value is not the winner's, in display order."""
    if winner is None:
        return []
    keys = list(dict.fromkeys([*fields, *winner]))
    return [k for k in keys if fields.get(k) != winner.get(k)]


def arch_segments(fields: Mapping[str, Any], winner: Mapping[str, Any] | None = None) -> list[tuple[str, bool]]:
    """(text, differs) per key: "8 heads (winner 4)" for a value that is not the winner's."""
    diff = set(differences(fields, winner))
    out = []
    for k in dict.fromkeys([*fields, *(winner or {})]):
        if k not in fields:  # a choice the winner has and this architecture lacks
            out.append((f"no {k} (winner {winner[k] if winner else '–'})", True))
            continue
        text = _word(k, fields[k])
        if k in diff and winner is not None:
            text += f" (winner {winner.get(k, 'none')})"
        out.append((text, k in diff))
    return out


def arch_text(fields: Mapping[str, Any], winner: Mapping[str, Any] | None = None) -> str:
    """Plain text (tables, CSV, notes) of `arch_fields` output, values not the winner's marked."""
    return ", ".join(t for t, _ in arch_segments(fields, winner))


def arch_html(fields: Mapping[str, Any], winner: Mapping[str, Any] | None = None) -> str:
    """HTML: as `arch_text`, each value that is not the winner's in bold."""
    return ", ".join(f"<b>{html.escape(t)}</b>" if d else html.escape(t) for t, d in arch_segments(fields, winner))


def arch_markdown(fields: Mapping[str, Any], winner: Mapping[str, Any] | None = None) -> str:
    """Markdown (dashboard notes): as `arch_text`, each value that is not the winner's in bold."""
    return ", ".join(f"**{t}**" if d else t for t, d in arch_segments(fields, winner))


__all__ = ["arch_fields", "arch_html", "arch_markdown", "arch_segments", "arch_text", "differences"]
