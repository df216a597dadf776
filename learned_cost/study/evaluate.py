"""Held-out evaluation of cost models: grouped cross-validation, group and plan metrics.

Splits are by graph, never by row (a model scored on groups of graphs it trained on
proves nothing): GroupKFold over `family` (whole model families held out: the strict
test, an unseen architecture) or over `graph_key` (unseen shapes of seen families).
Every model is fitted on the training folds and predicts the held-out fold, so each row
gets exactly one out-of-fold prediction per model.

Metrics (on held-out rows):
- group level: MAPE, median APE, Kendall tau between predicted and measured latency over
  all held-out groups, and tau within each graph (mean over graphs: does the model order
  the candidate groups of one graph right? The pooled tau is flattered by scale: a 1 ms
  GEMM and a 5 us add are easy to order);
- repeatability (the noise floor): groups measured more than once with identical
  descriptors (the same ops on the same shapes, in another graph or plan), each predicted
  by the median of its twins. No model that sees only the descriptor can do much better
  on those rows, so it bounds what MAPE and tau can reach on this data;
- plan level (kind="plan" rows, the graph recaptured on the meta device): whole-plan
  latency error, predicted = sum of the plan's corrected group costs; plan-choice regret
  per graph = measured latency of the plan the model ranks first / best measured - 1.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import kendalltau
from sklearn.model_selection import GroupKFold

from learned_cost.data import descriptor_of
from learned_cost.features import Design, design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.study.baselines import (
    AnalyticalOnly,
    GBTCorrection,
    MeanBias,
    RidgeCorrection,
    TwinsOver,
)
from planner.errors import CostModelError
from planner.hardware import DeviceSpec

if TYPE_CHECKING:  # plan_eval builds on this module; the type is only named here
    from learned_cost.study.plan_eval import PlanEval

log = logging.getLogger(__name__)

Estimator = Any  # fit(X, y) -> self; predict(X) -> log-ratios
Factory = Callable[[int], Estimator]
# keys of the rows, number of folds -> (train, test) row indices per fold
Splitter = Callable[[np.ndarray, int], Iterable[tuple[np.ndarray, np.ndarray]]]

# The models compared side by side: (name, factory(seed), why it is in the table). A name
# ending in TWINS is the model before it with measured twins in front (learned_cost/twins.py),
# built from that model's fit in each fold rather than fitted again.
TWINS = "+twins"
MODELS: tuple[tuple[str, Factory, str], ...] = (
    ("analytical", lambda s: AnalyticalOnly(), "the roofline alone: what must be improved"),
    ("mean-bias", lambda s: MeanBias(), "one scale factor: the floor a learned model must beat"),
    ("ridge", lambda s: RidgeCorrection(random_state=s), "linear in the same features"),
    ("gbt", lambda s: GBTCorrection(random_state=s), "gradient-boosted trees, same features"),
    (
        "gbt+twins",
        lambda s: TwinsOver("gbt", random_state=s),
        "gbt, a group measured in the training rows answered by its measurements",
    ),
    ("mlp-free", lambda s: CorrectionMLP(form="free", random_state=s), "MLP, unbounded log-ratio"),
    (
        "mlp-roofline",
        lambda s: CorrectionMLP(form="roofline", random_state=s),
        "MLP predicting the fraction of each roof reached (NeuSight-style, never above peak)",
    ),
    (
        "mlp-mixed",
        lambda s: CorrectionMLP(form="mixed", random_state=s),
        "the mean of the two MLPs' log-ratios",
    ),
    *(
        (
            f"mlp-{form}{TWINS}",
            lambda s, form=form: CorrectionMLP(form=form, twins=True, random_state=s),
            f"mlp-{form}, a group measured in the training rows answered by its measurements",
        )
        for form in ("free", "roofline", "mixed")
    ),
)
MODEL_NAMES = tuple(name for name, _, _ in MODELS)
# What a learned model should reach on held-out H100 groups and plans (docs/learned_cost.md).
HELD_OUT_TARGETS = {"mape": 0.10, "plan_error": 0.05, "kendall_tau": 0.90, "regret": 0.03}


# ---- metrics -------------------------------------------------------------------------------
def ape(pred_s: np.ndarray, measured_s: np.ndarray) -> np.ndarray:
    """Absolute percentage error per row: |pred - measured| / measured."""
    return np.abs(pred_s - measured_s) / measured_s


def _tau(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(kendalltau(a, b).statistic)


@dataclass(frozen=True)
class GroupMetrics:
    n: int
    mape: float
    median_ape: float
    p90_ape: float
    kendall_tau: float  # pooled over all held-out groups
    kendall_tau_within: float  # mean over graphs with >= 3 groups


def group_metrics(
    pred_s: np.ndarray, measured_s: np.ndarray, graph_ids: np.ndarray
) -> GroupMetrics:
    e = ape(pred_s, measured_s)
    taus = []
    for g in np.unique(graph_ids):
        m = graph_ids == g
        if m.sum() >= 3:
            t = _tau(pred_s[m], measured_s[m])
            if math.isfinite(t):
                taus.append(t)
    return GroupMetrics(
        n=len(e),
        mape=float(e.mean()) if len(e) else float("nan"),
        median_ape=float(np.median(e)) if len(e) else float("nan"),
        p90_ape=float(np.quantile(e, 0.9)) if len(e) else float("nan"),
        kendall_tau=_tau(pred_s, measured_s),
        kendall_tau_within=float(np.mean(taus)) if taus else float("nan"),
    )


@dataclass(frozen=True)
class Repeatability:
    """The noise floor of a dataset, from groups it measured more than once.

    `rows` are the indices (into the rows given) of groups with at least one identical twin
    (same descriptor, dtype, realization and device); `metrics` scores predicting each by
    the median of its twins' latencies (leave-one-out), as a perfect descriptor-only model
    with few samples would."""

    n_sets: int
    rows: np.ndarray
    metrics: GroupMetrics | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_sets": self.n_sets,
            "n_rows": len(self.rows),
            "twin_median": asdict(self.metrics) if self.metrics else None,
        }


def repeatability(rows: Sequence[Mapping[str, Any]]) -> Repeatability:
    """Identical groups measured more than once, each predicted by its twins' median."""
    sets: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        desc = descriptor_of(r)
        key = (
            tuple(sorted((k, str(v)) for k, v in desc.items())),
            str(r.get("dtype")),
            str(r.get("realization")),
            str(r.get("device")),
        )
        sets.setdefault(key, []).append(i)
    twins = [v for v in sets.values() if len(v) > 1]
    idx = np.array(sorted(i for v in twins for i in v), dtype=int)
    if not len(idx):
        return Repeatability(0, idx, None)
    measured = np.array([float(rows[i]["measured_median_s"]) for i in range(len(rows))])
    pred = np.zeros(len(rows))
    for v in twins:
        for i in v:
            pred[i] = np.median(measured[[j for j in v if j != i]])
    graphs = np.array([str(rows[i].get("graph_key")) for i in idx], dtype=object)
    return Repeatability(len(twins), idx, group_metrics(pred[idx], measured[idx], graphs))


@dataclass(frozen=True)
class PlanMetrics:
    n_plans: int
    plan_mape: float  # whole-plan latency error, mean over plans
    plan_median_ape: float
    n_graphs: int  # graphs with >= 2 measured candidate plans
    mean_regret: float
    max_regret: float
    plan_mape_sum: float = float("nan")  # error of the plain sum, before plan calibration


def plan_metrics(
    pred_s: np.ndarray, measured_s: np.ndarray, graph_ids: Sequence[str]
) -> PlanMetrics:
    e = ape(pred_s, measured_s) if len(pred_s) else np.zeros(0)
    ids = np.asarray(graph_ids, dtype=object)
    regrets = []
    for g in dict.fromkeys(ids):
        m = np.flatnonzero(ids == g)
        if len(m) >= 2:
            chosen = m[int(np.argmin(pred_s[m]))]
            regrets.append(measured_s[chosen] / measured_s[m].min() - 1.0)
    nan = float("nan")
    return PlanMetrics(
        n_plans=len(e),
        plan_mape=float(e.mean()) if len(e) else nan,
        plan_median_ape=float(np.median(e)) if len(e) else nan,
        n_graphs=len(regrets),
        mean_regret=float(np.mean(regrets)) if regrets else nan,
        max_regret=float(np.max(regrets)) if regrets else nan,
    )


# ---- cross-validation -------------------------------------------------------------------------
@dataclass
class CVResult:
    """Out-of-fold predictions of every model, and the fitted models per fold."""

    split: str  # "family" | "graph_key"
    design: Design
    graph_ids: np.ndarray  # graph_key per row (for tau within a graph)
    fold: np.ndarray  # fold index of each row
    held_out: list[set[str]]  # split keys held out in each fold
    oof_log_ratio: dict[str, np.ndarray]
    fitted: list[dict[str, Estimator]] = field(default_factory=list)

    def predicted_s(self, name: str) -> np.ndarray:
        return self.design.analytical_s * np.exp(self.oof_log_ratio[name])

    def fold_for(self, key: str) -> int:
        """A fold whose models never saw `key` (the fold holding it out, else fold 0)."""
        for i, keys in enumerate(self.held_out):
            if key in keys:
                return i
        return 0


def cross_validate(
    rows: Sequence[Mapping[str, Any]],
    spec_for: Callable[[str], DeviceSpec],
    *,
    split: str = "family",
    n_splits: int = 5,
    seed: int = 0,
    models: Sequence[tuple[str, Factory, str]] = MODELS,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    splitter: Splitter | None = None,
) -> CVResult:
    """GroupKFold over `split` (a row column); every model in `models` fitted per fold.

    `overrides[name]` sets hyper-parameters of that model (e.g. fewer MLP steps in tests).
    `splitter(keys, n_splits)` replaces GroupKFold: it yields (train, test) row indices
    and must keep each key on one side (learned_cost.study.heldout.shuffled_group_folds).
    """
    design = design_matrix(rows, spec_for, group_by=split)
    keys = design.groups
    n_groups = len(set(keys))
    if n_groups < 2:
        raise CostModelError(
            f"grouped cross-validation over {split!r} needs rows of at least 2 distinct "
            f"values, got {n_groups}: collect more models/shapes or use another split"
        )
    folds = min(n_splits, n_groups)
    y = design.y
    fold = np.zeros(len(design), dtype=int)
    held_out: list[set[str]] = []
    oof = {name: np.zeros(len(design)) for name, _, _ in models}
    fitted: list[dict[str, Estimator]] = []
    t0 = time.perf_counter()
    pairs = (
        splitter(keys, folds)
        if splitter is not None
        else GroupKFold(n_splits=folds).split(design.X, y, keys)
    )
    for k, (tr, te) in enumerate(pairs):
        fold[te] = k
        held_out.append(set(keys[te]))
        per_fold = {}
        for name, make, _ in models:
            est = make(seed)
            if overrides and name in overrides:
                est.set_params(**overrides[name])
            derived = _mixed_from(est, per_fold)
            if derived is None:
                derived = _twins_from(name, est, per_fold, design.X[tr], y[tr])
            est = derived if derived is not None else est.fit(design.X[tr], y[tr])
            oof[name][te] = est.predict(design.X[te])
            per_fold[name] = est
        fitted.append(per_fold)
        log.info(
            "held out by %s: fold %d/%d fitted (%d models, %d rows; %.0f s so far)",
            split,
            k + 1,
            folds,
            len(per_fold),
            len(tr),
            time.perf_counter() - t0,
        )
    graph_ids = np.array([str(r.get("graph_key")) for r in rows], dtype=object)
    return CVResult(split, design, graph_ids, fold, held_out, oof, fitted)


def _mixed_from(est: Estimator, fitted: Mapping[str, Estimator]) -> CorrectionMLP | None:
    """A mixed MLP is the free and the roofline MLP of the fold side by side (the same
    networks, seed for seed, as fitting it would give): built from them where both were
    fitted with its settings, which halves what the comparison costs. None: fit it."""
    if not (isinstance(est, CorrectionMLP) and est.form == "mixed"):
        return None
    free, roof = fitted.get("mlp-free"), fitted.get("mlp-roofline")
    if not (isinstance(free, CorrectionMLP) and isinstance(roof, CorrectionMLP)):
        return None
    try:  # mixed_of checks that the parts share every other setting and their rows
        mixed = CorrectionMLP.mixed_of(free, roof)
    except CostModelError:
        return None
    return mixed if mixed.get_params() == est.get_params() else None


def _twins_from(
    name: str, est: Estimator, fitted: Mapping[str, Estimator], X: np.ndarray, y: np.ndarray
) -> Estimator | None:
    """`name` = "<model>+twins": the fold's fitted <model> with the training rows' twins in
    front. The row is that model by definition, so it takes that model's settings (an
    override given for the +twins name itself does not apply). None (fit `est` itself):
    <model> is not among the models compared."""
    base = fitted.get(name.removesuffix(TWINS)) if name.endswith(TWINS) else None
    if isinstance(est, TwinsOver) and isinstance(base, TwinsOver.BASES.get(est.base, ())):
        return TwinsOver.of_fitted(base, X, y)
    if isinstance(est, CorrectionMLP) and isinstance(base, CorrectionMLP):
        return base.with_twins(X, y)
    return None


# ---- the report -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelScore:
    name: str
    groups: GroupMetrics
    plans: PlanMetrics | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "groups": asdict(self.groups),
            "plans": asdict(self.plans) if self.plans else None,
        }


def score_models(cv: CVResult, plans: PlanEval | None) -> list[ModelScore]:
    measured = cv.design.measured_s
    return [
        ModelScore(
            name,
            group_metrics(cv.predicted_s(name), measured, cv.graph_ids),
            plans.metrics(name) if plans is not None and len(plans.measured_s) else None,
        )
        for name in cv.oof_log_ratio
    ]


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3f}"


def format_scores(scores: Sequence[ModelScore], title: str = "") -> str:
    """A markdown table: one row per model, held-out metrics side by side."""
    head = (
        "| model | groups | MAPE | median APE | p90 APE | tau (all) | tau (within graph) "
        "| plans | plan error | plan error (plain sum) | graphs | regret (mean) | regret (max) |"
    )
    rule = "|" + "---|" * 13
    lines = [title, "", head, rule] if title else [head, rule]
    for s in scores:
        g, p = s.groups, s.plans
        lines.append(
            f"| {s.name} | {g.n} | {_pct(g.mape)} | {_pct(g.median_ape)} | {_pct(g.p90_ape)} "
            f"| {_num(g.kendall_tau)} | {_num(g.kendall_tau_within)} "
            f"| {p.n_plans if p else 0} | {_pct(p.plan_mape if p else None)} "
            f"| {_pct(p.plan_mape_sum if p else None)} | {p.n_graphs if p else 0} | {_pct(p.mean_regret if p else None)} "
            f"| {_pct(p.max_regret if p else None)} |"
        )
    return "\n".join(lines)


def target_verdicts(score: ModelScore, baselines: Sequence[ModelScore]) -> dict[str, str]:
    """`HELD_OUT_TARGETS` for one model: each "met" / "missed" / "no data", with numbers."""
    g, p = score.groups, score.plans
    out = {
        "MAPE <= 10%": _verdict(g.mape, HELD_OUT_TARGETS["mape"], below=True),
        "Kendall tau >= 0.9": _verdict(g.kendall_tau, HELD_OUT_TARGETS["kendall_tau"], below=False),
        "plan error <= 5%": _verdict(
            p.plan_mape if p else None, HELD_OUT_TARGETS["plan_error"], True
        ),
        "regret <= 3%": _verdict(p.mean_regret if p else None, HELD_OUT_TARGETS["regret"], True),
    }
    others = [b for b in baselines if b.name != score.name and not b.name.startswith("mlp-")]
    beaten = [b.name for b in others if g.mape < b.groups.mape]
    out["beats every baseline (MAPE)"] = (  # the non-MLP models of the table
        "met"
        if len(beaten) == len(others)
        else f"missed (not better than {', '.join(b.name for b in others if b.name not in beaten)})"
    )
    return out


def _verdict(value: float | None, target: float, below: bool) -> str:
    if value is None or not math.isfinite(value):
        return "no data"
    ok = value <= target if below else value >= target
    return f"{'met' if ok else 'missed'} ({value:.3f})"
