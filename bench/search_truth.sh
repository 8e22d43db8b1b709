#!/bin/bash
# How bench/search_truth.csv was made (BENCHMARKS.md section 12): two archhpo studies on the lm
# family's synthetic language, then the table. Run from the checkout; about 1 hour on 2 CPU cores.
set -e
ARCHHPO=${ARCHHPO:-.venv/bin/archhpo}
LADDER=(--budget 75K --budget 100K --budget 150K --budget 200K)
COMMON=(--family lm --data synthetic:tokens=60000 --quick --trials 50 --pruner halving --eta 3 --min-fraction 1/9
        --epochs 9 --learning-rate 3e-3 --batch-size 16 --workers 2)
# 1. every grid architecture, 3 paired seeds, WSD; halving records each rung's cooldown-branch score
"$ARCHHPO" run --experiment truth "${LADDER[@]}" "${COMMON[@]}" --paired-seeds 3 --schedule wsd --cooldown 0.2 \
  --storage sqlite:///truth.db --out truth_results --checkpoint-dir truth_ck
# 2. the same with a cosine schedule, one seed: its losses at the rung epochs are runs cut short
"$ARCHHPO" run --experiment truthcos "${LADDER[@]}" "${COMMON[@]}" --paired-seeds 1 --schedule cosine \
  --storage sqlite:///truthcos.db --out truthcos_results --checkpoint-dir truthcos_ck
# 3. the table, and the rung-score correlations
.venv/bin/python bench/search_truth.py --storage sqlite:///truth.db --experiment truth \
  --cosine-storage sqlite:///truthcos.db --cosine-experiment truthcos --out bench/search_truth.csv --summary
