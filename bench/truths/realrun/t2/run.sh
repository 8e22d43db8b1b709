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
# --no-confirm-at-rung: launched before --confirm-at-rung became --ladder's default (2026-11-29), it keeps
# the options its studies were stored with (the same studies; a relaunch without it is accepted too).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
HERE=bench/truths/realrun/t2
WORK=${WORK:-/work/realrun/t2}
DATA=/work/realrun/shakespeare.txt  # where its first parts read the corpus: the path is part of its studies' identity
DB=t2real.db
export RAY_USAGE_STATS_ENABLED=0
# shellcheck source=bench/truths/realrun/parts.sh
source bench/truths/realrun/parts.sh

launch() {
  [[ -f $DATA ]] || { mkdir -p "$(dirname "$DATA")"; bash bench/truths/shakespeare.sh "$DATA"; }
  # --no-carry-finalists: launched before --carry-finalists became --ladder's default (2026-12-02).
  exec nice -n 10 .venv/bin/archhpo run --ladder --no-confirm-at-rung --no-carry-finalists --experiment t2real --family lm --data "$DATA" \
    --seq-len 128 --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 --n-heads 2,4,8 --schedule wsd \
    --cooldown 0.2 --learning-rate 3e-3 --weight-decay 1e-4 --batch-size 16 --warmup-steps 50 --epochs 9 \
    --budget 100K --budget 200K --budget 400K --budget 800K --trials 50 --workers 1 --threads 1 \
    --storage "sqlite:///$WORK/t2real.db" --checkpoint-dir "$WORK/ck" --out "$WORK/out"
}

parts "$@"
