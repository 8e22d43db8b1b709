#!/usr/bin/env bash
# The real T3 ladder run with --confirm-at-rung (docs/searching.md, real runs): bench/truths/realrun/t3/run.sh's
# command (T3's four budgets, the truth's fixed training, 2 Ray workers) with the option, under its own
# experiment name. Run on 2026-11-28 beside the truths' two workers and a CI run. Writes to $WORK; its outputs
# were copied beside this script and graded with
#   python bench/truths/realrun/compare.py --truth bench/truths/t3.csv --results bench/truths/realrun/t3rung \
#       --experiment t3rung --replay 50
set -euo pipefail
cd "$(dirname "$0")/../../../.."
WORK=${WORK:-/tmp/t3rung}
mkdir -p "$WORK"
export RAY_USAGE_STATS_ENABLED=0
# --no-carry-finalists: launched before --carry-finalists became --ladder's default (2026-12-02).
exec nice -n 10 .venv/bin/archhpo run --ladder --confirm-at-rung --no-carry-finalists --experiment t3rung --family lm --data synthetic \
  --order 5 --vocab-size 12 --seq-len 128 --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 \
  --n-heads 2,4,8 --schedule wsd --cooldown 0.2 --learning-rate 3e-3 --weight-decay 1e-4 --batch-size 16 \
  --warmup-steps 50 --epochs 9 --budget 100K --budget 150K --budget 250K --budget 400K --trials 50 --workers 2 \
  --threads 1 --storage "sqlite:///$WORK/t3rung.db" --checkpoint-dir "$WORK/t3ck" --out "$WORK/t3out"
