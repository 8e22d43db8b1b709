"""`archhpo dashboard`: optuna-dashboard on the study storage, loopback-only unless asked.

Before serving, every archhpo study gets its objective's name (``val_loss``, Optuna's metric names,
so the dashboard never says "Objective 0") and a note that says what the importance plot is worth
with its number of trials; studies made by older versions are fixed the same way.  The server reads
the storage through `ArchFirstStorage`, which lists each trial's architecture keys (and choices)
before ``arch_idx`` and the training parameters, as the report does.  It answers only requests
addressed to itself (`HostCheck`): a foreign ``Host:`` header, as DNS rebinding sends, gets 403.
"""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any

from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial

from archhpo.schema import ARCH_RECORD
from archhpo.search._storage import mask_url, open_storage, resolve_storage_url

_IMPORTANCE = "**Importance plot:**"  # the paragraph of the note this command keeps current


def _arch_first(trial: FrozenTrial) -> FrozenTrial:
    """A copy of `trial` whose params and user attrs list the architecture first: its keys, then
    its choices (params whose name is not one of the training parameters or arch_idx)."""
    from archhpo.search._space import PARAM_NAMES

    params = trial.params
    order = [k for k in ARCH_RECORD if k in params] + [k for k in params if k not in ARCH_RECORD
                                                       and k not in PARAM_NAMES]
    order += [k for k in PARAM_NAMES if k in params]
    out = copy.copy(trial)
    out._params = {k: params[k] for k in order}
    out._distributions = {k: trial.distributions[k] for k in order if k in trial.distributions}
    attrs = trial.user_attrs
    out._user_attrs = {**{k: attrs[k] for k in ARCH_RECORD if k in attrs}, **attrs}
    return out


class ArchFirstStorage(RDBStorage):
    """The same RDBStorage (engine, sessions, caches shared), whose trials list the architecture
    keys before arch_idx: optuna-dashboard shows params and user attrs in the order it gets them,
    and a trial's params are stored arch_idx first."""

    def __init__(self, storage: RDBStorage) -> None:  # a view: no second engine, no schema check
        self.__dict__.update(storage.__dict__)

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [_arch_first(t) for t in super().get_all_trials(study_id, deepcopy, states)]

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return _arch_first(super().get_trial(trial_id))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return _arch_first(super().get_best_trial(study_id))


def _n_complete(storage: RDBStorage, study_id: int) -> int:
    import sqlalchemy as sa
    from optuna.trial import TrialState

    from archhpo.search._optuna_private import models as m

    t = m.TrialModel.__table__.c
    with storage.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).where(
            t.study_id == study_id, t.state == TrialState.COMPLETE)).scalar_one())


def prepare_studies(storage: RDBStorage) -> int:
    """Name each archhpo study's objective `val_loss` and keep the importance paragraph of its note
    current (the report's answer above it stays); returns how many studies it touched."""
    import optuna
    from optuna_dashboard import save_note

    from archhpo.report._notes import importance_note
    from archhpo.report._units import METRIC
    from archhpo.search._optuna_private import dashboard_note_body
    from archhpo.search._study import settings_attr

    n = 0
    for frozen in storage.get_all_studies():
        if settings_attr("plan") not in frozen.user_attrs:
            continue  # not an archhpo study: leave it as its owner made it
        study = optuna.load_study(study_name=frozen.study_name, storage=storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_metric_names and notes are experimental in Optuna
            if study.metric_names != [METRIC]:
                study.set_metric_names([METRIC])
            body = dashboard_note_body(frozen.system_attrs)
            head = body.split(_IMPORTANCE)[0].rstrip()
            paragraph = importance_note(_n_complete(storage, storage.get_study_id_from_name(frozen.study_name)))
            fresh = f"{head}\n\n{paragraph}" if head else paragraph
            if fresh != body:
                save_note(study, fresh)
        n += 1
    return n


LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")


def _bare(name: str) -> str:
    """A Host header's or --host's name, lower case, without port or IPv6 brackets."""
    name = name.strip().lower()
    if name.startswith("["):
        return name[1:].split("]", 1)[0]
    return name.rsplit(":", 1)[0] if name.count(":") == 1 else name


def allowed_hosts(host: str) -> frozenset[str]:
    """The names a request may address the dashboard by: loopback, --host itself, and for a
    wildcard --host (0.0.0.0, ::) this machine's own names and addresses.  Any port: the one a
    browser shows may be forwarded (compose's DASHBOARD_PORT, `ssh -L`)."""
    import socket

    names = {*LOOPBACK, _bare(host)}
    if _bare(host) in WILDCARD:
        try:
            me = socket.gethostname()
            names |= {me, socket.getfqdn(me), *(str(a[4][0]) for a in socket.getaddrinfo(me, None))}
        except OSError:
            pass
    return frozenset(n.lower() for n in names if n and n not in WILDCARD)


class HostCheck:
    """WSGI middleware: a request whose Host header names something else gets 403.  A page on
    another site whose name the attacker re-points at this address (DNS rebinding) sends its own
    name as Host, so it can neither read the studies nor use the unauthenticated write API."""

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, allowed

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        given = environ.get("HTTP_HOST", "")
        if _bare(given) in self.allowed:
            return self.app(environ, start_response)
        body = (f"archhpo dashboard: refused a request for Host {given or '(none)'!r}; it answers only to "
                f"{', '.join(sorted(self.allowed))}: open it by one of these names, or start it with --host "
                "set to the name you use.\n").encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]


def serve(storage_url: str | None, host: str, port: int) -> None:
    from bottle import run
    from optuna_dashboard import wsgi

    url = resolve_storage_url(storage_url)
    storage = open_storage(url, create=False)  # a clear error before the server starts
    try:
        prepare_studies(storage)
    except Exception as exc:  # a read-only database is still worth viewing
        print(f"warning: objective names and notes not written ({type(exc).__name__}: {exc})", file=sys.stderr)
    if host not in LOOPBACK:
        print(f"warning: the dashboard on {host} is reachable by others and has no login.", file=sys.stderr)
    print(f"optuna-dashboard for {mask_url(url)} on http://{host}:{port}/ (Ctrl-C to stop)", file=sys.stderr)
    run(HostCheck(wsgi(ArchFirstStorage(storage)), allowed_hosts(host)), host=host, port=port)
