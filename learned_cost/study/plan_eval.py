"""Whole-plan evaluation on kind="plan" rows: plan latency error and plan-choice regret.

A plan row names its graph (model, shape, dtype) and its groups; the graph is recaptured
(on the meta device: cheap; on the CPU when a meta capture keys differently, as batch norm
and SDPA do) and each group scored by the models of the CV fold that held the plan's
family (or graph) out. The plan's prediction is its groups' predicted latencies summed
raw, and calibrated to plan context (plan_context.py: scale, intercepts and the groups'
feature-dependent in-plan factor) by a PlanContext fitted on the *training* folds' plans
only, per model, so the calibration never sees the plan it scores.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from learned_cost.corrected import default_realization
from learned_cost.data import DESC_PREFIX, plan_groups
from learned_cost.features import analytical_parts, feature_vector, normalize_dtype
from learned_cost.plan_context import (
    PlanContext,
    fit_plan_context,
    fit_plan_context_groups,
    graph_footprint,
)
from learned_cost.study.evaluate import CVResult, PlanMetrics, ape, plan_metrics
from planner.errors import FusionPlannerError
from planner.features import group_descriptor
from planner.hardware import DeviceSpec
from planner.ir.backend_forms import former_keys
from planner.ir.capture import capture
from planner.ir.graph import OpGraph
from zoo import modelspec

# Baselines that learn nothing from features keep the sums-only plan calibration (scale
# and intercepts): an in-plan factor on the groups' features, fitted on plan rows, is a
# learned model of its own and would make "analytical" something else.
SUMS_ONLY = frozenset({"analytical", "mean-bias"})


class GraphCache:
    """Graphs recaptured from a row's (model, shape, dtype), checked against its graph_key.

    A row matches a graph whose key is its graph_key, or whose key under an earlier capture
    that differed only in backend-dependent outputs is (`planner.ir.backend_forms.former_keys`:
    rows collected on a CPU carry batch norm's empty statistics). A row that matches neither
    was captured differently in substance and gets no graph. The capture is tried on the
    meta device, then the CPU, then the GPU where one is present: a model whose graph
    depends on the device it is built on (a Hugging Face model's attention masks) matches
    only where it was measured.

    `capture_fn(model, shape, dtype, device)` replaces the capture (tests pass their own)."""

    def __init__(self, capture_fn: Callable[..., OpGraph | None] | None = None):
        self._graphs: dict[tuple[str, str, str, str], OpGraph | None] = {}
        self._capture_fn = capture_fn or _capture

    def get(self, row: Mapping[str, Any]) -> OpGraph | None:
        want = row.get("graph_key")
        base = (str(row.get("model")), str(row.get("shape") or ""), str(row.get("dtype")))
        # meta first; real tensors where meta keys differ; the GPU where one is present (a
        # model may build its graph by device: Hugging Face attention masks, for one)
        for device in ("meta", "cpu", *(("cuda",) if torch.cuda.is_available() else ())):
            k = (*base, device)
            if k not in self._graphs:
                self._graphs[k] = self._capture_fn(*base, device)
            g = self._graphs[k]
            if g is not None and (not want or g.key == want or want in former_keys(g)):
                return g
        return None  # captured differently than when measured (code changed): skip


def current_descriptors(
    rows: Sequence[Mapping[str, Any]], graphs: GraphCache
) -> list[dict[str, Any]]:
    """Group rows with their `desc_*` columns recomputed on today's capture of their graph,
    the descriptors the planner scores groups with, so the model learns from what it
    will be asked about. A row whose graph no longer captures to its `graph_key` keeps
    what was stored; a row whose group the capture now knows launches nothing (a cast to
    the dtype its input already has is a view) is left out."""
    out = []
    for r in rows:
        graph = graphs.get(r)
        if graph is None:
            out.append(dict(r))
            continue
        desc = group_descriptor(graph, json.loads(r["nodes"]))
        if not desc.get("n_kernels"):
            continue
        out.append({**r, **{f"{DESC_PREFIX}{k}": v for k, v in desc.items()}})
    return out


def _capture(model: str, shape: str, dtype: str, device: str = "meta") -> OpGraph | None:
    try:
        spec = modelspec.resolve(model, shape)
        module, inputs = spec.build(dtype=modelspec.parse_dtype(dtype), device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return capture(module, inputs, name=spec.label)
    except (FusionPlannerError, RuntimeError, TypeError, MemoryError) as e:
        warnings.warn(f"cannot recapture {model} {shape} {dtype} on {device}: {e}", stacklevel=2)
        return None


def plan_group_design(
    graph: OpGraph,
    groups: Sequence[Sequence[int]],
    spec: DeviceSpec,
    dtype: str,
    realizations: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Features and analytical latency of each work group of a plan (`realizations`:
    per group, as the plan was realized; default_realization where not given)."""
    xs, an = [], []
    for k, g in enumerate(groups):
        nodes = frozenset(g)
        desc = group_descriptor(graph, nodes)
        parts = analytical_parts(desc, spec, dtype)
        if parts.latency_s <= 0:
            continue  # a group of views only: free
        real = (
            realizations[k]
            if realizations and k < len(realizations)
            else default_realization(graph, nodes)
        )
        xs.append(feature_vector(desc, dtype=dtype, spec=spec, realization=real, parts=parts))
        an.append(parts.latency_s)
    return (np.vstack(xs) if xs else np.zeros((0, 0))), np.array(an)


@dataclass(frozen=True)
class PlanEval:
    """Per scored plan row: measured latency and each model's predictions."""

    graph_ids: tuple[str, ...]
    measured_s: np.ndarray
    predicted_s: dict[str, np.ndarray]  # calibrated to plan context (training folds only)
    sum_s: dict[str, np.ndarray]  # the plain sum of the groups' predictions
    contexts: dict[str, list[PlanContext]]  # per model, per fold
    skipped: int

    def metrics(self, name: str) -> PlanMetrics:
        m = plan_metrics(self.predicted_s[name], self.measured_s, self.graph_ids)
        if not len(self.measured_s):
            return m
        return replace(m, plan_mape_sum=float(ape(self.sum_s[name], self.measured_s).mean()))


def evaluate_plans(
    plan_rows: Sequence[Mapping[str, Any]],
    cv: CVResult,
    spec_for: Callable[[str], DeviceSpec],
    graphs: GraphCache | None = None,
) -> PlanEval:
    """Every plan row scored by every model of every fold; each row's numbers come from
    the fold that held it out, calibrated by a context fitted on the other folds' plans."""
    graphs = graphs or GraphCache()
    names = list(cv.oof_log_ratio)
    n_folds = len(cv.fitted)
    ids: list[str] = []
    measured: list[float] = []
    own_fold: list[int] = []
    # lat[name][k][i]: predicted latency of each work group of plan i under fold k's model
    lat: dict[str, list[list[np.ndarray]]] = {n: [[] for _ in range(n_folds)] for n in names}
    feats: list[np.ndarray] = []  # each plan's work groups' features (the in-plan factor)
    footprints: list[float] = []  # each plan's graph's (plan_context.graph_footprint)
    skipped = 0
    for r in plan_rows:
        graph = graphs.get(r)
        if graph is None:
            skipped += 1
            continue
        dtype = normalize_dtype(str(r["dtype"]))
        reals = json.loads(r["realizations"]) if r.get("realizations") else None
        spec = spec_for(str(r["device"]))
        X, an = plan_group_design(graph, plan_groups(r), spec, dtype, reals)
        for k, models in enumerate(cv.fitted):
            for name, est in models.items():
                lat[name][k].append(an * np.exp(est.predict(X)) if len(an) else an)
        feats.append(X)
        footprints.append(graph_footprint(graph, spec))
        ids.append(f"{r.get('graph_key')}|{dtype}")
        measured.append(float(r["measured_median_s"]))
        own_fold.append(cv.fold_for(str(r.get(cv.split))))
    m = np.array(measured)
    fold = np.array(own_fold, dtype=int)
    predicted, sums, contexts = {}, {}, {}
    for name in names:
        ctxs = []
        pred, raw = np.zeros(len(m)), np.zeros(len(m))
        for k in range(n_folds):
            train = np.flatnonzero(fold != k)
            train_lat = [lat[name][k][i] for i in train]
            if name in SUMS_ONLY:
                ctx = fit_plan_context(
                    np.array([a.sum() for a in train_lat]),
                    np.array([len(a) for a in train_lat]),
                    m[train],
                )
            else:
                ctx = fit_plan_context_groups(
                    train_lat,
                    [feats[i] for i in train],
                    m[train],
                    footprints=[footprints[i] for i in train],
                )
            ctxs.append(ctx)
            for i in np.flatnonzero(fold == k):
                raw[i] = lat[name][k][i].sum()
                pred[i] = ctx.apply_sum(lat[name][k][i], feats[i], footprints[i])
        predicted[name], sums[name], contexts[name] = pred, raw, ctxs
    return PlanEval(tuple(ids), m, predicted, sums, contexts, skipped)
