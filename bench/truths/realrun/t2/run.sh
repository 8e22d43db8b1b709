#!/usr/bin/env bash
# A real T2 ladder run whose outputs lie beside this script (bench/truths/README.md, docs/searching.md):
# `archhpo run --ladder` on T2's budgets up to 400K (Shakespeare as bytes) through 2 Ray workers, with the
# truth's fixed training. Run on 2026-11-26 as WORK=/work/realrun beside the truths' two workers: 100K and
# 200K from 14:25 UTC; 400K, added to the same experiment, from 16:25 UTC on a copy of the committed
# database (its first two budgets reloaded as finished). Re-running it writes to $WORK, not here.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
WORK=${WORK:-/tmp/t2real}
mkdir -p "$WORK"
[[ -f $WORK/shakespeare.txt ]] || bash bench/truths/shakespeare.sh "$WORK/shakespeare.txt"
export RAY_USAGE_STATS_ENABLED=0
exec nice -n 10 .venv/bin/archhpo run --ladder --experiment t2real --family lm --data "$WORK/shakespeare.txt" \
  --seq-len 128 --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 --n-heads 2,4,8 --schedule wsd \
  --cooldown 0.2 --learning-rate 3e-3 --weight-decay 1e-4 --batch-size 16 --warmup-steps 50 --epochs 9 \
  --budget 100K --budget 200K --budget 400K --trials 50 --workers 2 --threads 1 \
  --storage "sqlite:///$WORK/t2real.db" --checkpoint-dir "$WORK/t2ck" --out "$WORK/t2out"
