#!/usr/bin/env bash
# A real T2 ladder run whose outputs lie beside this script (bench/truths/README.md, docs/searching.md):
# `archhpo run --ladder` on T2's ladder (Shakespeare as bytes) with the truth's fixed training and
# `--ladder`'s defaults. Its 100K and 200K ran on 2026-11-26 from 14:25 UTC through 2 Ray workers beside
# the truths' two; 400K, added to the same experiment, from 16:25 UTC on a copy of the committed
# database (its first two budgets reloaded as finished). 800K, added the same way on 2026-11-28, runs
# in parts through 1 niced worker beside the truths' two (its trials are hours each):
#
#   bench/truths/realrun/t2/run.sh start    # in the background (resumes a stopped run: finished trials stay)
#   bench/truths/realrun/t2/run.sh stop     # SIGTERM (the running trial is saved between two steps), then save
#   bench/truths/realrun/t2/run.sh save     # copy the live database (t2real.db) and checkpoints (ck/) here
#
# Once it and T2's 800K truth are finished, `compare.py --truth bench/truths/t2.csv --results <its out>
# --experiment t2real --replay 50` grades it (docs/searching.md, "Real runs").
set -euo pipefail
cd "$(dirname "$0")/../../../.."
HERE=bench/truths/realrun/t2
WORK=${WORK:-/work/realrun/t2}
DATA=/work/realrun/shakespeare.txt  # where its first parts read the corpus: the path is part of its studies' identity
export RAY_USAGE_STATS_ENABLED=0

save() {
  [[ -f $WORK/t2real.db ]] || { echo "no $WORK/t2real.db to save" >&2; return 1; }
  sqlite3 -cmd ".timeout 60000" "$WORK/t2real.db" ".backup '$HERE/t2real.db.tmp'" && mv "$HERE/t2real.db.tmp" "$HERE/t2real.db"
  # the interrupted trial's checkpoint too: an 800K trial is hours of a worker, resumed from it on a new machine
  rm -rf "$HERE/ck.tmp" && if [[ -d $WORK/ck ]]; then cp -r "$WORK/ck" "$HERE/ck.tmp"; else mkdir -p "$HERE/ck.tmp"; fi
  rm -rf "$HERE/ck" && mv "$HERE/ck.tmp" "$HERE/ck"
  echo "$(date -u +%FT%TZ) saved t2real" >&2
}

run() {
  mkdir -p "$WORK"
  if [[ ! -s $WORK/t2real.db && -f $HERE/t2real.db ]]; then  # a new machine: the committed copy
    cp "$HERE/t2real.db" "$WORK/t2real.db"
    rm -rf "$WORK/ck" && if [[ -d $HERE/ck ]]; then cp -r "$HERE/ck" "$WORK/ck"; fi
  fi
  [[ -f $DATA ]] || { mkdir -p "$(dirname "$DATA")"; bash bench/truths/shakespeare.sh "$DATA"; }
  exec nice -n 10 .venv/bin/archhpo run --ladder --experiment t2real --family lm --data "$DATA" \
    --seq-len 128 --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 --n-heads 2,4,8 --schedule wsd \
    --cooldown 0.2 --learning-rate 3e-3 --weight-decay 1e-4 --batch-size 16 --warmup-steps 50 --epochs 9 \
    --budget 100K --budget 200K --budget 400K --budget 800K --trials 50 --workers 1 --threads 1 \
    --storage "sqlite:///$WORK/t2real.db" --checkpoint-dir "$WORK/ck" --out "$WORK/out"
}

case "${1:-}" in
  start) mkdir -p "$WORK"; nohup "$0" run >>"$WORK/run.log" 2>&1 & echo $! >"$WORK/run.pid"; echo "started (log $WORK/run.log)" >&2 ;;
  run) run ;;
  stop) if [[ -f $WORK/run.pid ]]; then pid=$(cat "$WORK/run.pid"); kill -TERM "$pid" 2>/dev/null || true
          while kill -0 "$pid" 2>/dev/null; do sleep 1; done; rm -f "$WORK/run.pid"; fi; save ;;
  save) save ;;
  *) echo "usage: $0 start|stop|save" >&2; exit 2 ;;
esac
