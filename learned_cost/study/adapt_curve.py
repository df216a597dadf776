"""Error on a new device against the number of its rows used: adapting a model trained on
another device (learned_cost/adapt.py), against training from scratch on the same rows.

What `fusion-plan cost adapt-study` runs, and docs/learned_cost.md shows:

- The target device's group rows are dealt into folds by graph group (architecture and
  shape, dtype and realization siblings together: learned_cost.study.heldout), by a seeded
  shuffle, over several fold seeds. Each fold's rows are the test rows; the adaptation
  rows come from the other folds only, so no graph (nor its other-dtype sibling) gives
  both adaptation and test rows.
- For each size n (0, 50, 200, 1000 by default) the first n rows of the other folds, in a
  seeded order, adapt the source model or train a model from scratch. With `sample =
  "graphs"` the order takes whole graphs one after the other (what a short collection
  there gives: a few graphs, each with all its groups); with "rows" any rows. The sets are
  nested (the 50 rows are the first 50 of the 200), so a curve moves only by what the new
  rows add. A fold whose other folds hold fewer than n rows uses them all (the table says
  how many rows were used on average).
- Every method is shown without and with twins (the adaptation rows answering groups
  they measured, learned_cost/twins.py); the source's own twins are another device's
  and are left out, except in "source-figures" (the source model on its own figures,
  unchanged: its prediction of the source's time taken as the target's).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from learned_cost.adapt import METHODS, AdaptConfig, adapt_mlp, without_twins
from learned_cost.features import FEATURE_NAMES, design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.persist import ModelMeta, spec_from_figures
from learned_cost.study.baselines import GBTCorrection
from learned_cost.study.evaluate import TWINS, group_metrics
from learned_cost.study.heldout import shuffled_group_folds, with_split_keys
from learned_cost.twins import TwinTable
from planner.errors import CostModelError
from planner.hardware import DeviceSpec

log = logging.getLogger(__name__)

SIZES = (0, 50, 200, 1000)
STUDY_METHODS = {
    "source-figures": "the source model unchanged, on the source's figures with its own "
    "twins: its prediction of the source device's time taken as the target's",
    **{f"adapt-{k}": v for k, v in METHODS.items()},
    "scratch-mlp": "an MLP with the source model's settings, trained on the adaptation rows "
    "alone (steps and ensemble size as the study's settings say)",
    "scratch-gbt": "gradient-boosted trees trained on the adaptation rows alone",
}
SAMPLES = ("graphs", "rows")
# the method the target is judged on: what `fusion-plan cost adapt` does by default
JUDGED = "adapt-finetune" + TWINS
# (metric path, label, percent)
CURVE_METRICS = (
    ("mape", "MAPE", True),
    ("median_ape", "median APE", True),
    ("kendall_tau_within", "tau (within graph)", False),
)


@dataclass(frozen=True)
class CurveConfig:
    sizes: tuple[int, ...] = SIZES
    seeds: tuple[int, ...] = (0, 1, 2)
    n_splits: int = 4
    sample: str = "graphs"
    adapt_steps: int | None = None  # None: each method's default (learned_cost.adapt)
    adapt_lr: float = 1e-3
    scratch_params: Mapping[str, Any] = field(default_factory=dict)
    gbt_params: Mapping[str, Any] = field(default_factory=dict)
    methods: tuple[str, ...] = tuple(STUDY_METHODS)

    def __post_init__(self) -> None:
        if self.sample not in SAMPLES:
            raise CostModelError(f"sample must be one of {SAMPLES}, got {self.sample!r}")
        unknown = [m for m in self.methods if m not in STUDY_METHODS]
        if unknown:
            raise CostModelError(f"unknown method(s) {unknown}; known: {list(STUDY_METHODS)}")
        if any(n < 0 for n in self.sizes):
            raise CostModelError(f"sizes must be >= 0, got {list(self.sizes)}")


def adaptation_order(
    pool: np.ndarray, groups: np.ndarray, rng: np.random.Generator, sample: str
) -> np.ndarray:
    """The pool's row indices in the order adaptation rows are taken: whole graph groups
    one after another in a random order (`sample="graphs"`, rows shuffled within each), or
    all rows shuffled ("rows")."""
    if sample == "rows":
        return rng.permutation(pool)
    keys = sorted(set(groups[pool].tolist()))
    out = []
    for i in rng.permutation(len(keys)):
        members = pool[groups[pool] == keys[i]]
        out.append(rng.permutation(members))
    return np.concatenate(out) if out else pool[:0]


def seen_graphs(rows: Sequence[Mapping[str, Any]], files: Sequence[str]) -> np.ndarray | None:
    """Per row: whether its graph (model, shape, dtype) is in the dataset files the source
    model was trained on (those graphs are new to the device, not to the model). None
    where a file is not here."""
    if not files or not all(Path(f).is_file() for f in files):
        return None
    seen: set[tuple[str, str, str]] = set()
    for f in files:
        t = pq.read_table(f, columns=["model", "shape", "dtype"])
        seen |= set(zip(*(t[c].to_pylist() for c in ("model", "shape", "dtype"))))
    return np.array(
        [(r.get("model"), r.get("shape"), r.get("dtype")) in seen for r in rows], dtype=bool
    )


def _predict_fold(
    name: str,
    source: CorrectionMLP,
    cfg: CurveConfig,
    seed: int,
    X: np.ndarray,
    y: np.ndarray,
    X_test: np.ndarray,
) -> np.ndarray:
    """Log-ratios (to the target's roofline) of the test rows after `name` used (X, y)."""
    if name.startswith("adapt-"):
        a_cfg = AdaptConfig(
            method=name.removeprefix("adapt-"), steps=cfg.adapt_steps, lr=cfg.adapt_lr, twins=False
        )
        return adapt_mlp(source, X, y, a_cfg).predict(X_test)
    if len(y) < 2:  # nothing to train on: the mean ratio (0 without rows)
        return np.full(len(X_test), float(np.mean(y)) if len(y) else 0.0)
    if name == "scratch-mlp":
        params = {**source.get_params(), "twins": False, "random_state": seed}
        return CorrectionMLP(**{**params, **cfg.scratch_params}).fit(X, y).predict(X_test)
    if name == "scratch-gbt":
        est = GBTCorrection(random_state=seed).set_params(**cfg.gbt_params)
        return est.fit(X, y).predict(X_test)
    raise CostModelError(f"unknown method {name!r}")


def run_curve(
    source: CorrectionMLP,
    source_meta: ModelMeta,
    rows: Sequence[Mapping[str, Any]],
    spec: DeviceSpec,
    cfg: CurveConfig,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The study over `rows` (usable group rows of the target device `spec`); a JSON-ready
    record (render_curve). `on_progress(record)` after each fold seed."""
    rows = with_split_keys(rows)
    names = source.feature_names_ or FEATURE_NAMES  # the source model's schema
    d = design_matrix(rows, lambda _n: spec, group_by="graph_group", names=names)
    source_spec = spec_from_figures(source_meta.spec_figures)
    ds = design_matrix(rows, lambda _n: source_spec, group_by="graph_group", names=names)
    graphs = np.array([str(r.get("graph_key")) for r in rows], dtype=object)
    plain = without_twins(source)
    seen = seen_graphs(rows, source_meta.data_files)
    new = None if seen is None or seen.all() or not seen.any() else ~seen
    out: dict[str, Any] = {
        "source": {
            "model_id": source_meta.model_id,
            "device": source_meta.device,
            "data_files": list(source_meta.data_files),
            "n_rows": source_meta.n_rows,
            "params": source_meta.params,
        },
        "device": spec.name,
        "n_rows": len(d),
        "n_graphs": len(set(graphs.tolist())),
        "n_graph_groups": len(set(d.groups.tolist())),
        "seen_share": None if seen is None or not len(seen) else float(seen.mean()),
        "config": {**asdict(cfg), "scratch_params": dict(cfg.scratch_params)},
        "seeds": [],
        "summary": {},
    }
    for seed in cfg.seeds:
        log.info("adapt study: fold seed %d", seed)
        pred = {
            (m + t, n): np.full(len(d), np.nan)
            for m in cfg.methods
            for t in ("", TWINS)
            for n in cfg.sizes
        }
        used: dict[int, list[int]] = {n: [] for n in cfg.sizes}
        for k, (tr, te) in enumerate(shuffled_group_folds(seed)(d.groups, cfg.n_splits)):
            rng = np.random.default_rng([seed, k])
            order = adaptation_order(tr, d.groups, rng, cfg.sample)
            zero = {
                "adapt-none": plain.predict(d.X[te]),
                # the source's own answer, twins included, relative to the target's roofline
                "source-figures": source.predict(ds.X[te])
                + np.log(ds.analytical_s[te] / d.analytical_s[te]),
            }
            for n in cfg.sizes:
                sel = order[:n]
                used[n].append(len(sel))
                table = TwinTable.fit(d.X[sel], d.y[sel]) if len(sel) else None
                for m in cfg.methods:
                    if m in zero:
                        r = zero[m]
                    else:
                        r = _predict_fold(m, source, cfg, seed, d.X[sel], d.y[sel], d.X[te])
                    pred[(m, n)][te] = r
                    pred[(m + TWINS, n)][te] = table.answer(d.X[te], r) if table else r
        scores: dict[str, dict[str, Any]] = {}
        unseen: dict[str, dict[str, Any]] = {}
        for (name, n), r in pred.items():
            p = d.analytical_s * np.exp(r)
            scores.setdefault(name, {})[str(n)] = asdict(group_metrics(p, d.measured_s, graphs))
            if new is not None:
                unseen.setdefault(name, {})[str(n)] = asdict(
                    group_metrics(p[new], d.measured_s[new], graphs[new])
                )
        out["seeds"].append(
            {
                "seed": seed,
                "rows_used": {str(n): float(np.mean(u)) for n, u in used.items()},
                "scores": scores,
                **({"scores_new_graphs": unseen} if unseen else {}),
            }
        )
        out["summary"] = summarize_curve(out["seeds"])
        if new is not None:
            out["summary_new_graphs"] = summarize_curve(out["seeds"], "scores_new_graphs")
        if on_progress is not None:
            on_progress(out)
    return out


def summarize_curve(per_seed: Sequence[Mapping[str, Any]], key: str = "scores") -> dict[str, Any]:
    """name -> size -> metric -> {mean, sd} over fold seeds (sd with ddof 1)."""
    out: dict[str, Any] = {}
    for name, by_n in per_seed[0][key].items():
        out[name] = {}
        for n in by_n:
            out[name][n] = {}
            for metric, _, _ in CURVE_METRICS:
                v = np.array([s[key][name][n][metric] for s in per_seed], dtype=float)
                v = v[np.isfinite(v)]
                out[name][n][metric] = {
                    "mean": float(v.mean()) if len(v) else math.nan,
                    "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                }
    return out


def _cell(stat: Mapping[str, float], pct: bool) -> str:
    m, sd = stat["mean"], stat["sd"]
    if not math.isfinite(m):
        return "-"
    return f"{100 * m:.1f}% ± {100 * sd:.1f}" if pct else f"{m:.3f} ± {sd:.3f}"


def reference_mape(study: Mapping[str, Any] | None, model: str) -> dict[str, float]:
    """split -> the seed-mean held-out MAPE of `model` in a `cost heldout` study of the
    source device (the yardstick of the target: within 1.5x of it)."""
    out: dict[str, float] = {}
    for split, rec in ((study or {}).get("splits") or {}).items():
        stat = (rec.get("summary") or {}).get(model, {}).get("groups.mape")
        if stat and math.isfinite(stat.get("mean", math.nan)):
            out[split] = float(stat["mean"])
    return out


def render_curve(study: Mapping[str, Any]) -> str:
    """Markdown: how the study was made, then MAPE and tau per method and size."""
    src = study.get("source", {})
    cfg = study.get("config", {})
    seeds = study.get("seeds", [])
    sizes = [str(n) for n in cfg.get("sizes", [])]
    used = {n: np.mean([s["rows_used"][n] for s in seeds]) if seeds else math.nan for n in sizes}
    seen = study.get("seen_share")
    lines = [
        f"## {src.get('device')} model adapted to {study.get('device')}: error on held-out "
        f"graphs against the {study.get('device')} rows used",
        "",
        f"- made by: `{study.get('command', '?')}`",
        f"- source model: {src.get('model_id')} ({src.get('n_rows')} {src.get('device')} group "
        f"rows of {', '.join(src.get('data_files', []))})",
        f"- target data: {', '.join(study.get('data_files', []))} (hash "
        f"{study.get('data_hash')}, {study.get('n_rows')} group rows, {study.get('n_graphs')} "
        f"graphs in {study.get('n_graph_groups')} graph groups)"
        + (
            ""
            if seen is None
            else f"; {100 * seen:.0f}% of these rows are of graphs (model, shape, dtype) the "
            f"source model was trained on, measured on {src.get('device')}"
        ),
        f"- folds: {cfg.get('n_splits')} by graph group, fold seeds "
        f"{[s['seed'] for s in seeds]} (asked {cfg.get('seeds')}); adaptation rows from the "
        f"other folds, taken by {cfg.get('sample')} in a seeded order; rows used on average "
        + ", ".join(f"{n}: {used[n]:.0f}" for n in sizes),
        f"- settings: adaptation steps {cfg.get('adapt_steps') or 'the method defaults'}, lr "
        f"{cfg.get('adapt_lr')}; scratch MLP overrides {cfg.get('scratch_params') or 'none'} of "
        f"the source's settings; gbt overrides {cfg.get('gbt_params') or 'none'}",
        "",
        "Methods: " + "; ".join(f"**{k}**: {v}" for k, v in STUDY_METHODS.items()) + ".",
        "",
        "Each cell is the mean ± standard deviation over fold seeds of the held-out rows' "
        "figure, with that many adaptation rows.",
        "",
    ]
    summary = study.get("summary", {})
    names = [m for m in cfg.get("methods", []) if m in summary]
    for key, label, pct in CURVE_METRICS:
        for suffix, what in (("", "without twins"), (TWINS, "with twins (the adaptation rows)")):
            if key == "median_ape" and suffix:
                continue
            lines += [
                f"{label}, {what}:",
                "",
                "| method | " + " | ".join(f"{n} rows" for n in sizes) + " |",
                "|---|" + "---|" * len(sizes),
            ]
            for m in names:
                cells = [_cell(summary[m + suffix][n][key], pct) for n in sizes]
                lines.append(f"| {m}{suffix} | " + " | ".join(cells) + " |")
            lines.append("")
    fresh = study.get("summary_new_graphs") or {}
    if fresh:
        lines += [
            "MAPE on the held-out rows of graphs the source model never saw (on any device), "
            "with twins:",
            "",
            "| method | " + " | ".join(f"{n} rows" for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for m in names:
            cells = [_cell(fresh[m + TWINS][n]["mape"], True) for n in sizes]
            lines.append(f"| {m}{TWINS} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _verdict(study, sizes)
    return "\n".join(lines)


def _verdict(study: Mapping[str, Any], sizes: Sequence[str]) -> list[str]:
    """The target: with <= 200 rows, MAPE within 1.5x of the source's own held-out MAPE
    (`study["reference"]`: reference_mape of the source device's `cost heldout` study)."""
    ref_rec = study.get("reference") or {}
    ref = ref_rec.get("mape") or {}
    summary = study.get("summary", {})
    small = [n for n in sizes if 0 < int(n) <= 200]
    if not ref or not small:
        return [
            "Target (MAPE within 1.5x of the source model's own held-out MAPE): not judged "
            "here (no held-out study of the source model, or no size of 1 to 200 rows).",
            "",
        ]
    n = max(small, key=int)
    if JUDGED not in summary:
        return []
    v = summary[JUDGED][n]["mape"]["mean"]
    parts = [
        f"by {split} {100 * r:.1f}%, bound {150 * r:.1f}%: {'met' if v <= 1.5 * r else 'missed'}"
        for split, r in ref.items()
    ]
    return [
        f"Target (MAPE with at most 200 adaptation rows within 1.5x of the source model's "
        f"own held-out MAPE: {ref_rec.get('model')} in `{ref_rec.get('study')}`): {JUDGED}, "
        f"what `fusion-plan cost adapt` does by default, with {n} rows: {100 * v:.1f}%; "
        "against held out " + "; ".join(parts),
        "",
    ]
