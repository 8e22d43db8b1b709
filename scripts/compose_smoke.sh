#!/usr/bin/env bash
# Smoke test of the whole compose stack on one machine (issue 19): builds the images, brings up
# PostgreSQL, a Ray head, two Ray workers and the dashboard, runs a small two-budget --quick
# study through the driver, kills a worker mid-study, checks results, dashboard, secrets and
# that the study survives `down` + `up`, then removes everything it created.
#
#   scripts/compose_smoke.sh
#
# Settings (environment):
#   DOCKER_HOST            the engine (default: Docker's own default socket)
#   BASE_IMAGE             base of the archhpo image (default python:3.11-slim)
#   POSTGRES_IMAGE         PostgreSQL image (default postgres:16); with POSTGRES_BASE_IMAGE set,
#                          Debian's PostgreSQL is built from docker/postgres on that base instead
#   POSTGRES_BASE_IMAGE    e.g. local/debian:bookworm (README "Air-gapped node")
#   SMOKE_KEEP_IMAGES=1    keep the images it built (a rerun then builds from cache)
#   SMOKE_PG_PORT, SMOKE_DASHBOARD_PORT, SMOKE_RAY_CLIENT_PORT   loopback ports (55432, 18080, 16381)
#   SMOKE_BUDGETS, SMOKE_TRIALS   the study (default "100K 200K", 4 trials per budget)
#
# Every container uses the host's network (scripts/compose-loopback.yml), so every connection
# goes to 127.0.0.1. Exit 0 and a final "compose smoke: PASS" line when every check passed.
# pipefail: a pipe fails when any of its commands does. So no pipe here ends in a reader that
# may quit before its input ends (head, grep -q/-m, sed q): the writer would die of SIGPIPE and
# fail the step at random (tests/test_scripts.py checks every such script for this).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
T0=$(date +%s)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/archhpo-smoke.XXXXXX")"
PROJECT="archhpo-smoke-$$"
IMAGE="archhpo:smoke-$$"
EXPERIMENT=smoke
read -r -a BUDGETS <<< "${SMOKE_BUDGETS:-100K 200K}"
TRIALS="${SMOKE_TRIALS:-4}"
BUILT_IMAGES=()

log() { printf '[%4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
fail() { log "FAIL: $*"; exit 1; }

compose() {
    "${COMPOSE[@]}" -p "$PROJECT" --project-directory "$WORK" \
        -f "$REPO/docker-compose.yml" -f "$REPO/scripts/compose-loopback.yml" "$@"
}

find_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE=(docker compose)
    elif [[ "$(docker-compose version 2>/dev/null || true)" =~ version\ v?2\. ]]; then
        COMPOSE=(docker-compose)
    else
        echo "Docker Compose v2 is needed (docker compose plugin, or docker-compose 2.x); install it and rerun." >&2
        exit 2
    fi
}

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local rc=$?
    set +e
    if [ "$rc" -ne 0 ] && [ -n "${COMPOSE:-}" ]; then
        compose logs --no-color --tail 40 > "$WORK.failure-logs.txt" 2>&1 \
            && log "last service logs: $WORK.failure-logs.txt"
    fi
    [ -n "${COMPOSE:-}" ] && compose --profile driver down -v --remove-orphans >/dev/null 2>&1
    if [ "${SMOKE_KEEP_IMAGES:-0}" != 1 ] && [ "${#BUILT_IMAGES[@]}" -gt 0 ]; then
        docker image rm "${BUILT_IMAGES[@]}" >/dev/null 2>&1
    fi
    # Files in results/ belong to the invoking user (that is checked), so plain rm works.
    rm -rf "$WORK"
    log "removed project $PROJECT, its volume and $WORK"
}

preflight() {
    command -v docker >/dev/null || { echo "docker is not installed: see README 'Docker on this machine'." >&2; exit 2; }
    docker info >/dev/null 2>&1 || { echo "No Docker engine at ${DOCKER_HOST:-the default socket}: start dockerd or set DOCKER_HOST." >&2; exit 2; }
    find_compose
    local port
    for port in "${SMOKE_PG_PORT:-55432}" "${SMOKE_DASHBOARD_PORT:-18080}" 6380 "${SMOKE_RAY_CLIENT_PORT:-16381}"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "Port $port on 127.0.0.1 is taken: free it or set the SMOKE_*_PORT variables." >&2
            exit 2
        fi
    done
}

# Fresh secrets for this run only: random, exported to compose, never written to disk.
make_secrets() {
    POSTGRES_PASSWORD="pw$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    RAY_AUTH_TOKEN="tok$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    export POSTGRES_PASSWORD RAY_AUTH_TOKEN
    ARCHHPO_UID="$(id -u)"
    ARCHHPO_GID="$(id -g)"
    export ARCHHPO_IMAGE="$IMAGE" ARCHHPO_UID ARCHHPO_GID RAY_WORKER_CPUS=1
    export SMOKE_PG_PORT="${SMOKE_PG_PORT:-55432}" SMOKE_DASHBOARD_PORT="${SMOKE_DASHBOARD_PORT:-18080}"
    export SMOKE_RAY_CLIENT_PORT="${SMOKE_RAY_CLIENT_PORT:-16381}"
    mkdir -p "$WORK/results" "$WORK/data"
}

build_images() {
    local t=$SECONDS
    docker build --network host -q --build-arg "BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}" \
        --build-arg "ARCHHPO_UID=$ARCHHPO_UID" --build-arg "ARCHHPO_GID=$ARCHHPO_GID" -t "$IMAGE" "$REPO" >/dev/null
    BUILT_IMAGES+=("$IMAGE")
    if [ -n "${POSTGRES_BASE_IMAGE:-}" ]; then
        export POSTGRES_IMAGE="archhpo-postgres:smoke-$$"
        docker build --network host -q --build-arg "BASE_IMAGE=$POSTGRES_BASE_IMAGE" \
            -t "$POSTGRES_IMAGE" "$REPO/docker/postgres" >/dev/null
        BUILT_IMAGES+=("$POSTGRES_IMAGE")
    fi
    log "built $IMAGE and ${POSTGRES_IMAGE:-postgres:16} in $(( SECONDS - t )) s"
    log "image sizes: $(docker image ls --format '{{.Repository}}:{{.Tag}}={{.Size}}' | grep -E "smoke-$$|^${POSTGRES_IMAGE:-postgres:16}=" | tr '\n' ' ')"
}

stack_up() {
    local t=$SECONDS
    compose up -d --no-build --wait --scale ray-worker=2 >/dev/null 2>&1 \
        || { compose ps -a; fail "the stack did not come up healthy"; }
    local state
    state="$(compose ps --format '{{.Service}}={{.Health}}' | sort | tr '\n' ' ')"
    case "$state" in *"dashboard=healthy"*"postgres=healthy"*"ray-head=healthy"*) ;; *) fail "unhealthy: $state" ;; esac
    log "stack up and healthy in $(( SECONDS - t )) s: $state"
}

psql_q() {
    compose exec -T postgres psql -q -A -t -U archhpo -d archhpo -p "$SMOKE_PG_PORT" -c "$1"
}

# Trials of this experiment in a state; the plan's studies are named EXPERIMENT_BUDGET.
count_trials() {
    psql_q "select count(*) from trials t join studies s using (study_id)
            where s.study_name like '${EXPERIMENT}\\_%' and t.state = '$1'"
}

# The driver runs the study in the background; once trials run on both workers, one worker
# container is killed. Its trial goes back to the queue (heartbeat grace) and Ray restarts
# the task elsewhere.
run_study_killing_a_worker() {
    local t=$SECONDS budgets=() b
    for b in "${BUDGETS[@]}"; do budgets+=(--budget "$b"); done
    # No --rm: removing a container's copy of the image is slow on vfs; `down` does it at the end.
    compose --profile driver run -T driver run --experiment "$EXPERIMENT" "${budgets[@]}" \
        --trials "$TRIALS" --quick --workers 2 > "$WORK/driver.log" 2>&1 &
    local driver=$! waited=0
    until [ "$(count_trials RUNNING 2>/dev/null || echo 0)" -ge 2 ]; do
        kill -0 "$driver" 2>/dev/null || { cat "$WORK/driver.log"; fail "the study ended before two trials ran at once"; }
        sleep 2; waited=$((waited + 2))
        [ "$waited" -lt 600 ] || fail "no two trials running after 600 s"
    done
    local workers victim
    workers="$(compose ps -q ray-worker)"
    victim="${workers%%$'\n'*}"
    [ -n "$victim" ] || fail "no ray-worker container to kill"
    docker kill "$victim" >/dev/null
    log "two trials running: killed worker container ${victim:0:12} ($(count_trials COMPLETE) trials complete so far)"
    wait "$driver" || { cat "$WORK/driver.log"; fail "the driver failed"; }
    log "study finished in $(( SECONDS - t )) s; driver summary:"
    sed -n '/complete, .* pruned/s/^/    /p' "$WORK/driver.log"
}

# Every planned slot of every budget finished exactly once (COMPLETE or PRUNED), in the CSV
# and in the database, and the trials ran on at least two Ray nodes.
check_results() {
    local csv="$WORK/results/experiment_results.csv" f
    [ -s "$csv" ] || fail "no $csv"
    for b in "${BUDGETS[@]}"; do
        f="$WORK/results/${EXPERIMENT}_${b}_best.json"
        [ -s "$f" ] || fail "no best JSON $f"
        grep -q '"best_value"' "$f" || fail "$f has no best_value"
    done
    for f in "$csv" "$WORK/results/"*_best.json; do
        [ "$(stat -c %u "$f")" = "$(id -u)" ] || fail "$f is owned by uid $(stat -c %u "$f"), not $(id -u)"
    done
    python3 - "$csv" "$TRIALS" "${BUDGETS[@]}" <<'PY' || fail "the plan did not finish exactly once"
import collections, csv, sys
path, trials, budgets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = [r for r in csv.DictReader(open(path)) if r["state"] in ("COMPLETE", "PRUNED")]
slots = collections.Counter((r["budget"], r["plan_slot"]) for r in rows)
want = {(b, str(i)) for b in budgets for i in range(trials)}
extra, missing = set(slots) - want, want - set(slots)
twice = {k: n for k, n in slots.items() if n > 1}
print(f"    CSV: {len(rows)} finished trials for {len(want)} planned slots; states",
      dict(collections.Counter(r["state"] for r in csv.DictReader(open(path)))))
sys.exit(1 if extra or missing or twice else 0)
PY
    local finished nodes
    finished="$(psql_q "select count(*) from trials t join studies s using (study_id)
        where s.study_name like '${EXPERIMENT}\\_%' and t.state in ('COMPLETE', 'PRUNED')")"
    [ "$finished" -eq $(( ${#BUDGETS[@]} * TRIALS )) ] || fail "database: $finished finished trials"
    nodes="$(psql_q "select count(distinct a.value_json) from trial_user_attributes a
        join trials t using (trial_id) join studies s using (study_id)
        where s.study_name like '${EXPERIMENT}\\_%' and a.key = 'ray_node_id'")"
    [ "$nodes" -ge 2 ] || fail "trials ran on $nodes Ray node(s), expected at least 2"
    log "results: CSV + ${#BUDGETS[@]} best JSONs owned by uid $(id -u); $finished trials finished once each on $nodes Ray nodes"
}

# Every Ray node (head, workers, driver, the killed one too) announced a loopback address.
check_ray_nodes_on_loopback() {
    local addrs
    addrs="$(compose exec -T ray-head python -c "import ray
ray.init(address='127.0.0.1:6380', logging_level='ERROR')
print(' '.join(sorted({n['NodeManagerAddress'] for n in ray.nodes()})), len(ray.nodes()))" 2>/dev/null | tail -n 1)"
    case " $addrs" in *" 127."*) ;; *) fail "no Ray node address read: '$addrs'" ;; esac
    local a
    for a in ${addrs% *}; do
        case "$a" in 127.*) ;; *) fail "a Ray node announced $a, outside the loopback range" ;; esac
    done
    log "Ray nodes (${addrs##* } incl. the dead one) announced only: ${addrs% *}"
}

# Before any study the dashboard serves its placeholder (an empty study list), healthy and
# without restarting: `archhpo dashboard` alone exits on a database without Optuna's tables.
check_dashboard_waits_for_the_first_study() {
    local url="http://127.0.0.1:$SMOKE_DASHBOARD_PORT/api/studies" restarts
    python3 - "$url" <<'PY' || fail "the dashboard at $url does not serve an empty study list on an empty database"
import json, sys, urllib.request
body = json.load(urllib.request.urlopen(sys.argv[1], timeout=10))
print("    dashboard on the empty database:", body)
sys.exit(0 if body.get("study_summaries") == [] and body.get("waiting_for_first_study") else 1)
PY
    restarts="$(docker inspect -f '{{.RestartCount}}' "$(compose ps -q dashboard)")"
    [ "$restarts" = 0 ] || fail "the dashboard container restarted $restarts times on the empty database"
    log "dashboard healthy on the empty database: a placeholder page, no restart"
}

check_dashboard() {
    local url="http://127.0.0.1:$SMOKE_DASHBOARD_PORT/api/studies"
    python3 - "$url" "$EXPERIMENT" "${BUDGETS[@]}" <<'PY' || fail "the dashboard at $url does not list the studies"
import json, sys, time, urllib.request
url, exp, budgets = sys.argv[1], sys.argv[2], sys.argv[3:]
want, names = {f"{exp}_{b}" for b in budgets}, set()
for _ in range(60):  # the placeholder gives way to optuna-dashboard within seconds of the first study
    try:
        body = json.load(urllib.request.urlopen(url, timeout=5))
        names = {s["study_name"] for s in body.get("study_summaries", body.get("studies", []))}
        if want <= names:
            break
    except OSError:
        pass
    time.sleep(2)
print("    dashboard lists:", sorted(names))
sys.exit(0 if want <= names else 1)
PY
    log "dashboard on 127.0.0.1:$SMOKE_DASHBOARD_PORT lists the studies"
}

# Neither secret in the images' metadata or build history, the services' logs or the results.
check_secrets() {
    local where="$WORK/secret-scan" img
    mkdir -p "$where"
    for img in "${BUILT_IMAGES[@]}" "${POSTGRES_IMAGE:-postgres:16}"; do
        docker image inspect "$img" > "$where/inspect-${img//[:\/]/_}.json"
        docker history --no-trunc "$img" > "$where/history-${img//[:\/]/_}.txt"
    done
    compose --profile driver logs --no-color > "$where/logs.txt" 2>&1
    cp "$WORK/driver.log" "$where/driver.log"
    if grep -rlF -e "$POSTGRES_PASSWORD" -e "$RAY_AUTH_TOKEN" "$where" "$WORK/results"; then
        fail "a secret appears in the files above"
    fi
    # The scan's own check: a running container's environment does hold both (that is how
    # they reach it), so the same grep finds them there.
    # Read whole into a variable, not piped into `grep -q`: grep would quit at the first match
    # and, under pipefail, docker's SIGPIPE would fail the check (about 1 run in 5).
    local inspect
    inspect="$(docker inspect "$(compose ps -q postgres)" "$(compose ps -q ray-head)")"
    [[ "$inspect" == *"$POSTGRES_PASSWORD"* ]] \
        || fail "the secret scan cannot see the password even where it is expected"
    inspect="$(docker inspect "$(compose ps -q ray-head)")"
    [[ "$inspect" == *"$RAY_AUTH_TOKEN"* ]] \
        || fail "the secret scan cannot see the Ray token even where it is expected"
    log "secrets: in none of image inspect, build history, service logs ($(wc -l < "$where/logs.txt") lines), driver log, results"
}

# `down` keeps the named volume; after `up` the study is still in PostgreSQL.
check_restart_keeps_the_study() {
    local t=$SECONDS
    compose down >/dev/null 2>&1
    docker volume inspect "${PROJECT}_pgdata" >/dev/null || fail "down removed the pgdata volume"
    stack_up
    local n
    n="$(psql_q "select count(*) from studies where study_name like '${EXPERIMENT}\\_%'")"
    [ "$n" -eq "${#BUDGETS[@]}" ] || fail "after down/up the database has $n of the ${#BUDGETS[@]} studies"
    # The dashboard container has the database settings: export there (no new container).
    compose exec -T dashboard sh -c "archhpo export --experiment $EXPERIMENT --out /tmp/after-restart \
        && test -s /tmp/after-restart/experiment_results.csv" > "$WORK/export.log" 2>&1 \
        || { cat "$WORK/export.log"; fail "export after restart failed"; }
    log "down + up kept the volume: $n studies still there, export works ($(( SECONDS - t )) s)"
}

main() {
    preflight
    trap cleanup EXIT
    make_secrets
    log "compose smoke: project $PROJECT in $WORK with ${COMPOSE[*]} ($("${COMPOSE[@]}" version --short 2>/dev/null))"
    build_images
    stack_up
    check_dashboard_waits_for_the_first_study
    run_study_killing_a_worker
    check_results
    check_ray_nodes_on_loopback
    check_dashboard
    check_secrets
    check_restart_keeps_the_study
    log "compose smoke: PASS in $(( $(date +%s) - T0 )) s"
}

main "$@"; exit $?  # on one line: bash has read it whole, so an edit made meanwhile is harmless
