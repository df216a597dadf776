"""`joint-tpe`, `joint-nsga2`, `joint-rl`: search partition and realization together.

The space is search/joint_space.py's (partition decisions, merge moves, one realization
label per group), searched by search/joint_search.py. The partition of the result is the
best point's; `SearchResult.extra["variants"]` ranks every distinct point found as
(partition, labels, predicted seconds, found by, copies) rows, best first (priority's warm start
always among them), which the tune loop
realizes with their labels and measures, and `extra["found_by"]` says what found the
best (priority's warm start, enumeration, a trial or an episode). `joint-tpe` and
`joint-nsga2` need optuna; `joint-rl` does not.

`max_trials` (samples) defaults to the budget: with a budget in seconds or evaluations
the search runs until it is spent (or `patience` samples in a row find no new plan, or
the space is exhausted); with no budget at all, 200 samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.fusion.partition import Partition
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.joint_search import WARM, JointOutcome, best_partition, describe, run_joint
from search.optuna_storage import require_optuna
from search.strategy import Budget, Clock, SearchResult, Strategy, register

DEFAULT_TRIALS = 200  # samples when neither trials nor a budget bound the search
UNBOUNDED_TRIALS = 1_000_000


class _Joint(Strategy):
    method = ""
    deterministic = False

    def __init__(
        self,
        *,
        max_trials: int | None = None,
        patience: int = 60,
        enumerate_up_to: int = 64,
        keep: int = 16,
        **_ignored: Any,
    ):
        self.options = {
            "max_trials": max_trials,
            "patience": patience,
            "enumerate_up_to": enumerate_up_to,
        }
        self.keep = keep
        self._out: JointOutcome | None = None  # set by each search call, read by plan

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        opts = dict(self.options)
        if opts["max_trials"] is None:  # a budget bounds the search; without one, a cap
            b = clock.budget
            bounded = b.max_evals is not None or b.max_seconds is not None
            opts["max_trials"] = UNBOUNDED_TRIALS if bounded else DEFAULT_TRIALS
        self._out = out = run_joint(graph, objective, clock, method=self.method, seed=seed, **opts)
        return best_partition(graph, out), out.complete, describe(out)

    def plan(
        self,
        graph: OpGraph,
        objective: Objective,
        budget: Budget | None = None,
        seed: int = 0,
    ) -> SearchResult:
        self._out = None
        result = super().plan(graph, objective, budget, seed)
        out, self._out = self._out, None
        if out is None or out.best is None or out.best.variant.partition != result.partition:
            return result
        kept = out.ranked[: self.keep]
        kept += [f for f in out.ranked[self.keep :] if f.found_by == WARM]
        rows = [
            (f.variant.partition, f.variant.labels, f.predicted_s, f.found_by, f.variant.copies)
            for f in kept
        ]
        extra = {"variants": rows, "found_by": out.best.found_by, "exhausted": out.exhausted}
        return dataclasses.replace(result, extra=extra)


@register
class JointTPEStrategy(_Joint):
    name = "joint-tpe"
    method = "tpe"

    def __init__(self, **kw: Any):
        require_optuna()
        super().__init__(**kw)


@register
class JointNSGA2Strategy(_Joint):
    name = "joint-nsga2"
    method = "nsga2"

    def __init__(self, **kw: Any):
        require_optuna()
        super().__init__(**kw)


@register
class JointRLStrategy(_Joint):
    name = "joint-rl"
    method = "rl"
