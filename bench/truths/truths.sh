#!/usr/bin/env bash
# The ground truths of bench/truths/ (bench/truths/README.md): archhpo studies that train every grid
# architecture of a ladder to full length at a stated tokens-per-parameter, with 3 init seeds on
# fixed data, recording each interval's loss and halving's cooldown-branch rung scores.
#
# They take days of a 2-core machine (bench/truths/README.md, cost), so they run in parts ("studies in parts",
# docs): a working copy outside the checkout, niced workers in the background, and a copy of
# the database and checkpoints back into the checkout every 15 minutes and at every stop.
#
#   bench/truths/truths.sh start        # in the background, in ORDER (below): stages such as t1:100K,200K,400K
#   bench/truths/truths.sh start t3     # or named stages (a truth, or truth:budgets), each to the end
#   TRUTHS_WORKERS=1 bench/truths/truths.sh start t4   # with 1 niced worker (default 2)
#   bench/truths/truths.sh status t1    # trials per study and state
#   bench/truths/truths.sh stop         # SIGTERM the workers (each running trial saved between two steps), save all
#   bench/truths/truths.sh save t1      # copy the live database and checkpoints into bench/truths/studies/
#   bench/truths/truths.sh table t1     # bench/truths/t1.csv, its sha256 and cost (once every trial is done)
#
# Re-running `start` after a stop (or on a new machine, from the committed copy) resumes: finished
# trials stay finished and interrupted ones resume from the step where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ARCHHPO=${ARCHHPO:-$ROOT/.venv/bin/archhpo}
PY=${PY:-$ROOT/.venv/bin/python}
WORK=${TRUTHS_WORK:-/work/truths}     # the live copy (outside the checkout)
SAVED=$ROOT/bench/truths/studies      # the committed copy
WORKERS=${TRUTHS_WORKERS:-2}
export RAY_USAGE_STATS_ENABLED=0

# shellcheck source=bench/parts.sh
source "$ROOT/bench/parts.sh"  # sql, restore_copy, save, start_saver, stop_saver: the two copies

# Shared by every truth: 3 init seeds on data fixed by --data-seed; every architecture of the grid
# (a paired study never prunes) trained to 10 tokens per parameter (20 is beyond this machine: see the
# README); WSD with halving's rungs at 1/9 and 1/3 of D recorded as cooldown-branch scores; 9 intervals.
# shellcheck disable=SC2054
COMMON=(--tokens-per-param 10 --paired-seeds 3 --data-seed 0 --seed 0 --pruner halving --eta 3 --min-fraction 1/9
        --schedule wsd --cooldown 0.2 --trials 200 --tolerance 0.15 --n-heads 2,4,8 --seq-len 128)
LADDER=(--budget 100K --budget 200K --budget 400K --budget 800K)
# The order of the work (`start` with no arguments): the budgets up to 400K of every truth first, so
# that complete truths (T3) and the lower ladders exist days before the 800K budgets (36 trials of
# about 80 minutes each per truth at this machine's measured 11 GFLOP/s per worker) are done.
# shellcheck disable=SC2054
ORDER=(t1:100K,200K,400K t1lr:400K t3 t2:100K,200K,400K t1:800K t1lr:800K t2:800K t4)

args_for() {
  case "$1" in
    # T1: the synthetic language (vocab 32, order 3; exact entropy rate), windows of 128 tokens.
    t1) echo --family lm --data synthetic "${LADDER[@]}" "${COMMON[@]}" ;;
    # T2: Shakespeare's complete works as bytes (vocab 256), fetched by bench/truths/shakespeare.sh.
    t2) echo --family lm --data "$WORK/shakespeare.txt" "${LADDER[@]}" "${COMMON[@]}" ;;
    # T3: another language: order 5 (longer dependencies), vocab 12; a 4x ladder.
    t3) echo --family lm --data synthetic --order 5 --vocab-size 12 --budget 100K --budget 150K --budget 250K \
          --budget 400K "${COMMON[@]}" ;;
    # T4 (pre-registered, docs/searching.md): the King James Bible as bytes (vocab 256), fetched by
    # bench/truths/t4_text.sh; T3's 4x ladder, about 15 trial-hours at 11 GFLOP/s per worker.
    t4) echo --family lm --data "$WORK/kjv.txt" --budget 100K --budget 150K --budget 250K --budget 400K \
          "${COMMON[@]}" ;;
    *) echo "unknown truth '$1' (t1, t2, t3 or t4)" >&2; exit 2 ;;
  esac
}

restore() {  # the working copy (bench/parts.sh), and the truth's corpus where it is a file
  local t=$1
  restore_copy "$t"
  if [[ $t == t2 && ! -f $WORK/shakespeare.txt ]]; then bash "$ROOT/bench/truths/shakespeare.sh" "$WORK/shakespeare.txt"; fi
  if [[ $t == t4 && ! -f $WORK/kjv.txt ]]; then bash "$ROOT/bench/truths/t4_text.sh" "$WORK/kjv.txt"; fi
}

studies_of() {  # the study names of truth $1 limited to budgets $2 (comma-separated; empty: all)
  local t=$1 budgets=${2:-} b
  if [[ -z $budgets ]]; then
    sql "$WORK/$t.db" "select study_name from studies where study_name like '${t}\\_%' escape '\\' order by 1"
    return
  fi
  for b in ${budgets//,/ }; do
    sql "$WORK/$t.db" "select study_name from studies where study_name like '${t}\\_${b}-%' escape '\\'"
  done
}

work() {  # launch truth $1, train its budgets $2 (all if empty) to the end with $WORKERS niced workers
  local t=$1 budgets=${2:-} names=() n
  restore "$t"
  # shellcheck disable=SC2046
  "$ARCHHPO" launch --experiment "$t" $(args_for "$t") --storage "sqlite:///$WORK/$t.db"
  while read -r n; do [[ -n $n ]] && names+=("$n"); done < <(studies_of "$t" "$budgets")
  train "$t" "${names[@]}"
}

train() {  # train the studies $2... of database $1 to the end with $WORKERS niced workers, saving as it goes
  local t=$1 pids=() rc=0 study_args=() n
  shift
  for n in "$@"; do study_args+=(--study "$n"); done
  start_saver "$t"
  for i in $(seq 1 "$WORKERS"); do
    nice -n 10 "$ARCHHPO" worker --experiment "$t" "${study_args[@]}" --storage "sqlite:///$WORK/$t.db" \
      --threads 1 --checkpoint-dir "$WORK/${t}_ck" >>"$WORK/$t.worker$i.log" 2>&1 &
    pids+=($!); echo $! >"$WORK/$t.worker$i.pid"
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  stop_saver "$t"
  rm -f "$WORK/$t".worker*.pid
  save "$t"
  return "$rc"
}

# T1's learning-rate sweep (bench/truths/lr_sweep.py): at a finished T1 budget, its top 3 architectures
# at the 4 rates of lr_sweep.py's RATES other than the truth's 3e-3, seed 0 on the truth's data, one
# pinned study per (architecture, rate) in t1lr.db.
SWEEP_RATES=(7.5e-4 1.5e-3 6e-3 1.2e-2)
SWEEP_COMMON=(--family lm --data synthetic --tokens-per-param 10 --paired-seeds 1 --data-seed 0 --seed 0
              --pruner halving --eta 3 --min-fraction 1/9 --schedule wsd --cooldown 0.2 --tolerance 0.15 --seq-len 128)

sweep() {  # the sweep at T1 budget $1: launch its studies (idempotent), then train them
  local b=$1 d l h f r names=()
  restore t1lr
  while read -r d l h f; do
    for r in "${SWEEP_RATES[@]}"; do
      names+=("$("$ARCHHPO" launch --experiment "t1lr-$r" --budget "$b" --d-model "$d" --n-layers "$l" --n-heads "$h" \
        --d-ff "$f" --learning-rate "$r" "${SWEEP_COMMON[@]}" --storage "sqlite:///$WORK/t1lr.db" 2>&1 |
        sed -n 's/^\(created\|reloaded\) study \([^ ]*\) on .*/\2/p')")
    done
  done < <("$PY" "$ROOT/bench/truths/lr_sweep.py" top --storage "sqlite:///$WORK/t1.db" --study "t1_${b}-h2+4+8-t10")
  ((${#names[@]} == 3 * ${#SWEEP_RATES[@]})) || { echo "sweep $b: launched ${#names[@]} studies, not 12" >&2; return 1; }
  train t1lr "${names[@]}"
}

finished() {  # every planned trial of truth $1 (of its budgets $2, if given) has ended
  local t=$1 budgets=${2:-} n open=0 any=0
  [[ -f $WORK/$t.db ]] || return 1
  while read -r n; do
    [[ -n $n ]] || continue
    any=1
    open=$((open + $(sql "$WORK/$t.db" "select count(*) from trials join studies using (study_id)
      where study_name = '$n' and state in ('WAITING','RUNNING')")))
  done < <(studies_of "$t" "$budgets")
  ((any == 1 && open == 0))
}

chain() {  # the stages in order (t1, or t1:100K,200K for some budgets), each to the end
  local stage t budgets pid
  # `nice` yields only within one session: the kernel's autogroups share the CPU between sessions
  # (a terminal, CI) as equals, so the chain lowers its whole session's weight as well.
  echo 10 >/proc/self/autogroup 2>/dev/null || true
  for f in "$WORK"/t*.worker*.pid; do  # workers of an earlier `start` still running: let them finish
    [[ -f $f ]] || continue
    pid=$(cat "$f"); while kill -0 "$pid" 2>/dev/null; do sleep 30; done
  done
  for stage in "$@"; do
    t=${stage%%:*}; budgets=""; [[ $stage == *:* ]] && budgets=${stage#*:}
    if [[ $t == t1lr ]]; then  # the sweep at each named budget (its studies are launched by `sweep`)
      for b in ${budgets//,/ }; do sweep "$b" || { echo "$stage: stopped (exit $?); the chain ends here" >&2; return 1; }; done
      continue
    fi
    restore "$t"
    if [[ -f $WORK/$t.db ]] && finished "$t" "$budgets"; then echo "$stage: finished" >&2; continue; fi
    work "$t" "$budgets" || { echo "$stage: workers stopped (exit $?); the chain ends here" >&2; return 1; }
  done
}

start() {  # the chain in the background: bench/truths/truths.sh start t1 t2 t3
  mkdir -p "$WORK"
  nohup "$0" chain "$@" >>"$WORK/chain.log" 2>&1 &
  echo $! >"$WORK/chain.pid"
  echo "started the chain $* (log $WORK/chain.log)" >&2
}

stop() {  # SIGTERM every worker (each running trial is saved between two steps), then save every truth
  local pid t
  if [[ -f $WORK/chain.pid ]]; then kill "$(cat "$WORK/chain.pid")" 2>/dev/null || true; rm -f "$WORK/chain.pid"; fi
  for f in "$WORK"/t*.worker*.pid; do
    [[ -f $f ]] || continue
    pid=$(cat "$f"); kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 1; done
    rm -f "$f"
  done
  for f in "$WORK"/t*.saver.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
  for t in t1 t2 t3 t4 t1lr; do [[ -f $WORK/$t.db ]] && save "$t"; done
  return 0
}

status() {
  local t=$1
  # sqlite3 would create an empty database here, which `restore` must not take for a working copy
  [[ -s $WORK/$t.db ]] || { echo "no working copy $WORK/$t.db yet: the chain restores it when it reaches $t" >&2; return 1; }
  sql "$WORK/$t.db" "select s.study_name, t.state, count(*) from trials t join studies s using (study_id)
    group by 1, 2 order by 1, 2;"
}

table() {
  local t=$1
  "$PY" bench/search_truth.py --storage "sqlite:///$WORK/$t.db" --experiment "$t" --out "bench/truths/$t.csv" --summary
  sha256sum "bench/truths/$t.csv"
}

case "${1:-}" in
  start|chain) cmd=$1; shift; if (($# == 0)); then set -- "${ORDER[@]}"; fi; "$cmd" "$@" ;;
  stop) stop ;;
  save|status|table|restore|work|sweep) "$1" "${2:?which truth (t1, t2, t3, t4, t1lr) or, for sweep, which T1 budget}" ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
