"""Every use of a private part of Ray, in one place (pyproject.toml bounds ray below the next
minor version: these are checked against each new release before it is allowed)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Keep a local Ray instance on 127.0.0.1 while it starts.

    On Linux ray.init(_node_ip_address="127.0.0.1") swaps loopback for the machine's routable
    address, and GCS, raylet, workers, dashboard and agents then listen on every interface.
    Ray's "no cluster" mode (the env switch below, read by Ray's processes as they start, and
    the private constant it sets in this one) keeps the node address, and so every listener, on
    loopback.  Restored afterwards so a later ray.init(address=...) can join a real cluster.
    """
    from ray._private import ray_constants

    old_env, old_flag = os.environ.get(_LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(_LOCAL_ONLY_ENV, None)
        else:
            os.environ[_LOCAL_ONLY_ENV] = old_env


def token_auth_without_advice() -> None:
    """Token authentication for a new local instance, asked for explicitly (RAY_AUTH_MODE=token).

    Ray enables it by default anyway, but then logs "Token authentication is enabled... Set
    RAY_AUTH_MODE=disabled to opt out", advice to weaken security.  Setting the variable alone is
    not enough once Ray is imported: its cached config is refreshed as Ray's own default does.
    A mode the user set (token or disabled) is left as it is."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    _enable_token_auth()  # sets RAY_AUTH_MODE=token and refreshes the config, without the warning


def setproctitle() -> Callable[[str], None] | None:
    """Ray's setproctitle (it rewrites the argv memory that ps reads), or None without Ray."""
    try:
        from ray._raylet import setproctitle as fn  # type: ignore[attr-defined]  # private, in the compiled module
    except ImportError:
        return None
    return fn
