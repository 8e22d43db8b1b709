"""Passwords in database URLs: found in every form, masked for output, split off for PGPASSWORD.

A root module that imports nothing heavy, so the command line can mask its own process title
before Optuna, SQLAlchemy or torch load.  The forms: ``user:pass@host`` (the last ``@`` before the
host is the separator, so an unencoded ``@`` in the password stays inside it), ``?password=``
and ``&password=`` in the query (the key matched after percent-decoding: ``pass%77ord=``), each
percent-encoded or not.  Over-masking is the safe side: text is never left showing a password.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, unquote_plus

MASK = "***"
# scheme://user:password@ in any text (the password runs to the last '@' before whitespace)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<pw>\S*)@")
# the same within a URL alone, by the URL rule (userinfo is the authority up to its last '@')
_AUTHORITY = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@]+):(?P<pw>[^/?#]*)@")
# ?key=value or &key=value; the key is compared once percent-decoded
_QUERY = re.compile(r"(?P<sep>[?&])(?P<key>[^=&#\s]*)=(?P<value>[^&#\s]*)")
PASSWORD_KEYS = frozenset({"password"})


def _is_password_key(key: str) -> bool:
    return unquote_plus(key).strip().lower() in PASSWORD_KEYS


def mask_url(text: str) -> str:
    """`text` (a URL, or a message that holds URLs) with every password replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    return _QUERY.sub(
        lambda m: f"{m.group('sep')}{m.group('key')}={MASK}" if _is_password_key(m.group("key")) else m.group(0),
        text,
    )


def split_password(url: str) -> tuple[str, str | None]:
    """The URL without its password, and the password (percent-decoded; None when it has none).

    A password in the user part and one in the query: the query's wins, as in libpq."""
    password: str | None = None
    m = _AUTHORITY.match(url)
    if m:
        password = unquote(m.group("pw"))
        url = f"{m.group('head')}@{url[m.end():]}"
    base, sep, query = url.partition("?")
    if sep:
        kept = []
        for part in query.split("&"):
            key, eq, value = part.partition("=")
            if eq and _is_password_key(key):
                password = unquote_plus(value)
            elif part:
                kept.append(part)
        url = f"{base}?{'&'.join(kept)}" if kept else base
    return url, password
