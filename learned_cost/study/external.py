"""A saved model scored on a dataset it was not trained on: an unseen family of models.

What `fusion-plan cost score` runs: the committed correction of a device (trained on all
of its dataset's rows) predicts the group and plan rows of another dataset measured on
the same device, such as the real-model suite (benchmarks/models/: Hugging Face GPT-2,
LLaMA, BERT, T5, ViT and a ResNet, none of whose graphs the training data holds). Every
row here is held out by construction: no fold, nothing refitted. The table sets the model
beside the roofline it corrects, the realized roofline (the planner's default), and the
model without its twins (a group the training rows measured answered by those
measurements); the record names which architectures of the dataset the training data
also holds, so "unseen" is checked rather than assumed.

Group rows: ln(measured / analytical) predicted from the features on the model's saved
device figures, as the planner computes them. Plan rows: the plan's groups costed by the
model in plan context plus its per-call cost (CorrectedModel.plan_cost_s), against the
plan measured; regret per graph as in learned_cost.study.evaluate.plan_metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from learned_cost.adapt import without_twins
from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import CorrectedModel, load_corrected
from learned_cost.data import group_rows, load_profiles, plan_groups, plan_rows
from learned_cost.features import design_matrix
from learned_cost.realized import RealizedRoofline
from learned_cost.study.evaluate import group_metrics, plan_metrics
from learned_cost.study.heldout import architecture_of
from learned_cost.study.plan_eval import GraphCache, current_descriptors
from planner.errors import CostModelError

MODELS = {
    "analytical": "the roofline the model corrects",
    "realized": "the realized roofline (the planner's default cost model)",
    "learned-no-twins": "the saved model's networks alone",
    "learned": "the saved model as the planner uses it (networks, twins, plan context)",
}
TARGET_PLAN_ERROR = 0.10  # real-model suite as an unseen family


def _training_architectures(files: Sequence[str]) -> set[str] | None:
    if not files or not all(Path(f).is_file() for f in files):
        return None
    models: set[str] = set()
    for f in files:
        models |= set(pq.read_table(f, columns=["model"])["model"].to_pylist())
    return {architecture_of(str(m)) for m in models}


def score_external(
    model_path: str | Path,
    data: Sequence[str | Path],
    device: str,
    *,
    recapture: bool = True,
    graphs: GraphCache | None = None,
) -> dict[str, Any]:
    """Every model of MODELS on the group and plan rows of `device` in `data`."""
    with_warning = load_corrected(model_path, device)
    if not isinstance(with_warning, CorrectedModel):
        raise CostModelError(f"{model_path} does not load as a learned model for {device!r}")
    cm = with_warning
    spec = cm.spec
    graphs = graphs or GraphCache()
    profiles = load_profiles(data)
    rows = group_rows(profiles, device=spec.name)
    plans = plan_rows(profiles, device=spec.name)
    if recapture:
        rows = current_descriptors(rows, graphs)
    if not rows and not plans:
        raise CostModelError(f"no usable rows of device {spec.name!r} in {list(data)}")
    bare = CorrectedModel(
        AnalyticalModel(spec),
        without_twins(cm.mlp),
        model_id=cm.model_id + "-no-twins",
        online=cm.online,
        plan_context=cm.plan_context,
    )
    record: dict[str, Any] = {
        "model": str(model_path),
        "model_id": cm.model_id,
        "device": spec.name,
        "data_files": list(profiles.sources),
        "data_hash": profiles.data_hash,
        "recaptured": recapture,
        "n_group_rows": len(rows),
        "n_plan_rows": len(plans),
        "families": sorted({str(r.get("family")) for r in (*rows, *plans)}),
        "groups": {},
        "plans": {},
    }
    archs = sorted({architecture_of(str(r.get("model"))) for r in (*rows, *plans)})
    trained = _training_architectures(cm.meta.data_files if cm.meta else ())
    record["architectures"] = archs
    record["architectures_in_training"] = (
        None if trained is None else sorted(a for a in archs if a in trained)
    )
    if rows:
        d = design_matrix(rows, lambda _n: spec, group_by="family", names=cm.feature_names)
        ids = np.array([f"{r.get('graph_key')}|{r.get('dtype')}" for r in rows], dtype=object)
        preds = {
            "analytical": d.analytical_s,
            "learned-no-twins": d.analytical_s * np.exp(bare.mlp.predict(d.X) + cm.online.bias),
            "learned": d.analytical_s * np.exp(cm.mlp.predict(d.X) + cm.online.bias),
        }
        record["groups"] = {
            n: asdict(group_metrics(p, d.measured_s, ids)) for n, p in preds.items()
        }
        twin = cm.mlp.twins_.lookup(d.X)[1] if getattr(cm.mlp, "twins_", None) else None
        record["twin_share"] = float(np.mean(twin)) if twin is not None else 0.0
    scored = {n: [] for n in MODELS}
    measured, pids, skipped = [], [], 0
    costers = {
        "analytical": AnalyticalModel(spec),
        "realized": RealizedRoofline(spec),
    }
    for r in plans:
        graph = graphs.get(r)
        if graph is None:
            skipped += 1
            continue
        groups = [frozenset(g) for g in plan_groups(r)]
        for name, model in costers.items():
            scored[name].append(sum(model.group_cost(graph, g).latency_s for g in groups))
        scored["learned-no-twins"].append(bare.plan_cost_s(graph, groups))
        scored["learned"].append(cm.plan_cost_s(graph, groups))
        measured.append(float(r["measured_median_s"]))
        pids.append(f"{r.get('graph_key')}|{r.get('dtype')}")
    record["plans_skipped"] = skipped
    if measured:
        m = np.array(measured)
        record["plans"] = {n: asdict(plan_metrics(np.array(p), m, pids)) for n, p in scored.items()}
    return record


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, int | float) and math.isfinite(v) else "-"


def _num(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) and math.isfinite(v) else "-"


def render_external(rec: Mapping[str, Any]) -> str:
    """Markdown: what was scored, the table, the target."""
    seen = rec.get("architectures_in_training")
    lines = [
        f"## {rec.get('device')}: {rec.get('model_id')} on {', '.join(rec.get('data_files', []))}",
        "",
        f"- made by: `{rec.get('command', '?')}`",
        f"- data: hash {rec.get('data_hash')}, {rec.get('n_group_rows')} group rows, "
        f"{rec.get('n_plan_rows')} plan rows ({rec.get('plans_skipped', 0)} skipped: their "
        "graph no longer recaptures to the key it was measured under)"
        + ("" if rec.get("recaptured", True) else "; descriptors as stored at collection"),
        f"- families: {', '.join(rec.get('families', []))}",
        "- architectures also in the model's training data: "
        + (
            "unknown (its data files are not here)"
            if seen is None
            else (", ".join(a.rsplit(".", 1)[-1] for a in seen) if seen else "none")
        )
        + f"; group rows with an exact twin in the training rows: "
        f"{_pct(rec.get('twin_share'))}",
        "",
        "| model | MAPE | median APE | tau (within graph) | plan error | plan median APE "
        "| regret (mean) | regret (max) | graphs ranked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in MODELS:
        g = rec.get("groups", {}).get(name, {})
        p = rec.get("plans", {}).get(name, {})
        lines.append(
            f"| {name} | {_pct(g.get('mape'))} | {_pct(g.get('median_ape'))} | "
            f"{_num(g.get('kendall_tau_within'))} | {_pct(p.get('plan_mape'))} | "
            f"{_pct(p.get('plan_median_ape'))} | {_pct(p.get('mean_regret'))} | "
            f"{_pct(p.get('max_regret'))} | {p.get('n_graphs', '-')} |"
        )
    err = rec.get("plans", {}).get("learned", {}).get("plan_mape")
    if isinstance(err, int | float) and math.isfinite(err):
        verdict = "met" if err <= TARGET_PLAN_ERROR else "missed"
        lines += ["", f"Target (plan error <= 10% as an unseen family): {verdict} ({err:.3f})"]
    lines += ["", "Models: " + "; ".join(f"**{k}**: {v}" for k, v in MODELS.items()) + "."]
    return "\n".join(lines) + "\n"


def read_external(path: str | Path) -> dict[str, Any]:
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CostModelError(f"{path} does not read as a score record ({e})") from e
    if not isinstance(rec, dict) or "groups" not in rec:
        raise CostModelError(f"{path} is not written by `fusion-plan cost score`")
    return rec
