#!/usr/bin/env bash
# The real T3 ladder run whose outputs lie beside this script (bench/truths/README.md, docs/searching.md):
# `archhpo run --ladder` on all four budgets of T3 through 2 Ray workers, with the truth's fixed training.
# Run on 2026-11-26 13:02-13:38 UTC as /work/realrun/t3.sh (the same command, WORK=/work/realrun), beside
# the truths' two workers for its whole length. Re-running it writes to $WORK, not here.
# --no-confirm-at-rung: launched before --confirm-at-rung became --ladder's default (2026-11-29), it keeps
# the options its studies were stored with (the same studies; a relaunch without it is accepted too).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
WORK=${WORK:-/tmp/t3real}
mkdir -p "$WORK"
export RAY_USAGE_STATS_ENABLED=0
# --no-carry-finalists: launched before --carry-finalists became --ladder's default (2026-12-02).
exec nice -n 10 .venv/bin/archhpo run --ladder --no-confirm-at-rung --no-carry-finalists --experiment t3real --family lm --data synthetic --order 5 --vocab-size 12 \
  --seq-len 128 --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 --n-heads 2,4,8 --schedule wsd \
  --cooldown 0.2 --learning-rate 3e-3 --weight-decay 1e-4 --batch-size 16 --warmup-steps 50 --epochs 9 \
  --budget 100K --budget 150K --budget 250K --budget 400K --trials 50 --workers 2 --threads 1 \
  --storage "sqlite:///$WORK/t3real.db" --checkpoint-dir "$WORK/t3ck" --out "$WORK/t3out"
