"""A real multi-node Ray cluster on one machine pulls trials from one PostgreSQL study; GPU shares.

The cluster is `ray.cluster_utils.Cluster`: a head with no CPUs (so it runs no trial) and two worker
nodes with one CPU each, every one a separate raylet with its own node id, as on separate machines.
It lives in a private RAY_TMPDIR (no address file left in /tmp/ray for other Ray users to join)
and binds loopback only: Ray's "no cluster" switch keeps each node's address at 127.0.0.1 instead
of the machine's routable address, which is the one thing that differs from several hosts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from archhpo.cluster._run import RunOptions, run_workers
from archhpo.report._export import export_studies
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.search._storage import open_storage
from tests.conftest import REPO, TINY_DATA, run_cli

GiB = 2**30


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="ahc")  # short: Ray's unix socket paths must stay under 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # node address stays 127.0.0.1
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()  # run_workers shuts down its driver; this covers a failure before that
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.postgres
def test_trials_run_on_more_than_one_ray_node(ray_cluster, pg_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = prepare_settings("clu", "200K", n_trials=6, data=TINY_DATA, quick=True, pruner="none", seed=0)
    launch(pg_url, settings)
    name = settings.study_name
    worker_nodes = {n.node_id for n in ray_cluster.worker_nodes}
    assert len(worker_nodes) == 2 and ray_cluster.head_node.node_id not in worker_nodes

    statuses = run_workers(pg_url, [name], RunOptions(workers=2, ray_address=ray_cluster.address,
                                                      refresh_s=0.5, progress=lambda: export_studies(
                                                          open_storage(pg_url), [name], tmp_path / "out")))

    st = statuses[name]
    assert st.total == len(settings.plan) == 6
    assert st.done and st.final == st.total and st.running == 0 and st.waiting == 0, st
    trials = optuna.load_study(study_name=name, storage=pg_url).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    assert len(finished) >= 6 and not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for t in finished:
        attrs = t.user_attrs
        assert attrs.get("ray_node_id") and attrs.get("host") and attrs.get("device") == "cpu", (t.number, attrs)
    used = {t.user_attrs["ray_node_id"] for t in finished}
    assert used <= worker_nodes, "trials ran only where the CPUs are, never on the CPU-less head"
    assert len(used) >= 2, f"all trials ran on one node: {used}"
    assert (tmp_path / "out" / "experiment_results.csv").exists()


# ----------------------------------------------------------------------------- --gpus-per-trial auto
def test_gpus_per_trial_auto_scales_with_the_architecture(tmp_path: Path) -> None:
    """Placement packs fewer trials on a GPU as the planned architectures grow (one sizing:
    workers._memory, the same the workers' own fit check uses)."""
    from archhpo.cluster._run import MAX_TRIALS_PER_GPU, _trials_per_gpu, largest_trial_bytes

    url = f"sqlite:///{tmp_path / 'gpu.db'}"
    budgets = ["2M", "20M", "200M", "2B"]
    queues = {}
    for b in budgets:  # the full (not quick) search space: the real batch sizes
        s = prepare_settings("gpu", b, n_trials=10, seed=0)
        launch(url, s)
        queues[b] = TrialQueue(url, s.study_name)
    need = {b: largest_trial_bytes([queues[b]]) for b in budgets}
    assert [need[b] for b in budgets] == sorted(need.values())
    assert largest_trial_bytes(list(queues.values())) == need["2B"]  # several studies: the largest
    for gpu in (8 * GiB, 40 * GiB, 80 * GiB, 141 * GiB):
        fits = [_trials_per_gpu(need[b], gpu)[0] for b in budgets]
        assert fits == sorted(fits, reverse=True), f"a bigger budget never packs more: {fits}"
    # A 2B trial (~30 GiB of weights + AdamW state before activations) never shares a GPU.
    assert _trials_per_gpu(need["2B"], 80 * GiB)[0] == 1
    assert _trials_per_gpu(need["2M"], 80 * GiB)[0] == MAX_TRIALS_PER_GPU
    stand_in = SimpleNamespace(settings=queues["20M"].settings)  # the same .settings, the same answer
    assert largest_trial_bytes([stand_in]) == need["20M"]  # type: ignore[list-item]


@pytest.mark.parametrize("value", ["lots", "-0.5", "nan", "9"])
def test_cli_rejects_bad_gpus_per_trial(value: str, tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    res = run_cli("run", "--experiment", "g", "--budget", "200K", "--trials", "2", "--quick", "--data", TINY_DATA,
                  "--storage", f"sqlite:///{db}", "--gpus-per-trial", value, "--out", str(tmp_path / "o"),
                  cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("archhpo: error: --gpus-per-trial"), res.stderr
    assert "Traceback" not in res.stderr and value in lines[0]
    assert "0.25" in lines[0] or "between 0" in lines[0], "the sentence says what is accepted"
    assert not db.exists(), "a rejected command writes no study"
