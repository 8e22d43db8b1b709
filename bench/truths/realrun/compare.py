"""A real `archhpo run --ladder` through the workers on T1's 100K and 200K (issue 32 part 4), graded
by the truth: its choice per budget against the truth's all-seed means (its trials are new draws, so
the truth's seeds are all held out from it), and its FLOPs against the design's plan for its plan seed.

    python bench/truths/realrun/compare.py      # reads t1real.db and the best JSONs beside it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/: _replay_table, search_efficiency
sys.path.insert(0, str(HERE.parents[2]))  # the checkout

import optuna  # noqa: E402
import search_efficiency as se  # noqa: E402
from _replay_table import load_table  # noqa: E402

PLAN_SEED, TRIALS = 7, 50  # the run's --seed and --trials


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = load_table(HERE.parent / "t1_partial_100K-400K.csv")
    budgets = [b for b in table if not b.name.startswith("400K")]
    url = f"sqlite:///{HERE / 't1real.db'}"
    total_real = total_design = 0.0
    for b in budgets:
        study = optuna.load_study(study_name=f"t1real_{b.name}", storage=url)
        trials = [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        spent = sum(float(t.user_attrs.get("flops_spent") or 0) for t in trials)
        by = {(a.d_model, a.n_layers, a.n_heads, a.d_ff): a for a in b.archs.values()}
        best_json = json.loads((HERE / f"t1real_{b.name}_best.json").read_text())
        arch = best_json["architecture"]
        chosen = by[(arch["d_model"], arch["n_layers"], arch["n_heads"], arch["d_ff"])]
        best = min(b.archs.values(), key=lambda a: a.mean)
        design = sum(b.archs[i].epochs * b.archs[i].flops_per_epoch for i in se.design_plan(b, TRIALS, PLAN_SEED))
        total_real += spent
        total_design += design
        print(f"{b.name}: {len(trials)} trials, chose d{chosen.d_model}-L{chosen.n_layers}-h{chosen.n_heads} "
              f"(truth mean {chosen.mean:.4f}; best d{best.d_model}-L{best.n_layers}-h{best.n_heads} {best.mean:.4f}; "
              f"regret {(chosen.mean - best.mean) / b.seed_std:.2f} std of {b.seed_std:.4f}); "
              f"FLOPs {spent:.3e} against the design's {design:.3e} = {spent / design:.3f}")
    print(f"total FLOPs ratio {total_real / total_design:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
