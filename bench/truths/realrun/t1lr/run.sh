#!/usr/bin/env bash
# T1's learning-rate target (issue 32 part 4: the rate `--ladder` carries to the largest budget within
# x/÷1.5 of the swept best): a real `archhpo run --ladder` on T1's settings with the learning rate
# SEARCHED within 1e-3:3e-2 (the truths' fixed 3e-3 lies inside it; the default 1e-4:1e-3 does not),
# through 1 niced worker beside the truths' two. It takes about 10 worker-hours, so it runs in parts:
#
#   bench/truths/realrun/t1lr/run.sh start    # in the background (resumes a stopped run: finished trials stay)
#   bench/truths/realrun/t1lr/run.sh stop     # SIGTERM (the running trial is saved between two steps), then save
#   bench/truths/realrun/t1lr/run.sh save     # copy the live database (t1lrreal.db) and checkpoints (ck/) here
#
# Once its 800K is planned, `lr_sweep.py judge --table ... --budget 800K --ladder
# sqlite:///bench/truths/realrun/t1lr/t1lrreal.db --study t1lrreal_800K-h2+4+8-t10` grades the carried
# rate against T1's 800K sweep (bench/truths/README.md).
# --no-confirm-at-rung: launched before --confirm-at-rung became --ladder's default (2026-11-29), it keeps
# the options its studies were stored with (the same studies; a relaunch without it is accepted too).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
HERE=bench/truths/realrun/t1lr
WORK=${WORK:-/work/realrun/t1lr}
DB=t1lrreal.db
export RAY_USAGE_STATS_ENABLED=0
# shellcheck source=bench/truths/realrun/parts.sh
source bench/truths/realrun/parts.sh

launch() {
  # --no-carry-finalists: launched before --carry-finalists became --ladder's default (2026-12-02).
  exec nice -n 10 .venv/bin/archhpo run --ladder --no-confirm-at-rung --no-carry-finalists --experiment t1lrreal --family lm --data synthetic --seq-len 128 \
    --tokens-per-param 10 --data-seed 0 --seed 7 --tolerance 0.15 --n-heads 2,4,8 --schedule wsd --cooldown 0.2 \
    --learning-rate 1e-3:3e-2 --weight-decay 1e-4 --batch-size 16 --warmup-steps 50 --epochs 9 \
    --budget 100K --budget 200K --budget 400K --budget 800K --trials 12 --workers 1 --threads 1 \
    --storage "sqlite:///$WORK/t1lrreal.db" --checkpoint-dir "$WORK/ck" --out "$WORK/out"
}

parts "$@"
