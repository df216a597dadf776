"""`tpe`: Optuna's multivariate TPE over the contested-decision encoding.

The search space is search/encoding.py's: yes/no decisions that steer priority's merge
process (forbid a contested merge, skip a fused-kernel pattern), decoded to a legal
partition; the analytical (or learned) cost model scores each trial. Warm-started with
priority's and greedy's plans, so it never returns worse than priority; small spaces are
enumerated. Budgets: `max_trials`, `patience`, and the Strategy budget (evaluations,
seconds). Reproducible for a seed when the budget is in trials or evaluations (a seconds
budget stops wherever the clock says).

Storage: in memory by default; `storage="journal:/path"` or a database URL shares the
study of (graph, bucket) between processes (search/optuna_storage.py, search/parallel.py).

Needs optuna; without it the strategy is still registered and raises a FusionPlannerError
saying how to install it when used.
"""

from __future__ import annotations

from typing import Any

from planner.errors import FusionPlannerError
from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.optuna_search import OptunaSettings, optimize
from search.optuna_storage import require_optuna
from search.strategy import Clock, Strategy, register

SAMPLERS = ("tpe", "random")


@register
class TPEStrategy(Strategy):
    name = "tpe"
    deterministic = False

    def __init__(self, *, n_startup_trials: int = 10, sampler: str = "tpe", **settings: Any):
        require_optuna()  # a clear error now, not an unfused plan with a note later
        if sampler not in SAMPLERS:
            raise FusionPlannerError(f"sampler {sampler!r}: expected one of {SAMPLERS}")
        self.n_startup_trials = n_startup_trials
        self.sampler = sampler
        self.settings = OptunaSettings(**settings)

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        opt = require_optuna()
        if self.sampler == "random":  # the baseline TPE must beat (docs/search.md)
            sampler = opt.samplers.RandomSampler(seed=seed)
        else:
            sampler = opt.samplers.TPESampler(
                multivariate=True,
                n_startup_trials=self.n_startup_trials,
                seed=seed,
                constant_liar=True,  # parallel workers do not all sample the same point
            )
        out = optimize(
            graph, objective, clock, sampler=sampler, settings=self.settings, label=self.name
        )
        return out.partition, out.complete, out.notes
