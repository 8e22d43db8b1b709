"""docker-compose.yml, Dockerfile, .env.example, .dockerignore (docs/design.md §9).

No Docker engine is needed: the compose file is parsed with yaml.safe_load after the same
`${VAR...}` interpolation Compose does, and the shell snippets the containers run (driver
entrypoint, worker command, the Dockerfile's dependency step) are run with `sh` against stub
`ray`/`archhpo`/`pip` commands that record their arguments.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERIGNORE = REPO / ".dockerignore"
GITIGNORE = REPO / ".gitignore"

SERVICES = {"postgres", "ray-head", "ray-worker", "dashboard", "driver"}
RAY_SERVICES = ("ray-head", "ray-worker", "ray-worker-gpu", "driver")
DB_SERVICES = ("ray-worker", "ray-worker-gpu", "dashboard", "driver")
LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}
SECRET_VARS = ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN")
# The only places a secret may reach: the environment entries that carry it.
SECRET_KEYS = {"POSTGRES_PASSWORD", "PGPASSWORD", "RAY_AUTH_TOKEN"}
PLACEHOLDERS = {"", "change-me", "changeme", "change_me", "replace-me", "<password>", "<token>", "..."}
CANARY = "CanaryS3cretQ7x"


# ----------------------------------------------------------------------------- helpers
_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$", re.S)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR?e},
    ${VAR:+a}, ${VAR+a}. A required variable that is missing raises KeyError, as compose refuses."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group("plain"):
            return env.get(m.group("plain"), "")
        b = _BRACED.match(m.group("braced"))
        assert b, f"unparsable interpolation {m.group(0)!r}"
        name, op, arg = b.group("name"), b.group("op"), b.group("arg") or ""
        val = env.get(name)
        set_, nonempty = val is not None, bool(val)
        if op is None:
            return val or ""
        if op in (":-", "-"):
            return val if (nonempty if op == ":-" else set_) else interpolate(arg, env)
        if op in (":?", "?"):
            if not (nonempty if op == ":?" else set_):
                raise KeyError(f"{name}: {arg}")
            return val
        return interpolate(arg, env) if (nonempty if op == ":+" else set_) else ""

    return _VAR.sub(sub, text)


def secrets_env(**extra: str) -> dict[str, str]:
    return {"POSTGRES_PASSWORD": CANARY, "RAY_AUTH_TOKEN": CANARY + "tok", **extra}


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return yaml.safe_load(interpolate(COMPOSE.read_text(), secrets_env() if env is None else env))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {k: ("" if v is None else str(v)) for k, v in env.items()}


def as_argv(value: Any) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def published_ports(service: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(host_ip, published) for every port the service publishes on the host."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):  # long syntax
            if p.get("published") is not None or "host_ip" in p:
                out.append((p.get("host_ip"), str(p.get("published", ""))))
            else:
                out.append((None, str(p.get("target"))))  # a random host port on every interface
            continue
        spec = str(p).split("/")[0]
        m = re.match(r"^(?:(?P<ip>\[[^\]]+\]|[^:\[\]]+):)?(?:(?P<host>[^:]*):)?(?P<container>[^:]+)$", spec)
        assert m, f"unparsable port {p!r}"
        ip = m.group("ip")
        if ip is not None and m.group("host") is None:
            # "8080:80" parsed as ip=8080: two fields mean HOST:CONTAINER, no address
            ip, host = None, ip
        else:
            host = m.group("host") if m.group("host") is not None else m.group("container")
        out.append((ip, host))
    return out


def bin_dir(tmp_path: Path, log: Path, names: tuple[str, ...]) -> Path:
    """Stub commands that append their argv (one line, fields ended by \\x1f) to log and succeed."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name in names:
        f = d / name
        f.write_text(f"#!/bin/sh\nprintf '%s\\037' {name} \"$@\" >> '{log}'\necho >> '{log}'\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return d


def run_logged(argv: list[str], tmp_path: Path, stubs: tuple[str, ...], env: dict[str, str] | None = None,
               cwd: Path | None = None) -> list[list[str]]:
    log = tmp_path / "calls.log"
    log.write_text("")
    path = f"{bin_dir(tmp_path, log, stubs)}{os.pathsep}{os.environ.get('PATH', '')}"
    res = subprocess.run(argv, env={**os.environ, **(env or {}), "PATH": path}, cwd=cwd,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = []
    for line in log.read_text().splitlines():
        calls.append(line.split("\x1f")[:-1])
    return calls


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def env_example() -> dict[str, str]:
    pairs = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, val = line.partition("=")
            assert sep, f".env.example line is not KEY=VALUE: {line!r}"
            pairs[key.strip()] = val.strip().strip("'\"")
    return pairs


# ----------------------------------------------------------------------------- services
def test_compose_defines_the_stack_services(compose):
    assert SERVICES <= set(compose["services"])
    for name in ("ray-head", "ray-worker", "dashboard", "driver"):
        svc = compose["services"][name]
        assert "build" in svc and svc.get("image"), f"{name} must run the image built from this repository"
    images = {compose["services"][n]["image"] for n in ("ray-head", "ray-worker", "dashboard", "driver")}
    assert len(images) == 1, f"all archhpo services must share one image, got {images}"


def test_postgres_is_healthchecked_and_keeps_data_in_a_named_volume(compose):
    pg = compose["services"]["postgres"]
    assert "pg_isready" in " ".join(as_argv(pg["healthcheck"]["test"]))
    named = [str(v).split(":", 1)[0] for v in pg["volumes"] if not str(v).startswith((".", "/", "~"))]
    assert named and all(v in (compose.get("volumes") or {}) for v in named)
    assert any(str(v).endswith(":/var/lib/postgresql/data") for v in pg["volumes"])


def test_services_wait_for_healthy_dependencies(compose):
    for name in ("ray-worker", "dashboard", "driver"):
        deps = compose["services"][name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy", name
    for name in ("ray-worker", "driver"):
        assert compose["services"][name]["depends_on"]["ray-head"]["condition"] == "service_healthy"
    assert compose["services"]["ray-head"]["healthcheck"]["test"]


# ----------------------------------------------------------------------------- exposure
def test_every_published_port_binds_loopback_only(compose):
    seen = 0
    for name, svc in compose["services"].items():
        for ip, host_port in published_ports(svc):
            seen += 1
            assert ip in LOOPBACK, f"{name} publishes {host_port} on {ip or 'every interface'}"
    assert seen >= 2  # postgres and the dashboard


def test_port_parser_rejects_non_loopback_forms():
    svc = {"ports": ["8080", "8080:80", "0.0.0.0:5432:5432", "127.0.0.1:5432:5432/tcp", "[::1]:80:80",
                     {"target": 80, "published": 8080}, {"target": 80, "published": 80, "host_ip": "127.0.0.1"}]}
    assert published_ports(svc) == [(None, "8080"), (None, "8080"), ("0.0.0.0", "5432"), ("127.0.0.1", "5432"),
                                    ("[::1]", "80"), (None, "8080"), ("127.0.0.1", "80")]


def test_no_service_shares_the_host_network(compose):
    for name, svc in compose["services"].items():
        assert svc.get("network_mode") not in ("host",), f"{name} would expose Ray/PG ports on every interface"


def test_ray_ports_stay_private_and_need_the_cluster_token(compose):
    for name in RAY_SERVICES:
        svc = compose["services"][name]
        assert not svc.get("ports"), f"{name} must not publish Ray's ports"
        env = environment(svc)
        assert env.get("RAY_AUTH_MODE") == "token", name
        assert env.get("RAY_AUTH_TOKEN") == CANARY + "tok", name
        assert env.get("RAY_USAGE_STATS_ENABLED") == "0", name


def test_dashboards_listen_on_loopback_by_default(compose):
    head = as_argv(compose["services"]["ray-head"]["command"])
    assert "--dashboard-host=127.0.0.1" in head
    dash = compose["services"]["dashboard"]
    assert as_argv(dash["entrypoint"])[:2] == ["python", "-c"], "the dashboard's wait-for-a-study entrypoint"
    assert "--host" in as_argv(dash["command"])
    assert [ip for ip, _ in published_ports(dash)] == ["127.0.0.1"]


# ----------------------------------------------------------------------------- the dashboard
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dashboard_argv(svc: dict[str, Any], *args: str) -> list[str]:
    """The dashboard's entrypoint, run by this interpreter (the image's `python`)."""
    entry = as_argv(svc["entrypoint"])
    return [sys.executable, *entry[1:], *args]


def _healthcheck_argv(svc: dict[str, Any]) -> list[str]:
    test = as_argv(svc["healthcheck"]["test"])
    assert test[:2] == ["CMD", "python"], test
    return [sys.executable, *test[2:]]


def test_dashboard_healthcheck_asks_the_port_it_serves(compose):
    dash = compose["services"]["dashboard"]
    cmd = as_argv(dash["command"])
    port = cmd[cmd.index("--port") + 1]
    assert any(a.endswith(f"127.0.0.1:{port}/api/studies") for a in _healthcheck_argv(dash))
    assert any(p.endswith(f":{port}") for p in dash["ports"]), "the published port is the one served"
    over = yaml.load(interpolate(LOOPBACK_OVERRIDE.read_text(), secrets_env(SMOKE_DASHBOARD_PORT="18999")),
                     Loader=_ResetLoader)["services"]["dashboard"]
    cmd = as_argv(over["command"])
    assert cmd[cmd.index("--port") + 1] == "18999"
    assert _healthcheck_argv(over)[-1] == "http://127.0.0.1:18999/api/studies"


def test_dashboard_becomes_archhpo_dashboard_with_its_arguments(compose, tmp_path):
    """Where no PostgreSQL study database is to wait for, it is `archhpo dashboard` at once."""
    dash = compose["services"]["dashboard"]
    calls = run_logged(_dashboard_argv(dash, *as_argv(dash["command"])), tmp_path, ("archhpo",),
                       env={"ARCHHPO_STORAGE": f"sqlite:///{tmp_path}/x.db"})
    assert calls == [["archhpo", "dashboard", *as_argv(dash["command"])]]


def test_dashboard_reports_a_database_it_cannot_read_as_unhealthy(compose, tmp_path):
    """Nothing listens on the database port: the placeholder page answers 503, so the
    healthcheck fails (and the container is not restarted in a loop meanwhile)."""
    pytest.importorskip("psycopg2")
    import time
    import urllib.error
    import urllib.request

    dash = compose["services"]["dashboard"]
    port = _free_port()
    env = {**os.environ, "ARCHHPO_STORAGE": f"postgresql://archhpo@127.0.0.1:{_free_port()}/archhpo"}
    proc = subprocess.Popen(_dashboard_argv(dash, "--host", "127.0.0.1", "--port", str(port)), env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        code = None
        for _ in range(100):
            try:
                code = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).status
            except urllib.error.HTTPError as exc:
                code = exc.code
            except OSError:
                time.sleep(0.2)
                continue
            break
        assert code == 503
        health = _healthcheck_argv(dash)
        health[-1] = f"http://127.0.0.1:{port}/api/studies"
        assert subprocess.run(health, capture_output=True, timeout=30).returncode != 0
        assert proc.poll() is None, "the entrypoint must keep waiting, not exit"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "cannot read the database" in err and CANARY not in err


# ----------------------------------------------------------------------------- secrets
def test_database_url_has_no_password_and_password_comes_from_env_file(compose):
    for name in DB_SERVICES:
        env = environment(compose["services"][name])
        url = env["ARCHHPO_STORAGE"]
        assert re.fullmatch(r"postgresql://archhpo@postgres:5432/archhpo", url), url
        assert env["PGPASSWORD"] == CANARY, f"{name}: PGPASSWORD must come from POSTGRES_PASSWORD in .env"
    pg = environment(compose["services"]["postgres"])
    assert pg["POSTGRES_PASSWORD"] == CANARY and pg["POSTGRES_USER"] == "archhpo" and pg["POSTGRES_DB"] == "archhpo"


def test_canary_secrets_reach_only_their_environment_entries():
    tree = load_compose()
    leaks: list[str] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, str(k)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, str(i)))
        elif CANARY in str(node):
            ok = len(path) == 4 and path[0] == "services" and path[2] == "environment" and path[3] in SECRET_KEYS
            if not ok and path[0].startswith("x-") and path[-1] in SECRET_KEYS:
                ok = True  # the shared anchor the services merge
            if not ok:
                leaks.append(".".join(path))

    walk(tree, ())
    assert not leaks, f"the password/token would appear in {leaks} (URLs, commands, labels are logged)"


def test_compose_refuses_to_start_without_the_secrets():
    for missing in SECRET_VARS:
        env = secrets_env()
        env[missing] = ""
        with pytest.raises(KeyError, match=missing):
            load_compose(env)


_ASSIGN = re.compile(r"(?i)\b(?P<key>\w*(?:password|passwd|secret|token)\w*)[ \t]*[:=][ \t]*(?P<val>[^\s#,]*)")
_URL_CREDS = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]*@", re.I)


@pytest.mark.parametrize("path", [COMPOSE, DOCKERFILE, DOCKERIGNORE, ENV_EXAMPLE], ids=lambda p: p.name)
def test_no_literal_secret_is_committed(path):
    text = path.read_text()
    assert not _URL_CREDS.search(text), f"{path.name} has a URL with user:password@"
    for m in _ASSIGN.finditer(text):
        val = m.group("val").strip("'\"")
        assert val == "" or val.startswith("$") or val.lower() in PLACEHOLDERS, (
            f"{path.name}: {m.group('key')} is given the literal value {val!r}")


def test_secret_scanner_catches_literals():
    for bad in ("POSTGRES_PASSWORD=hunter2", "PGPASSWORD: s3cr3t", "password=abc"):
        m = _ASSIGN.search(bad)
        assert m and m.group("val") and not m.group("val").startswith("$")
    assert _URL_CREDS.search("postgresql+psycopg2://archhpo:pw@postgres:5432/archhpo")
    assert not _URL_CREDS.search("postgresql+psycopg2://archhpo@postgres:5432/archhpo")


def test_dockerfile_bakes_in_no_secret():
    for word, args in dockerfile_instructions():
        if word in ("ARG", "ENV", "LABEL"):
            assert not re.search(r"(?i)password|passwd|secret|token|PGPASS", args), f"{word} {args}"


def test_env_file_is_never_committed_nor_sent_to_docker():
    gitignore = [ln.strip() for ln in GITIGNORE.read_text().splitlines()]
    assert ".env" in gitignore or "/.env" in gitignore
    dockerignore = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()]
    assert ".env" in dockerignore and ".git" in dockerignore
    if shutil.which("git") and (REPO / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "--", ".env"], cwd=REPO, capture_output=True, text=True)
        assert tracked.stdout.strip() == "", ".env is tracked by git"


def test_env_example_holds_only_placeholders_for_every_required_variable():
    pairs = env_example()
    required = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?", COMPOSE.read_text()))
    assert set(SECRET_VARS) <= required, "compose must demand the secrets"
    missing = required - set(pairs)
    assert not missing, f".env.example does not mention {missing}"
    for key in required:
        assert pairs[key].lower() in PLACEHOLDERS, f".env.example has a real-looking value for {key}"
    # The example itself, copied unedited, must not start a stack with a known password.
    with pytest.raises(KeyError):
        load_compose({k: v for k, v in pairs.items()})


# ----------------------------------------------------------------------------- Ray
def test_ray_worker_can_scale(compose):
    worker = compose["services"]["ray-worker"]
    assert "container_name" not in worker and "hostname" not in worker
    assert not worker.get("ports")
    assert not worker.get("profiles"), "ray-worker must start with a plain `docker compose up`"


def test_gpu_reservation_is_available_but_optional(compose):
    def gpu_devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
        devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        return [d for d in devices or [] if "gpu" in (d.get("capabilities") or [])]

    override = REPO / "docker-compose.gpu.yml"
    gpu = {n: s for n, s in compose["services"].items() if gpu_devices(s)}
    if override.exists():
        extra = yaml.safe_load(interpolate(override.read_text(), secrets_env()))
        gpu.update({n: s for n, s in extra["services"].items() if gpu_devices(s)})
    assert gpu, "no service reserves a GPU"
    for name, svc in gpu.items():
        dev = gpu_devices(svc)[0]
        assert dev["driver"] == "nvidia" and (dev.get("count") == "all" or dev.get("device_ids"))
        if name in compose["services"]:
            # in the base file only behind a profile, so CPU-only hosts still start
            assert "gpu" in (compose["services"][name].get("profiles") or []), name
            assert "container_name" not in svc
            assert as_argv(svc["command"]) == as_argv(compose["services"]["ray-worker"]["command"])


def test_ray_head_avoids_redis_port_6379(compose):
    head = as_argv(compose["services"]["ray-head"]["command"])
    assert "--head" in head and "--port=6380" in head
    assert "127.0.0.1:6380" in compose["services"]["ray-head"]["healthcheck"]["test"]
    for name in RAY_SERVICES:
        svc = compose["services"][name]
        text = " ".join(as_argv(svc.get("entrypoint")) + as_argv(svc.get("command")))
        assert "6379" not in text, name
        ports = re.findall(r"(?:ray-head:|--port=|--address=[\w.-]+:)(\d+)", text)
        assert ports and set(ports) == {"6380"}, f"{name} uses Ray ports {ports}"


def test_ray_worker_joins_the_head(compose, tmp_path):
    svc = compose["services"]["ray-worker"]
    argv = as_argv(svc["entrypoint"]) + as_argv(svc["command"])
    calls = run_logged(argv, tmp_path, ("ray",), env={"RAY_WORKER_CPUS": ""})
    assert calls == [["ray", "start", "--address=ray-head:6380", "--disable-usage-stats", "--block"]]
    calls = run_logged(argv, tmp_path, ("ray",), env={"RAY_WORKER_CPUS": "4"})
    assert "--num-cpus=4" in calls[0]


def _driver_argv(compose: dict[str, Any], *args: str) -> list[str]:
    svc = compose["services"]["driver"]
    return as_argv(svc["entrypoint"]) + list(args)


def test_driver_is_opt_in_and_joins_the_cluster_for_run(compose, tmp_path):
    assert compose["services"]["driver"]["profiles"] == ["driver"]
    argv = _driver_argv(compose, "run", "--experiment", "x", "--budget", "2M")
    calls = run_logged(argv, tmp_path, ("ray", "archhpo"))
    assert calls[0][:3] == ["ray", "start", "--address=ray-head:6380"] and "--num-cpus=0" in calls[0]
    assert calls[1] == ["archhpo", "run", "--experiment", "x", "--budget", "2M", "--ray-address", "ray-head:6380"]


def test_driver_keeps_an_explicit_ray_address(compose, tmp_path):
    argv = _driver_argv(compose, "run", "--experiment", "x", "--budget", "2M", "--ray-address", "ray-head:6380")
    calls = run_logged(argv, tmp_path, ("ray", "archhpo"))
    assert calls[1].count("--ray-address") == 1


def test_driver_runs_other_commands_without_ray(compose, tmp_path):
    calls = run_logged(_driver_argv(compose, "export", "--experiment", "x"), tmp_path, ("ray", "archhpo"))
    assert calls == [["archhpo", "export", "--experiment", "x"]]


def test_driver_writes_results_to_a_bind_mount(compose):
    vols = [str(v) for v in compose["services"]["driver"]["volumes"]]
    assert any(v.startswith("./results:") for v in vols)


# ----------------------------------------------------------------------------- Dockerfile
def test_dockerfile_installs_the_repo_and_disables_ray_usage_stats():
    ins = dockerfile_instructions()
    assert ins[0] == ("ARG", "BASE_IMAGE=python:3.11-slim"), "the default base stays the public Python image"
    runs = [a for w, a in ins if w == "RUN"]
    assert any(re.search(r"\bpip install (?:[^&|;]*\s)?\.(?:\s|$)", r) for r in runs), "no `pip install .`"
    env = {}
    for w, a in ins:
        if w == "ENV":
            env.update(dict(tok.split("=", 1) for tok in shlex.split(a)))
    assert env.get("RAY_USAGE_STATS_ENABLED") == "0" and env.get("PYTHONUNBUFFERED") == "1"
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert [a for w, a in ins if w == "ENTRYPOINT"][-1] == '["archhpo"]'
    assert ("ARG", 'TORCH_INDEX_URL=""') in ins or ("ARG", "TORCH_INDEX_URL=") in ins


def _run_flags(args: str) -> tuple[list[str], str]:
    """RUN's own flags (--mount=...) and the shell command after them."""
    flags = []
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        flags.append(flag)
        args = args.lstrip()
    return flags, args


def _dependency_step() -> tuple[list[str], str]:
    steps = [a for w, a in dockerfile_instructions() if w == "RUN" and "TORCH_INDEX_URL" in a]
    assert len(steps) == 1
    return _run_flags(steps[0])


def _run_dependency_step(tmp_path: Path, index: str, wheels: tuple[str, ...] = ()) -> list[list[str]]:
    """The dependency step under sh with a stub pip, the wheelhouse mount replaced by a folder."""
    flags, step = _dependency_step()
    mount = next(f for f in flags if f.startswith("--mount=") and "source=wheelhouse" in f)
    target = dict(kv.split("=", 1) for kv in mount[len("--mount="):].split(","))["target"]
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for name in wheels:
        (house / name).write_bytes(b"")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    step = step.replace("/tmp/requirements.txt", str(tmp_path / "requirements.txt")).replace(target, str(house))
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    py.symlink_to(sys.executable)
    return run_logged(["sh", "-c", step], tmp_path, ("pip",), env={"TORCH_INDEX_URL": index}, cwd=tmp_path)


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_dockerfile_torch_index_build_arg(index, tmp_path):
    calls = _run_dependency_step(tmp_path, index, wheels=("README.md",))  # no *.whl: the index is used
    if index:
        assert calls[0][:3] == ["pip", "install", "--index-url"] and calls[0][3] == index
        assert re.fullmatch(r"torch[<>=!~].*", calls[0][4]), calls[0]
        assert calls[1][:2] == ["pip", "install"]
    else:
        assert len(calls) == 1 and "--index-url" not in calls[0]
    assert calls[-1][:2] == ["pip", "install"] and "-r" in calls[-1] and "--no-index" not in calls[-1]


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_dockerfile_installs_only_from_a_filled_wheelhouse(index, tmp_path):
    calls = _run_dependency_step(tmp_path, index, wheels=("torch-2.13.0-cp311-cp311-linux_x86_64.whl",))
    assert len(calls) == 1, "with wheels in ./wheelhouse no index may be asked, not even TORCH_INDEX_URL's"
    argv = calls[0]
    assert argv[:4] == ["pip", "install", "--no-index", "--find-links"]
    assert argv[4] == str(tmp_path / "wheelhouse") and "-r" in argv and "--index-url" not in argv


def test_dockerfile_base_image_is_a_build_argument_of_every_stage():
    ins = dockerfile_instructions()
    froms = [a for w, a in ins if w == "FROM"]
    assert len(froms) == 2, froms
    assert froms[0] == "${BASE_IMAGE} AS build" and froms[1] == "${BASE_IMAGE}", froms
    # the runtime stage gets the venv from the build stage, never the wheels or the source
    copies = [a for w, a in ins[ins.index(("FROM", froms[1])):] if w in ("COPY", "ADD")]
    assert copies == ["--from=build /opt/venv /opt/venv"], copies


def test_dockerfile_bind_mounts_the_wheelhouse_so_no_wheel_lands_in_a_layer():
    ins = dockerfile_instructions()
    assert not [a for w, a in ins if w in ("COPY", "ADD") and "wheelhouse" in a]
    flags, _ = _dependency_step()
    assert any("type=bind" in f and "source=wheelhouse" in f for f in flags), flags
    # and the build context keeps the folder (tracked README, git-ignored wheels)
    assert "wheelhouse" not in [ln.strip().strip("/") for ln in DOCKERIGNORE.read_text().splitlines()]
    assert (REPO / "wheelhouse" / "README.md").is_file()


def test_wheels_stay_out_of_git():
    if not (shutil.which("git") and (REPO / ".git").exists()):
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "wheelhouse/torch-2.13.0-cp311-cp311-linux_x86_64.whl"],
                             cwd=REPO)
    assert ignored.returncode == 0, "wheelhouse/*.whl must be git-ignored"
    kept = subprocess.run(["git", "check-ignore", "-q", "wheelhouse/README.md"], cwd=REPO)
    assert kept.returncode == 1, "wheelhouse/README.md must stay tracked"


# ----------------------------------------------------------------------------- registry-free images
def test_compose_takes_the_postgres_and_base_images_as_variables():
    default = load_compose()
    assert default["services"]["postgres"]["image"] == "postgres:16"
    assert default["services"]["ray-head"]["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim"
    local = load_compose(secrets_env(POSTGRES_IMAGE="local/postgres:bookworm", BASE_IMAGE="local/debian:bookworm"))
    assert local["services"]["postgres"]["image"] == "local/postgres:bookworm"
    for name in ("ray-head", "ray-worker", "dashboard", "driver"):
        assert local["services"][name]["build"]["args"]["BASE_IMAGE"] == "local/debian:bookworm", name


def test_worker_and_driver_pass_extra_ray_node_flags(compose, tmp_path):
    flags = "--node-ip-address=127.0.0.1 --min-worker-port=0"
    worker = compose["services"]["ray-worker"]
    calls = run_logged(as_argv(worker["entrypoint"]) + as_argv(worker["command"]), tmp_path, ("ray",),
                       env={"RAY_WORKER_CPUS": "", "RAY_NODE_ARGS": flags})
    assert calls == [["ray", "start", "--address=ray-head:6380", *flags.split(), "--disable-usage-stats", "--block"]]
    calls = run_logged(_driver_argv(compose, "run", "--experiment", "x"), tmp_path, ("ray", "archhpo"),
                       env={"RAY_NODE_ARGS": flags})
    assert calls[0][:3] == ["ray", "start", "--address=ray-head:6380"] and set(flags.split()) <= set(calls[0])
    for name in ("ray-worker", "ray-worker-gpu"):
        assert "RAY_NODE_ARGS" in environment(compose["services"][name]), name


PG_DIR = REPO / "docker" / "postgres"


def _postgres_entrypoint(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess,
                                                                                     list[list[str]], Path]:
    """docker/postgres/entrypoint.sh with stub initdb/postgres that log their argv (and stdin)."""
    log = tmp_path / "calls.log"
    log.write_text("")
    stubs = bin_dir(tmp_path, log, ("initdb", "postgres"))
    # initdb's stub also keeps what its --pwfile held, so the test sees where the password went
    (stubs / "initdb").write_text(
        f"#!/bin/sh\nprintf '%s\\037' initdb \"$@\" >> '{log}'\necho >> '{log}'\n"
        "for a in \"$@\"; do case $a in --pwfile=*) cp \"${a#--pwfile=}\" "
        f"'{tmp_path}/pwfile.seen';; esac; done\nmkdir -p \"$PGDATA\"; touch \"$PGDATA/pg_hba.conf\" "
        "\"$PGDATA/postgresql.conf\"\n")
    (stubs / "postgres").write_text(
        f"#!/bin/sh\nprintf '%s\\037' postgres \"$@\" >> '{log}'\necho >> '{log}'\n"
        f"case \" $* \" in *\" --single \"*) cat > '{tmp_path}/single.sql';; esac\n")
    pgdata = tmp_path / "data"
    full_env = {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "PGDATA": str(pgdata),
                "TMPDIR": str(tmp_path), **env}
    res = subprocess.run(["sh", str(PG_DIR / "entrypoint.sh"), *args], env=full_env, capture_output=True,
                         text=True, timeout=60)
    calls = [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]
    return res, calls, pgdata


PG_ENV = {"POSTGRES_USER": "archhpo", "POSTGRES_DB": "archhpo", "POSTGRES_PASSWORD": CANARY}


def test_debian_postgres_image_initialises_from_the_compose_environment(compose, tmp_path):
    cmd = as_argv(compose["services"]["postgres"]["command"])
    res, calls, pgdata = _postgres_entrypoint(tmp_path, PG_ENV, *cmd)
    assert res.returncode == 0, res.stderr
    initdb, single, server = calls
    assert initdb[0] == "initdb" and "--username=archhpo" in initdb and "--auth-host=scram-sha-256" in initdb
    assert (tmp_path / "pwfile.seen").read_text() == CANARY + "\n"
    assert not list(tmp_path.glob("tmp.*")), "the password file must be removed"
    assert single == ["postgres", "--single", "-D", str(pgdata), "-j", "postgres"]
    assert (tmp_path / "single.sql").read_text() == 'CREATE DATABASE "archhpo";\n'
    # the compose command's -c options reach the server, on the volume's data folder
    assert server == ["postgres", "-D", str(pgdata), *cmd[1:]]
    assert "host all all all scram-sha-256" in (pgdata / "pg_hba.conf").read_text()
    assert "listen_addresses = '*'" in (pgdata / "postgresql.conf").read_text()
    assert all(CANARY not in arg for call in calls for arg in call), "the password reached a command line"
    assert CANARY not in res.stdout + res.stderr


def test_debian_postgres_image_keeps_an_existing_cluster(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "PG_VERSION").write_text("15\n")
    res, calls, pgdata = _postgres_entrypoint(tmp_path, PG_ENV, "postgres", "-c", "port=5432")
    assert res.returncode == 0, res.stderr
    assert calls == [["postgres", "-D", str(pgdata), "-c", "port=5432"]]


def test_debian_postgres_image_refuses_an_empty_password(tmp_path):
    res, calls, pgdata = _postgres_entrypoint(tmp_path, {**PG_ENV, "POSTGRES_PASSWORD": ""}, "postgres")
    assert res.returncode == 1 and calls == [] and not pgdata.exists()
    assert "POSTGRES_PASSWORD is empty" in res.stderr


def test_debian_postgres_image_matches_the_compose_service(compose):
    text = (PG_DIR / "Dockerfile").read_text()
    assert re.search(r"(?m)^ARG BASE_IMAGE=", text) and re.search(r"(?m)^FROM \$\{BASE_IMAGE\}$", text)
    assert "apt-get install -y --no-install-recommends postgresql" in text
    pg = compose["services"]["postgres"]
    mount = next(str(v).split(":", 1)[1] for v in pg["volumes"] if str(v).startswith("pgdata:"))
    assert re.search(rf"(?m)^\s*PGDATA={re.escape(mount)}", text), "PGDATA must be the volume's mount point"
    assert re.search(rf"(?m)^VOLUME {re.escape(mount)}$", text)
    assert 'CMD ["postgres"]' in text and as_argv(pg["command"])[0] == "postgres"
    users = re.findall(r"(?m)^USER (\S+)", text)
    assert users == ["postgres"], "the server must not run as root"
    for word, args in ((ln.split(" ", 1) + [""])[:2] for ln in text.splitlines()):
        if word in ("ARG", "ENV", "LABEL"):
            assert not re.search(r"(?i)password|secret|token", args), f"{word} {args}"


# ----------------------------------------------------------------------------- the loopback override
LOOPBACK_OVERRIDE = REPO / "scripts" / "compose-loopback.yml"


class _ResetLoader(yaml.SafeLoader):
    """safe_load plus Compose's `!reset` tag (it empties the base file's value)."""


_ResetLoader.add_constructor("!reset", lambda loader, node: "!reset")


def test_loopback_override_keeps_every_service_and_address_on_loopback():
    base = load_compose()
    over = yaml.load(interpolate(LOOPBACK_OVERRIDE.read_text(), secrets_env()), Loader=_ResetLoader)
    assert SERVICES <= set(over["services"])
    for name, svc in over["services"].items():
        assert svc["network_mode"] == "host", name
        hosts = dict(h.split(":", 1) for h in svc["extra_hosts"])
        assert hosts == {"postgres": "127.0.0.1", "ray-head": "127.0.0.1"}, name
        if base["services"][name].get("ports"):
            assert svc.get("ports") == "!reset", f"{name} would publish ports next to the host network"
        for addr in re.findall(r"\b\d+\.\d+\.\d+\.\d+\b", yaml.safe_dump(svc)):
            assert addr.startswith("127."), f"{name} uses {addr}, outside the loopback range"
    head = as_argv(over["services"]["ray-head"]["command"])
    # Ray swaps 127.0.0.1 for the host's routable address; 127.0.0.2 stays
    node_ips = {a.split("=", 1)[1] for a in head if a.startswith("--node-ip-address=")}
    for name in ("ray-worker", "driver"):
        args = environment(over["services"][name])["RAY_NODE_ARGS"].split()
        node_ips |= {a.split("=", 1)[1] for a in args if a.startswith("--node-ip-address=")}
    assert node_ips == {"127.0.0.2"}
    assert "--port=6380" in head and "6379" not in " ".join(head)


def test_loopback_override_moves_postgres_off_the_hosts_port():
    over = yaml.load(interpolate(LOOPBACK_OVERRIDE.read_text(), secrets_env(SMOKE_PG_PORT="55999")),
                     Loader=_ResetLoader)
    pg = over["services"]["postgres"]
    assert "port=55999" in pg["command"] and "-p 55999" in " ".join(pg["healthcheck"]["test"])
    for name in ("ray-worker", "dashboard", "driver"):
        url = environment(over["services"][name])["ARCHHPO_STORAGE"]
        assert url == "postgresql://archhpo@postgres:55999/archhpo", name


# ----------------------------------------------------------------------------- the real stack
@pytest.mark.compose
def test_compose_smoke_script_runs_the_whole_stack():
    """scripts/compose_smoke.sh against a real Docker engine: minutes, so only on request."""
    if os.environ.get("ARCHHPO_COMPOSE") != "1":
        pytest.skip("set ARCHHPO_COMPOSE=1 (and DOCKER_HOST, BASE_IMAGE, POSTGRES_BASE_IMAGE as needed) to run "
                    "the compose smoke test against a Docker engine")
    res = subprocess.run(["bash", str(REPO / "scripts" / "compose_smoke.sh")], capture_output=True, text=True,
                         timeout=3600)
    print(res.stdout)  # the step timings and checks (shown with pytest -s)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "compose smoke: PASS" in res.stdout
