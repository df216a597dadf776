"""A group's cost inside a realized plan versus alone: the plan-level calibration.

Group rows time one group compiled and run alone; a plan runs its groups back to back, with
the executor's glue between them (boundary tensors handed on, input guards) and, on GPU, a
CUDA graph that removes most launch overhead. So a measured plan need not be the plain sum
of its groups' alone-latencies. The calibration learned from plan rows is

    C_in_plan(G) = scale * C(G) * f(G) + per_group_s   (floored at FLOOR * C(G))
    plan latency = sum over work groups of C_in_plan(G) + per_plan_s

with f(G) = exp(w . z(G)) on the group's standardized features, fitted where there are
enough plans (`fit_plan_context_groups`; f = 1 in the sums-only `fit_plan_context`), all
fitted on relative error with a Huber loss, so a few plans timed while the machine was
busy do not drag it. Given each plan's graph footprint, z(G) also has three columns of
the graph as a whole (GRAPH_FEATURES): a group whose tensors fit the L2 when it is
replayed alone keeps them there inside a plan only while the whole graph's tensors fit
too. The graph is the same for every plan of it, so f(G) is still a cost of the group
once its graph is known, and the planner's objective stays a sum over groups.
`per_group_s` is what one more group costs in a plan beyond its own time (negative where
CUDA graphs hide launches): it is the part that changes which plan ranks first.
`per_plan_s` is the executor's fixed cost per call; it is the same for every plan of a
graph, so it is left out of group costs (and of the planner's objective) and added only
where a whole plan's latency is predicted.

How far from additive the data are, with the groups' *measured* latencies, and how much
of that each form takes out, is printed by `python benchmarks/plan_additivity.py DATA
--residual` (the H100 figures are in docs/design_notes.md). Where plan rows time whole calls
from the host (the CPU data, the `call_median_s` column) the form takes out the host's
per-call cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from learned_cost.features import FEATURE_NAMES
from planner.hardware import DeviceSpec
from planner.ir.graph import OpGraph

FLOOR = 0.2  # a group in a plan never costs less than this fraction of its alone-latency
LOG_CAP = math.log(3.0)  # the feature-dependent factor stays within 1/3x..3x
MIN_PLANS_FOR_WEIGHTS = 50  # fewer plans: scale and intercepts only

# Columns of the graph as a whole that the in-plan factor may read besides the group's own
# features, in this order, from the graph's footprint a = log10(its tensors' bytes / L2):
GRAPH_FEATURES = (
    "graph_footprint_over_l2",  # a
    "fits_alone_x_graph_over_l2",  # fits alone * max(a, 0): how far the graph overflows
    "fits_alone_and_graph_over_l2",  # fits alone * (a > 0)
)
# "fits alone": the group's boundary bytes are below the L2 size (its features say so).
_WORKING_SET = FEATURE_NAMES.index("working_set_over_l2")


def graph_footprint(graph: OpGraph, spec: DeviceSpec) -> float:
    """log10 of the bytes of all the graph's tensors (a view counted once, as its root)
    over the device's L2 size: above 0, a plan replayed back to back cannot keep the
    whole graph in L2, whatever groups it makes."""
    total = sum(t.nbytes for t in graph.tensors if t.alias_of is None)
    return math.log10(max(total, 1) / max(spec.l2_bytes, 1))


def with_graph_features(X: np.ndarray, footprint: float) -> np.ndarray:
    """Group features (rows of X, learned_cost.features order) with GRAPH_FEATURES
    appended for a graph of footprint `footprint` (graph_footprint)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] <= _WORKING_SET:
        raise ValueError(
            f"group features of shape {X.shape}: want (n, {len(FEATURE_NAMES)}) "
            "(learned_cost.features.FEATURE_NAMES; a model of an earlier schema: its own, "
            "the first columns of those)"
        )
    if not math.isfinite(footprint):
        raise ValueError(f"graph footprint must be finite, got {footprint}")
    fits = (X[:, _WORKING_SET] < 0).astype(np.float64)
    n = len(X)
    return np.column_stack(
        [X, np.full(n, footprint), fits * max(footprint, 0.0), fits * float(footprint > 0)]
    )


@dataclass(frozen=True)
class PlanContext:
    scale: float = 1.0
    per_group_s: float = 0.0
    per_plan_s: float = 0.0
    n_plans: int = 0  # plan rows it was fitted on (0: identity, nothing learned)
    # The in-plan factor of a group: exp(weights . (x - mean) / std) over its feature
    # vector x (learned_cost.features), capped at exp(LOG_CAP) either way; () where none
    # was fitted (too few plans, or a context fitted on sums alone).
    weights: tuple[float, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    # GRAPH_FEATURES where the weights also cover those columns of the group's graph (the
    # callers then pass its `footprint`); () for a context fitted without them
    graph_features: tuple[str, ...] = ()

    @property
    def needs_footprint(self) -> bool:
        return bool(self.weights and self.graph_features)

    def factors(self, X: np.ndarray | None, n: int, footprint: float | None = None) -> np.ndarray:
        """The in-plan factor of each of `n` groups (rows of X; `footprint`: their graph's,
        graph_footprint, which a context with graph features needs); 1 without weights."""
        if not self.weights or X is None or not n:
            return np.ones(n)
        X = np.asarray(X, dtype=np.float64).reshape(n, -1)
        if self.graph_features:
            if self.graph_features != GRAPH_FEATURES:
                raise ValueError(
                    f"plan context fitted on graph features {list(self.graph_features)}; "
                    f"this version knows {list(GRAPH_FEATURES)}: refit it"
                )
            if footprint is None:
                raise ValueError(
                    "this plan context reads the graph's footprint: pass footprint="
                    "graph_footprint(graph, spec)"
                )
            X = with_graph_features(X, footprint)
        if X.shape[1] != len(self.weights):
            raise ValueError(f"{X.shape[1]} features for {len(self.weights)} weights")
        z = (X - np.array(self.mean)) / np.array(self.std)
        return np.exp(np.clip(z @ np.array(self.weights), -LOG_CAP, LOG_CAP))

    def in_plan(
        self,
        latencies_s: Sequence[float],
        X: np.ndarray | None = None,
        footprint: float | None = None,
    ) -> np.ndarray:
        """Each work group's cost in a plan from its cost alone (and its features, rows of
        X, and its graph's footprint): the per-group term of `apply_sum`, for a batch of
        groups at once."""
        lat = np.asarray(latencies_s, dtype=np.float64)
        f = self.factors(X, len(lat), footprint)
        return np.maximum(self.scale * lat * f + self.per_group_s, FLOOR * lat)

    def apply(
        self, latency_s: float, x: np.ndarray | None = None, footprint: float | None = None
    ) -> float:
        """A group's cost in a plan from its cost alone (and its features `x`)."""
        if latency_s <= 0:
            return latency_s
        return float(self.in_plan([latency_s], None if x is None else [x], footprint)[0])

    def apply_sum(
        self,
        group_latencies_s: np.ndarray,
        X: np.ndarray | None = None,
        footprint: float | None = None,
    ) -> float:
        """Predicted plan latency from its work groups' latencies (and features X, and
        their graph's footprint)."""
        lat = np.asarray(group_latencies_s, dtype=np.float64)
        per_group = self.in_plan(lat, X, footprint)
        return max(float(per_group.sum()) + self.per_plan_s, FLOOR * float(lat.sum()))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> PlanContext:
        if not data:
            return cls()
        data = dict(data)
        for k in ("weights", "mean", "std"):
            data[k] = tuple(float(v) for v in data.get(k, ()))
        data["graph_features"] = tuple(str(v) for v in data.get("graph_features", ()))
        return cls(**data)


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


def fit_plan_context_groups(
    latencies_s: Sequence[np.ndarray],
    features: Sequence[np.ndarray],
    measured_s: np.ndarray,
    *,
    footprints: Sequence[float] | None = None,
    ridge: float = 1.0,
    huber: float = 0.15,
) -> PlanContext:
    """Fit measured ~ sum_G (scale * C(G) * exp(w . z(G)) + per_group_s) + per_plan_s,
    z(G) the group's standardized features: what a group costs in a plan beyond its
    alone-latency, by what the group is (an L2-resident GEMM alone whose weights a plan
    evicts, a small kernel whose launch a CUDA graph hides). With `footprints` (each plan's
    graph_footprint) z(G) has GRAPH_FEATURES too: whether the graph as a whole fits the
    L2 decides whether such a GEMM keeps its weights there. Relative error, Huber loss
    (as `fit_plan_context`), a ridge penalty on w. The factor is per group, so the
    planner's additive objective can use it. Fewer than MIN_PLANS_FOR_WEIGHTS plans: the
    sums-only fit."""
    from scipy.optimize import least_squares  # training only: the runtime never fits

    lat = [np.asarray(a, dtype=np.float64) for a in latencies_s]
    m = np.asarray(measured_s, dtype=np.float64)
    base = fit_plan_context(
        np.array([a.sum() for a in lat]), np.array([len(a) for a in lat]), m, huber=huber
    )
    keep = [
        i
        for i, a in enumerate(lat)
        if len(a) and m[i] > 0 and np.isfinite(m[i]) and features[i] is not None
    ]
    if len(keep) < MIN_PLANS_FOR_WEIGHTS:
        return base
    if footprints is not None and len(footprints) != len(lat):
        raise ValueError(f"{len(footprints)} footprints for {len(lat)} plans")

    def design(i: int) -> np.ndarray:
        X = np.asarray(features[i], dtype=np.float64).reshape(len(lat[i]), -1)
        return X if footprints is None else with_graph_features(X, float(footprints[i]))

    Z = np.vstack([design(i) for i in keep])
    t = np.concatenate([lat[i] for i in keep])
    plan_of = np.repeat(np.arange(len(keep)), [len(lat[i]) for i in keep])
    n_groups = np.bincount(plan_of).astype(np.float64)
    mk = m[keep]
    mean = Z.mean(axis=0)
    std = Z.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)  # a constant feature (one device) adds nothing
    Zs = (Z - mean) / std
    us = 1e-6  # intercepts fitted in microseconds: the parameters stay of one scale

    def residuals(p: np.ndarray) -> np.ndarray:
        f = np.exp(np.clip(Zs @ p[3:], -LOG_CAP, LOG_CAP))
        pred = np.bincount(plan_of, weights=p[0] * t * f, minlength=len(keep))
        pred += p[1] * us * n_groups + p[2] * us
        return np.concatenate([pred / mk - 1.0, math.sqrt(ridge) * p[3:]])

    p0 = np.concatenate(
        [[base.scale, base.per_group_s / us, base.per_plan_s / us], np.zeros(Zs.shape[1])]
    )
    p = least_squares(residuals, p0, loss="huber", f_scale=huber).x
    return PlanContext(
        scale=float(np.clip(p[0], 0.2, 5.0)),
        per_group_s=float(p[1] * us),
        per_plan_s=float(p[2] * us),
        n_plans=len(keep),
        weights=tuple(float(w) for w in p[3:]),
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        graph_features=GRAPH_FEATURES if footprints is not None else (),
    )
