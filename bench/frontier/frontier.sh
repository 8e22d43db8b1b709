#!/usr/bin/env bash
# The two real IsoFLOP frontiers of issue 55 part 5 (bench/frontier/README.md): at each compute
# budget C, 7 lm sizes over 10x trained on D = C/(k·N) tokens (`archhpo launch --isoflop C`), one
# study per C, on the synthetic language (exact entropy rate) and on Shakespeare's bytes.
#
# They take hours of a 2-core machine, so they run as studies in parts, as bench/truths/truths.sh
# does: a working copy outside the checkout, one niced worker per task in the background, and a copy
# of the database and checkpoints back into the checkout every 15 minutes and at every stop.
#
#   bench/frontier/frontier.sh start           # both tasks in the background, each C in increasing order
#   bench/frontier/frontier.sh start syn       # or one task (syn: synthetic language, shk: Shakespeare)
#   bench/frontier/frontier.sh status syn      # trials per study and state
#   bench/frontier/frontier.sh stop            # SIGTERM the workers (each running trial saved between two steps), save all
#   bench/frontier/frontier.sh save syn        # copy the live database and checkpoints into bench/frontier/studies/
#   bench/frontier/frontier.sh table syn       # bench/frontier/syn.csv and syn_r.csv (every finished trial), sha256, cost
#   bench/frontier/frontier.sh start syn_x     # the extrapolation's C_big study (extrapolate.py predict, launch) to its end
#
# Re-running `start` after a stop (or on a new machine, from the committed copy) resumes: finished
# trials stay finished and interrupted ones resume from the step where they stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ARCHHPO=${ARCHHPO:-$ROOT/.venv/bin/archhpo}
WORK=${FRONTIER_WORK:-/work/frontier}    # the live copy (outside the checkout)
SAVED=${FRONTIER_SAVED:-$ROOT/bench/frontier/studies}   # the committed copy
export RAY_USAGE_STATS_ENABLED=0
TASKS=(syn shk)

# shellcheck source=bench/parts.sh
source "$ROOT/bench/parts.sh"  # sql, restore_copy, save, start_saver, stop_saver: the two copies

# Shared by both tasks: the truths' training (fixed data, WSD with a 20% cooldown, learning rate 3e-3,
# batch 16, 128-token windows, 2, 4 or 8 heads), 7 sizes over 10x per C, 3 validation intervals.
TRAINING=(--family lm --data-seed 0 --seed 0 --schedule wsd --cooldown 0.2 --learning-rate 3e-3 --batch-size 16
          --seq-len 128 --epochs 3)
# shellcheck disable=SC2054  # a flag's comma list, not array elements
COMMON=("${TRAINING[@]}" --n-heads 2,4,8 --sizes 7)
# The compute budgets, trained in this order: the issue brief's two decades 1e11-1e13 first (about
# 1e14 FLOPs per task), then 3e13 and 1e14, which carry the frontier to where the grid brackets the
# prior's optimum at every C (README: why).
COMPUTES=(1e11 3e11 1e12 3e12 1e13 3e13 1e14)
# The budgets trained: all but 1e14, whose 7 sizes (7e14 FLOPs, about 21 trial-hours per task at
# 9 GFLOP/s) would cost three times the rest of the frontier; its planned study stays untrained in
# the database (docs/compute-optimal.md, "The top budget": the rule, written before 3e13 was read).
TRAINED=(1e11 3e11 1e12 3e12 1e13 3e13)

args_for() {  # the task's data and its centre per C (the order of COMPUTES)
  local c centres=()
  case "$1" in
    # The prior's N_c = sqrt(C/120) (budgets/_isoflop.py), raised where it lies so low that the smallest
    # size would fall below the lm grid's smallest architecture (77K with vocab 32, 92K with vocab 256).
    # 20M tokens (the default 2M would be repeated up to 25 times at 1e14; 20M keeps every trial within
    # 2.5 passes); its entropy rate is exact whatever the length.
    syn) centres=(2.2e5 2.2e5 2.2e5 2.2e5 2.89e5 5e5 9.13e5); echo --data synthetic:tokens=20000000 ;;
    shk) centres=(2.6e5 2.6e5 2.6e5 2.6e5 2.89e5 5e5 9.13e5); echo --data "$WORK/shakespeare.txt" ;;
    *) echo "unknown task '$1' (syn or shk; syn_x or shk_x for an extrapolation)" >&2; exit 2 ;;
  esac
  for c in "${COMPUTES[@]}"; do echo --isoflop "$c"; done
  for c in "${centres[@]}"; do echo --centre "$c"; done
  echo --span 10 "${COMMON[@]}"
}

# The second pass (docs/compute-optimal.md, "Re-centring the edge budgets"): every budget whose vertex
# the first pass left at the grid's edge, launched as the first pass's report printed its `recentre`
# (centre, 7 sizes, the span of the sizes it trained), in experiment {task}_r of the same database, on
# the grid's widths and depths extended below (d_model 16-48, 1 layer), which the lowest centres need.
# The report pools both experiments' tables (`table`, then `archhpo report --csv ... --csv ...`).
PASSES=(r r2 r3 r4 r5)  # the re-centred passes' experiments, {task}_{pass} (extrapolate.py's RECENTRED)
# shellcheck disable=SC2054
RECENTRE_GRID=(--d-model 16,32,48,64,128,192,256,384,512,768,1024 --n-layers 1,2,3,4,6,8,12,16)
recentre_for() {  # "C centre" pairs of task $1, then its span
  case "$1" in
    syn) echo "1e11 7.73e4 3e11 2.66e4 1e12 7.73e4 3e12 2.66e4 ; 8.09" ;;
    shk) echo "1e11 4.52e4 1e12 9.16e4 1e13 8.06e4 ; 10.5" ;;
  esac
}
# The third pass (docs/compute-optimal.md, same rule): what the two passes pooled still left at the edge
# and the extended grid can reach (the report's centre, the same 7 sizes and span), experiment {task}_r2.
recentre2_for() {
  case "$1" in
    syn) echo "1e12 2.67e4 ; 8.09" ;;
    *) echo "" ;;
  esac
}

# The fourth pass (docs/compute-optimal.md, "The lowest loss at an end"): the budgets up to 1e13 that
# the corrected edge flag (the lowest loss at the smallest size) marks, each as the corrected report's
# `recentre` says, experiment {task}_r3: "C centre span" per budget.
recentre3_for() {
  case "$1" in
    syn) echo "1e11 2.67e4 6 1e13 1.10e5 8.35" ;;
    shk) echo "3e11 9.16e4 10.5 3e12 9.16e4 10.5" ;;
  esac
}
# The fifth pass (docs/compute-optimal.md, "The top budget"): 3e13 where its 7 sizes left the vertex at
# the edge, re-centred once as the report's `recentre` says, with 5 sizes, experiment {task}_r4.
recentre4_for() {
  case "$1" in
    syn) echo "3e13 1.6e5 10.1" ;;   # read at 15:12 UTC on 2026-12-03: the lowest loss at the smallest size
    *) echo "" ;;                    # shk's 3e13 brackets its vertex (2.9e5)
  esac
}
# The next pass (docs/compute-optimal.md, "Approach 3 where most steps leave the warm-up"): 1e14
# re-centred on the pooled Approach 2's N_opt(1e14), 5 sizes, experiment {task}_r5, trained after the
# seeds; written at 03:56 UTC on 2026-12-04 before anything at 1e14 was read. shk's (1e14 3.2e5 10)
# was withdrawn before it trained: its sizes would repeat the 5 MB corpus 3-22 times.
recentre5_for() {
  case "$1" in
    *) echo "" ;;                    # syn: once syn_r4 and its seeds are read, by the same rule
  esac
}
pass_spec() { case $2 in r4) recentre4_for "$1" ;; r5) recentre5_for "$1" ;; *) recentre3_for "$1" ;; esac; }
pass_sizes() { if [[ $1 == r4 || $1 == r5 ]]; then echo 5; else echo 7; fi; }
launch_pass() {  # task $1's pass $2 (r3, r4 or r5), one launch per budget (each its own span)
  local t=$1 pass=$2 data
  data=$(args_for "$t" | grep -E '^--data ')
  # shellcheck disable=SC2046,SC2086
  set -- $(pass_spec "$t" "$pass")
  while (($#)); do
    # shellcheck disable=SC2086
    "$ARCHHPO" launch --experiment "${t}_$pass" $data --isoflop "$1" --centre "$2" --span "$3" "${RECENTRE_GRID[@]}" \
      "${COMMON[@]}" --sizes "$(pass_sizes "$pass")" --storage "sqlite:///$WORK/$t.db"
    shift 3
  done
}
pass_computes() { local c _ _s; while read -r c _ _s; do echo "$c"; done < <(pass_spec "$1" "$2" | xargs -n 3); }

recentre_computes() {  # task $1's re-centred budgets (pass ${2:-r}), one per line
  local r pairs
  r=$(recentre_for_pass "$1" "${2:-r}"); pairs=${r%;*}
  # shellcheck disable=SC2086
  set -- $pairs
  while (($#)); do echo "$1"; shift 2; done
}
recentre_for_pass() { if [[ $2 == r2 ]]; then recentre2_for "$1"; else recentre_for "$1"; fi; }
recentre_args() {  # the launch of task $1's pass ${2:-r} (experiment $1_r or $1_r2)
  local t=$1 r pairs span
  r=$(recentre_for_pass "$t" "${2:-r}"); pairs=${r%;*}; span=${r#*;}
  args_for "$t" | grep -E '^--data ' || true   # the task's data, as in the first pass
  # shellcheck disable=SC2086
  set -- $pairs
  while (($#)); do echo --isoflop "$1" --centre "$2"; shift 2; done
  # shellcheck disable=SC2086
  echo --span $span "${RECENTRE_GRID[@]}" "${COMMON[@]}"
}

restore() {  # the working copy (bench/parts.sh), and the task's corpus where it is a file
  local t=$1
  restore_copy "$t"
  if [[ $t == shk && ! -f $WORK/shakespeare.txt ]]; then bash "$ROOT/bench/truths/shakespeare.sh" "$WORK/shakespeare.txt"; fi
}

open_trials() {  # WAITING or RUNNING trials of study $2 in task $1's database
  sql "$WORK/$1.db" "select count(*) from trials join studies using (study_id)
    where study_name = '$2' and state in ('WAITING','RUNNING')"
}

train_study() {  # one study of task $1 to its end with the task's worker: train_study TASK STUDY
  local t=$1 n=$2
  if (($(open_trials "$t" "$n") == 0)); then echo "$n: finished" >&2; return 0; fi
  nice -n 10 "$ARCHHPO" worker --study "$n" --storage "sqlite:///$WORK/$t.db" --threads 1 \
    --checkpoint-dir "$WORK/${t}_ck" >>"$WORK/$t.worker.log" 2>&1 &
  echo $! >"$WORK/$t.worker.pid"
  wait "$!" || { local rc=$?; echo "$n: the worker stopped (exit $rc); the chain ends here" >&2; return "$rc"; }
  echo "$(date -u +%FT%TZ) $n: done" >&2
}

seed_vertices() {  # every pass trained: 3 paired seeds at the size nearest each resolved vertex (the top budget's rule)
  local t=$1 n
  local names=()
  # shellcheck disable=SC2046
  while read -r n; do names+=("$n"); done < <("$(dirname "$ARCHHPO")/python" "$ROOT/bench/frontier/extrapolate.py" seeds \
    --task "$t" --storage "sqlite:///$WORK/$t.db" --seeds 3 --run -- $(args_for "$t" | grep -E '^--data ') \
    "${TRAINING[@]}" 2>&1 | tee -a "$WORK/$t.chain.log" | sed -n 's/^\(created\|reloaded\) study \([^ ]*\) on .*/\2/p')
  for n in "${names[@]}"; do train_study "$t" "$n" || return $?; done
}

extrapolation() {  # task $1's C_big study ({task}_x in $WORK/{task}_x.db, made by `extrapolate.py launch`) to its end
  local t=$1 n rc=0
  restore "$t"
  [[ -s $WORK/$t.db ]] || { echo "no $WORK/$t.db: run extrapolate.py predict and launch first" >&2; return 2; }
  start_saver "$t"
  for n in $(sql "$WORK/$t.db" "select study_name from studies order by 1"); do train_study "$t" "$n" || { rc=$?; break; }; done
  stop_saver "$t"
  rm -f "$WORK/$t.worker.pid"
  save "$t"
  return "$rc"
}

chain() {  # task $1: launch every C (idempotent), then train each C's study to the end, smallest C first
  local t=$1 c n rc=0
  # `nice` yields only within one session: the kernel's autogroups share the CPU between sessions
  # (a terminal, CI) as equals, so the chain lowers its whole session's weight as well.
  echo 10 >/proc/self/autogroup 2>/dev/null || true
  if [[ $t == *_x ]]; then extrapolation "$t"; return; fi   # syn_x, shk_x: the extrapolation's study
  restore "$t"
  # shellcheck disable=SC2046
  "$ARCHHPO" launch --experiment "$t" $(args_for "$t") --storage "sqlite:///$WORK/$t.db"
  # shellcheck disable=SC2046
  "$ARCHHPO" launch --experiment "${t}_r" $(recentre_args "$t") --storage "sqlite:///$WORK/$t.db"
  if [[ -n $(recentre2_for "$t") ]]; then
    # shellcheck disable=SC2046
    "$ARCHHPO" launch --experiment "${t}_r2" $(recentre_args "$t" r2) --storage "sqlite:///$WORK/$t.db"
  fi
  launch_pass "$t" r3
  launch_pass "$t" r4
  launch_pass "$t" r5
  start_saver "$t"
  # the second pass's cheap budgets first (they resolve the low vertices), then the first pass's rest
  local studies=()
  for c in $(recentre_computes "$t"); do studies+=("${t}_r_C${c}"); done
  for c in $(recentre_computes "$t" r2); do studies+=("${t}_r2_C${c}"); done
  for c in "${TRAINED[@]}"; do studies+=("${t}_C${c}"); done
  for c in $(pass_computes "$t" r3); do studies+=("${t}_r3_C${c}"); done   # after 3e13's first pass
  for c in $(pass_computes "$t" r4); do studies+=("${t}_r4_C${c}"); done
  for n in "${studies[@]}"; do
    train_study "$t" "$n" || { rc=$?; break; }
  done
  if ((rc == 0)); then seed_vertices "$t" || rc=$?; fi
  if ((rc == 0)); then  # the next pass, after the seeds (its rule: recentre5_for)
    for c in $(pass_computes "$t" r5); do train_study "$t" "${t}_r5_C${c}" || { rc=$?; break; }; done
  fi
  stop_saver "$t"
  rm -f "$WORK/$t.worker.pid"
  save "$t"
  return "$rc"
}

start() {  # each task's chain in the background: bench/frontier/frontier.sh start [syn] [shk]
  local t pid tasks=("$@")
  ((${#tasks[@]})) || tasks=("${TASKS[@]}")
  mkdir -p "$WORK"
  for t in "${tasks[@]}"; do
    if [[ -f $WORK/$t.chain.pid ]] && pid=$(cat "$WORK/$t.chain.pid") && kill -0 "$pid" 2>/dev/null; then
      echo "$t is already running (chain $pid)" >&2; continue
    fi
    nohup "$0" chain "$t" >>"$WORK/$t.chain.log" 2>&1 &
    echo $! >"$WORK/$t.chain.pid"
    echo "$(date -u +%FT%TZ) started $t (log $WORK/$t.chain.log)" >&2
  done
}

stop() {  # SIGTERM each worker (its running trial is saved between two steps), then save every task
  local t pid
  for t in "${TASKS[@]}" "${TASKS[@]/%/_x}"; do
    if [[ -f $WORK/$t.chain.pid ]]; then kill "$(cat "$WORK/$t.chain.pid")" 2>/dev/null || true; rm -f "$WORK/$t.chain.pid"; fi
    if [[ -f $WORK/$t.worker.pid ]]; then
      pid=$(cat "$WORK/$t.worker.pid"); kill -TERM "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 1; done
      rm -f "$WORK/$t.worker.pid"
    fi
    stop_saver "$t"
    if [[ -f $WORK/$t.db ]]; then save "$t"; fi
  done
  return 0
}

status() {
  local t=$1
  [[ -s $WORK/$t.db ]] || { echo "no working copy $WORK/$t.db yet: \`start $t\` makes it" >&2; return 1; }
  sql "$WORK/$t.db" "select s.study_name, t.state, count(*) from trials t join studies s using (study_id)
    group by 1, 2 order by 1, 2;"
  sql "$WORK/$t.db" "select printf('%.2f trial-hours so far (duration_s of the finished trials)', coalesce(sum(json_extract(a.value_json, '\$')), 0) / 3600.0)
    from trial_user_attributes a join trials t using (trial_id) where a.key = 'duration_s' and t.state = 'COMPLETE';"
}

table() {  # every finished trial of task $1 (experiment_results.csv's columns), with its sha256 and cost
  local t=$1 out
  out=$(mktemp -d)
  "$ARCHHPO" export --experiment "$t" --storage "sqlite:///$WORK/$t.db" --out "$out" >/dev/null
  cp "$out/experiment_results.csv" "bench/frontier/$t.csv"
  local e files=("bench/frontier/$t.csv")
  for e in "${PASSES[@]/#/${t}_}"; do
    if "$ARCHHPO" export --experiment "$e" --storage "sqlite:///$WORK/$t.db" --out "$out/$e" >/dev/null 2>&1; then
      cp "$out/$e/experiment_results.csv" "bench/frontier/$e.csv"; files+=("bench/frontier/$e.csv")
    fi
  done
  rm -rf "$out"
  sha256sum "${files[@]}"
  status "$t" | tail -1
}

case "${1:-}" in
  start) shift; start "$@" ;;
  chain) chain "$2" ;;
  stop) stop ;;
  save) save "$2" ;;
  status) status "$2" ;;
  table) table "$2" ;;
  *) echo "usage: $0 start [syn|shk|syn_x|shk_x]... | stop | save TASK | status TASK | table TASK" >&2; exit 2 ;;
esac
