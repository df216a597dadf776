"""The held-out study of learned_cost/study/heldout.py: run on a dataset, and rendered as markdown
for docs/learned_cost.md (`fusion-plan cost heldout` writes the JSON, `cost report` shows
it)."""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from learned_cost.data import group_rows, load_device_profiles, plan_rows
from learned_cost.persist import read_meta
from learned_cost.study.baselines import GBTCorrection, RidgeCorrection
from learned_cost.study.evaluate import TWINS
from learned_cost.study.heldout import METRICS, NESTED, SPLITS, TARGETS, StudyConfig, run_study
from learned_cost.study.plan_eval import GraphCache, current_descriptors
from planner.errors import CostModelError
from planner.hardware import get_spec

# the models of the two tables: each without twins, then the same models with twins
WITHOUT_TWINS = (
    "analytical",
    "mean-bias",
    "ridge",
    "gbt",
    "mlp-free",
    "mlp-roofline",
    "mlp-mixed",
    NESTED,
)
WITH_TWINS = (
    "gbt+twins",
    *(f"mlp-{f}{TWINS}" for f in ("free", "roofline", "mixed")),
    NESTED + TWINS,
)
BASELINES = ("analytical", "mean-bias", "ridge", "gbt", "gbt+twins")


def _schema_line(study: Mapping[str, Any]) -> str:
    """Which feature schema the study's models read (a study written before the record
    named it read schema 5, the one before the hardware-level features)."""
    s = study.get("feature_schema") or {}
    if not s:
        return "- features: schema 5 (learned_cost.features.FEATURES_V5; recorded before studies named it)"
    return (
        f"- features: schema {s.get('version')} (hash {s.get('hash')}, "
        f"{s.get('n_features')} features, learned_cost.features)"
    )


def heldout_study(
    data: Sequence[str | Path],
    device: str,
    cfg: StudyConfig,
    *,
    limit_rows: int | None = None,
    graphs: GraphCache | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    recapture: bool = True,
) -> dict[str, Any]:
    """run_study on the usable rows of `device` in the dataset files `data` (each must
    hold rows of that device; their rows are concatenated), every `limit_rows`-th
    row only where given, with where the rows came from. Without
    `recapture`, group rows keep the descriptors stored when they were collected and plan
    rows are not scored (recapturing every graph is the slow part on a busy CPU)."""
    spec = get_spec(device)
    profiles = load_device_profiles(data, spec.name)
    graphs = graphs or GraphCache()
    step = limit_rows or 1
    rows = group_rows(profiles, device=spec.name)[::step]
    plans = plan_rows(profiles, device=spec.name)[::step] if recapture else []
    if recapture:
        rows = current_descriptors(rows, graphs)
    if len(rows) < 10:
        raise CostModelError(
            f"only {len(rows)} usable group rows for device {spec.name!r} in {list(data)}; "
            "collect more or pass the right --device"
        )
    where = {
        "data_files": list(profiles.sources),
        "data_hash": profiles.data_hash,
        "limit_rows": limit_rows,
        "recaptured": recapture,
    }

    def progress(record: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress({**record, **where})

    return {**run_study(rows, plans, spec, cfg, graphs, progress), **where}


def read_study(path: str | Path) -> dict[str, Any]:
    """A study JSON written by `fusion-plan cost heldout`."""
    try:
        study = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CostModelError(f"held-out study {path} does not read as JSON ({e})") from e
    if not isinstance(study, dict) or "splits" not in study:
        raise CostModelError(
            f"{path} is not a held-out study (no 'splits'); write one with "
            "`fusion-plan cost heldout`"
        )
    return study


def _cell(stat: Mapping[str, float], pct: bool) -> str:
    m, sd = stat.get("mean", math.nan), stat.get("sd", math.nan)
    if not math.isfinite(m):
        return "-"
    if pct:
        return f"{100 * m:.1f}% ± {100 * sd:.1f}"
    return f"{m:.3f} ± {sd:.3f}"


def _table(summary: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    head = "| model | " + " | ".join(label for _, label in METRICS) + " |"
    lines = [head, "|" + "---|" * (len(METRICS) + 1)]
    for name in names:
        if name not in summary:
            continue
        cells = [_cell(summary[name][p], pct="tau" not in p) for p, _ in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def verdicts(summary: Mapping[str, Any], name: str) -> str:
    """Issue 21's targets for model `name` on the seed-mean numbers of one split."""
    s = summary[name]
    checks = (
        ("MAPE <= 12%", s["groups.mape"]["mean"], TARGETS["mape"], True),
        (
            "tau within graph >= 0.85",
            s["groups.kendall_tau_within"]["mean"],
            TARGETS["kendall_tau_within"],
            False,
        ),
        ("plan error <= 8%", s["plans.plan_mape"]["mean"], TARGETS["plan_error"], True),
        ("regret <= 2%", s["plans.mean_regret"]["mean"], TARGETS["regret"], True),
    )
    parts = []
    for label, v, target, below in checks:
        if not math.isfinite(v):
            parts.append(f"{label}: no data")
            continue
        ok = v <= target if below else v >= target
        parts.append(f"{label}: {'met' if ok else 'missed'} ({v:.3f})")
    mape = s["groups.mape"]["mean"]
    better = [b for b in BASELINES if b in summary and summary[b]["groups.mape"]["mean"] < mape]
    parts.append(
        "at least as good as every baseline (MAPE): "
        + ("met" if not better else f"missed (worse than {', '.join(better)})")
    )
    return "; ".join(parts)


def _reduced(study: Mapping[str, Any]) -> list[str]:
    """A line naming the MLP settings the study changed from the saved model it names."""
    ref = study.get("reference_model") or {}
    if not ref:  # studies written before the record: the saved model its command names
        words = shlex.split(str(study.get("command", "")))
        path = words[words.index("--model") + 1] if "--model" in words[:-1] else None
        if path and Path(path).is_file():
            ref = {"path": path, "params": read_meta(path).params}
    mlp = study.get("config", {}).get("mlp_params", {})
    changed = [
        f"{k} {v} -> {mlp[k]}"
        for k, v in (ref.get("params") or {}).items()
        if k in mlp and mlp[k] != v and not isinstance(v, list)
    ]
    defaults = {"gbt": GBTCorrection().get_params(), "ridge": RidgeCorrection().get_params()}
    base = [
        f"{name} {k} {defaults[name][k]} -> {v}"
        for name, params in study.get("config", {}).get("baseline_params", {}).items()
        for k, v in params.items()
        if name in defaults and defaults[name].get(k) != v
    ]
    lines = []
    if changed:
        lines.append(
            f"- **reduced settings**: the MLP here differs from the saved model "
            f"`{ref.get('path')}` in {', '.join(changed)} (to fit a shared 2-core machine); "
            "its numbers are those of a smaller, shorter-trained network than the one committed"
        )
    if base:
        lines.append(f"- **baselines reduced** from their defaults: {', '.join(base)}")
    return lines


def render_study(study: Mapping[str, Any], committed: str | None = None) -> str:
    """Markdown: how the splits are made, then per split the tables without and with
    twins (mean ± sd over fold seeds), the forms the inner CV chose, the targets."""
    cfg = study.get("config", {})
    splits = study.get("splits", {})
    arch = study.get("architectures", {})
    merged = {k: v for k, v in arch.items() if len(v) > 1}
    lines = [
        f"## {study.get('device')}: held out by {' and by '.join(splits)}, "
        f"fold seeds {sorted({x['seed'] for r in splits.values() for x in r['seeds']})}",
        "",
        f"- made by: `{study.get('command', '?')}`",
        f"- data: {', '.join(study.get('data_files', []))} (hash {study.get('data_hash')}, "
        f"{study.get('n_group_rows')} group rows, {study.get('n_plan_rows')} plan rows"
        + (f"; every {study['limit_rows']}-th row only" if study.get("limit_rows") else "")
        + ")"
        + (
            ""
            if study.get("recaptured", True)
            else "; descriptors as stored at collection, plan rows NOT scored "
            "(--stored-descriptors: no plan error or regret in this study)"
        ),
        f"- settings: {cfg.get('n_splits')} outer folds, fold seeds asked {cfg.get('seeds')}; the "
        f"MLP form chosen per outer fold by a {cfg.get('inner_splits')}-fold inner CV on its "
        f"training rows (**{NESTED}**); MLP settings {cfg.get('mlp_params') or 'defaults'}; "
        f"other models' overrides {cfg.get('baseline_params') or 'none'}",
        _schema_line(study),
        *_reduced(study),
        f"- architectures (the model class each family's spec builds, "
        f"learned_cost.study.heldout.architecture_of): {len(arch)} from "
        f"{sum(len(v) for v in arch.values())} families"
        + (
            "; grouped together: "
            + "; ".join(f"{', '.join(v)} (`{k.rsplit('.', 1)[-1]}`)" for k, v in merged.items())
            if merged
            else ""
        ),
        f"- graph groups (architecture and shape: dtype and realization siblings together): "
        f"{study.get('n_graph_groups')} groups of {study.get('n_graphs')} (graph, dtype) pairs",
        "",
        "Each cell is the mean ± standard deviation over the fold seeds. `rows without a "
        "twin`: the held-out rows with no exact twin (same feature vector) in their fold's "
        "training rows, where a table of measurements cannot answer.",
        "",
    ]
    for split, rec in study.get("splits", {}).items():
        summary = rec["summary"]
        seeds = rec["seeds"]
        if not seeds:
            lines += [f"### held out by {split}: no fold seed done (the run was stopped)", ""]
            continue
        share = [s["twin_share"] for s in seeds]
        forms = Counter(f for s in seeds for f in s["chosen_forms"])
        lines += [
            f"### held out by {split}: {rec.get('label', SPLITS.get(split, split))}",
            "",
            f"Fold seeds done: {[s['seed'] for s in seeds]}"
            + (
                f" (of {list(cfg.get('seeds', []))} asked: the run was stopped early)"
                if len(seeds) < len(cfg.get("seeds", []))
                else ""
            )
            + ".",
            "",
            f"Held-out rows with an exact twin in training: "
            f"{100 * min(share):.1f}%-{100 * max(share):.1f}% over the seeds. "
            + (
                "Forms the inner CV chose (outer folds x seeds): "
                + ", ".join(f"{f} {n}" for f, n in forms.most_common())
                + "."
                if forms
                else "No nested choice of form here (no mlp-nested rows)."
            ),
            "",
            *(
                [
                    f"Plan rows scored: {study['n_plan_rows'] - seeds[0]['plans_skipped']} of "
                    f"{study['n_plan_rows']} ({seeds[0]['plans_skipped']} skipped: their graph "
                    "no longer recaptures to the key it was measured under).",
                    "",
                ]
                if seeds[0].get("plans_skipped")
                else []
            ),
            "Without twins:",
            "",
            *_table(summary, WITHOUT_TWINS),
            "",
            "With twins:",
            "",
            *_table(summary, WITH_TWINS),
            "",
        ]
        for name in dict.fromkeys(x for x in (committed, NESTED + TWINS, NESTED) if x):
            if name in summary:
                lines += [f"Targets (issue 21) for {name}: {verdicts(summary, name)}", ""]
        if split in ("architecture", "family"):
            folds = "; ".join(
                f"seed {s['seed']}: "
                + ", ".join(
                    "{" + ", ".join(k.rsplit(".", 1)[-1] for k in h) + "}" for h in s["held_out"]
                )
                for s in seeds
            )
            lines += [f"Folds: {folds}", ""]
    return "\n".join(lines)
