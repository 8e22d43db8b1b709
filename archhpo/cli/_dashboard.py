"""`archhpo dashboard`: optuna-dashboard on the study storage, loopback-only unless asked."""

from __future__ import annotations

import sys

from archhpo.search._storage import mask_url, open_storage, resolve_storage_url


def serve(storage_url: str | None, host: str, port: int) -> None:
    from optuna_dashboard import run_server

    url = resolve_storage_url(storage_url)
    storage = open_storage(url, create=False)  # a clear error before the server starts
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: the dashboard on {host} is reachable by others and has no login.", file=sys.stderr)
    print(f"optuna-dashboard for {mask_url(url)} on http://{host}:{port}/ (Ctrl-C to stop)", file=sys.stderr)
    run_server(storage, host=host, port=port)
