"""docker-compose.yml, Dockerfile, .env.example, .dockerignore (SPEC §9, issue 3 items 2 and 7).

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

REPO = Path(__file__).resolve().parents[1]
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
    assert as_argv(dash["command"])[:1] == ["dashboard"]
    assert [ip for ip, _ in published_ports(dash)] == ["127.0.0.1"]


# ----------------------------------------------------------------------------- secrets
def test_database_url_has_no_password_and_password_comes_from_env_file(compose):
    for name in DB_SERVICES:
        env = environment(compose["services"][name])
        url = env["ARCHHPO_STORAGE"]
        assert re.fullmatch(r"postgresql\+psycopg2://archhpo@postgres:5432/archhpo", url), url
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
    assert ins[0] == ("FROM", "python:3.11-slim")
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


def _dependency_step() -> str:
    steps = [a for w, a in dockerfile_instructions() if w == "RUN" and "TORCH_INDEX_URL" in a]
    assert len(steps) == 1
    return steps[0]


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_dockerfile_torch_index_build_arg(index, tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    req = tmp_path / "requirements.txt"
    step = _dependency_step().replace("/tmp/requirements.txt", str(req))
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    py.symlink_to(sys.executable)
    calls = run_logged(["sh", "-c", step], tmp_path, ("pip",), env={"TORCH_INDEX_URL": index}, cwd=tmp_path)
    if index:
        assert calls[0][:3] == ["pip", "install", "--index-url"] and calls[0][3] == index
        assert re.fullmatch(r"torch[<>=!~].*", calls[0][4]), calls[0]
        assert calls[1][:2] == ["pip", "install"]
    else:
        assert len(calls) == 1 and "--index-url" not in calls[0]
    assert calls[-1][1:3] == ["install", "-r"]
