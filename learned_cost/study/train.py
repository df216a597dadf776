"""Train and evaluate the correction on a profile dataset: what `fusion-plan cost` runs.

One call does everything `cost train` does: grouped cross-validation of every
model in `evaluate.MODELS` (held-out metrics side by side, per split), plan-level error
and regret on the plan rows, the choice of MLP form ("auto": the one with the lower
held-out MAPE, averaged over the splits; note the choice itself uses those folds, so the chosen
model's numbers are optimistic by a little), a final fit on all rows, and the saved model
with its metrics, data hash and the command that made it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from learned_cost.data import MAX_NOISE, Profiles, group_rows, noisy_rows, plan_groups, plan_rows
from learned_cost.features import design_matrix, normalize_dtype
from learned_cost.mlp import FORMS, CorrectionMLP
from learned_cost.persist import ModelMeta, save_model
from learned_cost.plan_context import PlanContext, fit_plan_context_groups, graph_footprint
from learned_cost.study import plots
from learned_cost.study.evaluate import (
    MODEL_NAMES,
    MODELS,
    TWINS,
    CVResult,
    ModelScore,
    cross_validate,
    format_scores,
    group_metrics,
    repeatability,
    score_models,
    target_verdicts,
)
from learned_cost.study.plan_eval import (
    GraphCache,
    PlanEval,
    current_descriptors,
    evaluate_plans,
    plan_group_design,
)
from planner import progress as progress_bars
from planner.errors import CostModelError
from planner.hardware import DeviceSpec, get_spec

log = logging.getLogger(__name__)

SPLIT_LABELS = {
    "family": "whole model families held out (unseen architectures)",
    "graph_key": "whole graphs held out (unseen shapes of seen families)",
}


@dataclass(frozen=True)
class TrainConfig:
    device: str
    form: str = "auto"  # "free" | "roofline" | "auto"
    splits: tuple[str, ...] = ("family", "graph_key")
    n_splits: int = 5
    seed: int = 0
    mlp_params: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"steps": 300}
    # the saved model answers groups its training rows measured from those measurements
    # (learned_cost/twins.py); the form is still chosen on the networks alone
    twins: bool = True
    # hyper-parameters of the other models, by name, e.g. {"gbt": {"n_estimators": 50}}
    baseline_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class SplitResult:
    split: str
    cv: CVResult
    plans: PlanEval | None
    scores: list[ModelScore]

    def score(self, name: str) -> ModelScore:
        return next(s for s in self.scores if s.name == name)


@dataclass
class EvalRun:
    device: str
    spec: DeviceSpec
    n_plan_rows: int
    n_noisy: tuple[int, int]  # group and plan rows dropped as disturbed (data.MAX_NOISE)
    families: tuple[str, ...]
    splits: list[SplitResult]
    rows: list[dict[str, Any]] = field(default_factory=list)  # the group rows evaluated

    @property
    def n_group_rows(self) -> int:
        return len(self.rows)


def evaluate_all(
    profiles: Profiles,
    cfg: TrainConfig,
    spec: DeviceSpec | None = None,
    graphs: GraphCache | None = None,
) -> EvalRun:
    """Grouped CV of every model on `profiles` rows of `cfg.device`, per split.
    `graphs` recaptures the graphs of plan rows (a fresh GraphCache by default)."""
    spec = spec or get_spec(cfg.device)
    graphs = graphs or GraphCache()
    rows = current_descriptors(group_rows(profiles, device=spec.name), graphs)
    plans = plan_rows(profiles, device=spec.name)
    if len(rows) < 10:
        raise CostModelError(
            f"only {len(rows)} usable group rows for device {spec.name!r} in "
            f"{list(profiles.sources)} (devices there: "
            f"{sorted({str(r.get('device')) for r in profiles.rows})}); collect more or "
            "pass the right --device"
        )
    overrides = {
        **cfg.baseline_params,
        # (the +twins rows take their base model's settings: evaluate._twins_from)
        **{
            n: dict(cfg.mlp_params)
            for n in MODEL_NAMES
            if n.startswith("mlp-") and not n.endswith(TWINS)
        },
    }
    results = []
    for split in progress_bars.track(cfg.splits, "cross-validation", unit="split"):
        cv = cross_validate(
            rows,
            lambda _name: spec,
            split=split,
            n_splits=cfg.n_splits,
            seed=cfg.seed,
            overrides=overrides,
        )
        log.info("held out by %s: scoring %d plan rows with every fold's models", split, len(plans))
        pe = evaluate_plans(plans, cv, lambda _name: spec, graphs) if plans else None
        results.append(SplitResult(split, cv, pe, score_models(cv, pe)))
    families = tuple(sorted({str(r.get("family")) for r in rows}))
    noisy = (noisy_rows(profiles, "group", spec.name), noisy_rows(profiles, "plan", spec.name))
    return EvalRun(spec.name, spec, len(plans), noisy, families, results, rows)


def choose_form(run: EvalRun, form: str) -> str:
    if form in FORMS:
        return form
    if form != "auto":
        raise CostModelError(f"--form must be one of {(*FORMS, 'auto')}, got {form!r}")
    # the model serves unseen shapes and unseen families alike: the mean over the splits
    return min(
        FORMS,
        key=lambda f: float(np.mean([s.score(f"mlp-{f}").groups.mape for s in run.splits])),
    )


def committed_name(form: str, twins: bool) -> str:
    """The evaluation table's name for the model `train` saves."""
    return f"mlp-{form}{TWINS if twins else ''}"


def fit_final(
    rows: Sequence[Mapping[str, Any]], cfg: TrainConfig, form: str, spec: DeviceSpec
) -> CorrectionMLP:
    d = design_matrix(rows, lambda _name: spec)
    model = CorrectionMLP(form=form, twins=cfg.twins, random_state=cfg.seed)
    model.set_params(**cfg.mlp_params)
    return model.fit(d.X, d.y)


def fit_final_context(
    profiles: Profiles, final: CorrectionMLP, spec: DeviceSpec, graphs: GraphCache
) -> PlanContext:
    """The plan calibration of the final model, from all plan rows (plan_context.py)."""
    lats, feats, measured, footprints = [], [], [], []
    for r in plan_rows(profiles, device=spec.name):
        graph = graphs.get(r)
        if graph is None:
            continue
        reals = json.loads(r["realizations"]) if r.get("realizations") else None
        dtype = normalize_dtype(str(r["dtype"]))
        X, an = plan_group_design(graph, plan_groups(r), spec, dtype, reals)
        lats.append(an * np.exp(final.predict(X)) if len(an) else an)
        feats.append(X)
        measured.append(float(r["measured_median_s"]))
        footprints.append(graph_footprint(graph, spec))
    return fit_plan_context_groups(lats, feats, np.array(measured), footprints=footprints)


def metrics_record(run: EvalRun, form: str, final: CorrectionMLP) -> dict:
    """What the saved model's JSON keeps about its evaluation."""
    name = committed_name(form, final.twins)
    rows = run.rows
    d = design_matrix(rows, lambda _name: run.spec)
    in_sample = group_metrics(
        d.analytical_s * np.exp(final.predict(d.X)),
        d.measured_s,
        np.array([str(r.get("graph_key")) for r in rows], dtype=object),
    )
    out: dict[str, Any] = {
        "chosen_form": form,
        "committed_model": name,
        "n_group_rows": run.n_group_rows,
        "n_plan_rows": run.n_plan_rows,
        "n_noisy_dropped": {
            "group": run.n_noisy[0],
            "plan": run.n_noisy[1],
            "max_noise": MAX_NOISE,
        },
        "families": list(run.families),
        "in_sample_final_fit": {"mape": in_sample.mape, "median_ape": in_sample.median_ape},
        "splits": {},
    }
    # The noise floor, and the chosen model on the same rows (held out) to compare with it.
    rep = repeatability(rows)
    out["repeatability"] = rep.to_dict()
    if len(rep.rows):
        out["repeatability"]["held_out_model_on_same_rows"] = {
            sr.split: asdict(
                group_metrics(
                    sr.cv.predicted_s(name)[rep.rows],
                    sr.cv.design.measured_s[rep.rows],
                    sr.cv.graph_ids[rep.rows],
                )
            )
            for sr in run.splits
        }
    for sr in run.splits:
        chosen = sr.score(name)
        out["splits"][sr.split] = {
            "label": SPLIT_LABELS.get(sr.split, sr.split),
            "n_folds": len(sr.cv.held_out),
            "held_out": [sorted(h) for h in sr.cv.held_out] if sr.split == "family" else [],
            "scores": [s.to_dict() for s in sr.scores],
            "table": format_scores(sr.scores),
            "verdicts": target_verdicts(chosen, sr.scores),
            "plans_skipped": sr.plans.skipped if sr.plans else 0,
        }
    return out


def train(
    profiles: Profiles,
    cfg: TrainConfig,
    out: str | Path | None = None,
    *,
    command: str = "",
    plot: str | Path | None = None,
    graphs: GraphCache | None = None,
) -> tuple[CorrectionMLP, EvalRun, ModelMeta | None, str]:
    """Evaluate all models, pick the MLP form, fit on everything, save; see module doc."""
    spec = get_spec(cfg.device)
    graphs = graphs or GraphCache()
    run = evaluate_all(profiles, cfg, spec, graphs)
    form = choose_form(run, cfg.form)
    log.info("fitting the final mlp-%s on all %d group rows", form, run.n_group_rows)
    final = fit_final(run.rows, cfg, form, spec)
    context = fit_final_context(profiles, final, spec, graphs)
    metrics = metrics_record(run, form, final)
    if plot:
        metrics["plot"] = str(
            plot_predictions(
                run.splits[0], plot, title=spec.name, model_file=str(out or ""), command=command
            )
        )
    meta = None
    if out:
        meta = save_model(
            final,
            out,
            spec=spec,
            device_fingerprints=tuple({str(r.get("device_fingerprint")) for r in run.rows}),
            data_hash=profiles.data_hash,
            data_files=profiles.sources,
            n_rows=run.n_group_rows,
            metrics=metrics,
            plan_context=context.to_json(),
            command=command,
        )
    return final, run, meta, form


# ---- what people read ------------------------------------------------------------------------
def render_run(run: EvalRun, model: str | None = None) -> str:
    """The side-by-side tables of a run (one per split), with the targets' verdicts for
    `model` (a name of the tables, e.g. "mlp-mixed+twins") where given."""
    lines = [
        f"device {run.device}: {run.n_group_rows} group rows, {run.n_plan_rows} plan rows "
        f"({run.n_noisy[0]} group and {run.n_noisy[1]} plan rows dropped as disturbed: "
        f"median > {MAX_NOISE}x min), families: {', '.join(run.families)}"
    ]
    for sr in run.splits:
        title = f"held-out split by {sr.split}: {SPLIT_LABELS.get(sr.split, sr.split)}"
        lines += ["", format_scores(sr.scores, title)]
        if sr.plans and sr.plans.skipped:
            lines.append(f"({sr.plans.skipped} plan rows skipped: graph could not be recaptured)")
        if model:
            v = target_verdicts(sr.score(model), sr.scores)
            lines.append("")
            lines.append(f"targets for {model}: " + "; ".join(f"{k}: {x}" for k, x in v.items()))
    return "\n".join(lines)


def plot_predictions(
    sr: SplitResult, path: str | Path, title: str = "", *, model_file: str = "", command: str = ""
) -> Path:
    """Held-out predicted vs measured latency, one panel per model, log-log (PNG): the points
    are saved beside `path` first and the PNG drawn from them (learned_cost.study.plots)."""
    pts = plots.make_points(sr, title, model_file=model_file, command=command)
    plots.write_points(pts, path)
    return plots.render_png(path)


def describe_models() -> list[str]:
    return [f"{name}: {why}" for name, _, why in MODELS]


def scores_from_meta(meta: ModelMeta) -> Sequence[tuple[str, str, dict[str, str]]]:
    """(split, table, verdicts) stored in a saved model's metrics."""
    splits = meta.metrics.get("splits", {})
    return [(k, v.get("table", ""), v.get("verdicts", {})) for k, v in splits.items()]
