"""A group's cost inside a realized plan versus alone: the plan-level calibration.

Group rows time one group compiled and run alone; a plan runs its groups back to back, with
the executor's glue between them (boundary tensors handed on, input guards) and, on GPU, a
CUDA graph that removes most launch overhead. So a measured plan need not be the plain sum
of its groups' alone-latencies. The calibration learned from plan rows is

    C_in_plan(G) = scale * C(G) + per_group_s          (floored at FLOOR * C(G))
    plan latency = sum over work groups of C_in_plan(G) + per_plan_s

fitted by iteratively reweighted least squares on relative error (Huber weights, so a
few plans timed while the machine was busy do not drag it). `per_group_s` is what one
more group costs in a plan beyond its own time (negative where CUDA graphs hide launches):
it is the part that changes which plan ranks first. `per_plan_s` is the executor's fixed
cost per call; it is the same for every plan of a graph, so it is left out of group costs
(and of the planner's objective) and added only where a whole plan's latency is predicted.

How far from additive the data are, with the groups' *measured* latencies, is printed by
`python benchmarks/plan_additivity.py DATA`. On the H100 (collector version 3: groups and
plans both timed as kernels in one CUDA graph) the plain sum is already within 5% on
average and the form changes little; where plan rows time whole calls from the host (the
CPU data, the `call_median_s` column) the form takes out the host's per-call cost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FLOOR = 0.2  # a group in a plan never costs less than this fraction of its alone-latency


@dataclass(frozen=True)
class PlanContext:
    scale: float = 1.0
    per_group_s: float = 0.0
    per_plan_s: float = 0.0
    n_plans: int = 0  # plan rows it was fitted on (0: identity, nothing learned)

    def apply(self, latency_s: float) -> float:
        if latency_s <= 0:
            return latency_s
        return max(self.scale * latency_s + self.per_group_s, FLOOR * latency_s)

    def apply_sum(self, group_latencies_s: np.ndarray) -> float:
        """Predicted plan latency from its work groups' latencies."""
        lat = np.asarray(group_latencies_s, dtype=np.float64)
        per_group = np.maximum(self.scale * lat + self.per_group_s, FLOOR * lat)
        return max(float(per_group.sum()) + self.per_plan_s, FLOOR * float(lat.sum()))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> PlanContext:
        return cls(**data) if data else cls()


def fit_plan_context(
    sum_s: np.ndarray,
    n_groups: np.ndarray,
    measured_s: np.ndarray,
    *,
    huber: float = 0.15,
    iters: int = 30,
    min_plans: int = 5,
) -> PlanContext:
    """Fit measured ~ scale * sum + per_group_s * n_groups + per_plan_s, minimizing
    relative error.

    Fewer than `min_plans` plans: the identity (scale 1, nothing per group)."""
    s, n, m = (np.asarray(a, dtype=np.float64) for a in (sum_s, n_groups, measured_s))
    ok = (s > 0) & (m > 0) & np.isfinite(s) & np.isfinite(m)
    s, n, m = s[ok], n[ok], m[ok]
    if len(m) < min_plans:
        return PlanContext()
    A = np.column_stack([s / m, n / m, 1.0 / m])
    w = np.ones(len(m))
    coef = np.array([1.0, 0.0, 0.0])
    for _ in range(iters):
        sw = np.sqrt(w)
        coef = np.linalg.lstsq(A * sw[:, None], sw, rcond=None)[0]
        r = np.abs(A @ coef - 1.0)
        w = np.where(r <= huber, 1.0, huber / np.maximum(r, 1e-12))
    scale = float(np.clip(coef[0], 0.2, 5.0))
    return PlanContext(
        scale=scale, per_group_s=float(coef[1]), per_plan_s=float(coef[2]), n_plans=len(m)
    )
