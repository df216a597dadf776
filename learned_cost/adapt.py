"""A trained correction moved to another device from a few of that device's measurements.

A correction trained on one device (the source, with thousands of rows) is adapted to
another (the target: a short `fusion-plan collect` there) in steps:

1. The target's rows are featurized on the target's own figures (peaks, bandwidth,
   launch overhead, SMs, L2: its DeviceSpec), and the target is the log-ratio to the
   target's roofline, so the network is asked what fraction of the new device's roofs a
   group reaches: the question it learned to answer on the source.
2. `bias`: the median log residual of the source model on the target rows, one number
   (kept as the model's online bias, learned_cost/online.py).
3. `last-layer`: the output layer of every network refitted to what the bias leaves;
   `finetune`: every weight, warm-started from the source, a few steps at a lower
   learning rate than training (the source's features' scaling kept).
4. Twins: the source's twin table holds another device's measurements, and its feature
   rows (the source's figures) never match a target row, so it is dropped; the target's
   rows become the new table (learned_cost/twins.py), answering groups measured there.

What each step buys, against training from scratch on the same rows, is measured by
learned_cost/study/adapt_curve.py (`fusion-plan cost adapt-study`), the error on graphs
the adaptation rows did not come from as the number of rows grows; docs/learned_cost.md
shows it. `fusion-plan cost adapt` writes an adapted model the planner loads like any
other.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from learned_cost.data import rows_hash
from learned_cost.features import FEATURE_NAMES, Design, design_matrix
from learned_cost.mlp import CorrectionMLP
from learned_cost.online import OnlineBias
from learned_cost.persist import ModelMeta, save_model
from learned_cost.twins import TwinTable
from planner.errors import CostModelError
from planner.hardware import DeviceSpec

# name -> what it changes (each includes the ones before it)
METHODS = {
    "none": "the source model as it is, on the target's figures (no target rows used)",
    "bias": "one log-bias: the median residual of the source model on the target rows",
    "last-layer": "bias, then every network's output layer refitted on the target rows",
    "finetune": "bias, then every weight fine-tuned from the source's, a few steps",
}
DEFAULT_STEPS = {"last-layer": 300, "finetune": 200}


@dataclass(frozen=True)
class AdaptConfig:
    """`method` (a key of METHODS); `steps` and `lr` of the gradient steps (None: the
    method's DEFAULT_STEPS; lr well under training's 3e-3, so a few rows move the
    weights a little, not back to a random start); `twins`: the target rows answer
    groups they measured."""

    method: str = "finetune"
    steps: int | None = None
    lr: float = 1e-3
    twins: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CostModelError(
                f"adapt method must be one of {list(METHODS)}, got {self.method!r}"
            )
        if self.steps is not None and self.steps < 0:
            raise CostModelError(f"adapt steps must be >= 0, got {self.steps}")
        if not self.lr > 0:
            raise CostModelError(f"adapt lr must be > 0, got {self.lr}")

    @property
    def n_steps(self) -> int:
        return DEFAULT_STEPS.get(self.method, 0) if self.steps is None else self.steps


@dataclass
class Adapted:
    """The adapted networks and the log-bias that goes with them: the target's
    ln(measured / analytical) is predicted as `mlp.predict(X) + bias`."""

    mlp: CorrectionMLP
    bias: float

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.mlp.predict(X) + self.bias


def _mape(pred_s: np.ndarray, measured_s: np.ndarray) -> float:
    return float(np.mean(np.abs(pred_s - measured_s) / measured_s))


def without_twins(model: CorrectionMLP) -> CorrectionMLP:
    """A copy of a fitted model that answers every group from its networks."""
    out = copy.deepcopy(model)
    out.twins = False
    if hasattr(out, "twins_"):
        del out.twins_
    return out


def adapt_mlp(source: CorrectionMLP, X: np.ndarray, y: np.ndarray, cfg: AdaptConfig) -> Adapted:
    """The source model adapted to target rows (features X on the target's figures,
    targets y = ln(measured / target analytical)). The source is left as it was."""
    model = without_twins(source)
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if cfg.method == "none" or len(y) == 0:
        return Adapted(model, 0.0)
    bias = float(np.median(y - model.predict(X)))
    rest = y - bias
    if cfg.method in ("last-layer", "finetune") and len(y) >= 2 and cfg.n_steps > 0:
        model.fine_tune(X, rest, steps=cfg.n_steps, lr=cfg.lr, last_only=cfg.method != "finetune")
    if cfg.twins:
        model.twins = True
        model.twins_ = TwinTable.fit(X, rest)
    return Adapted(model, bias)


def target_design(
    rows: Sequence[Mapping[str, Any]], spec: DeviceSpec, names: Sequence[str] = FEATURE_NAMES
) -> Design:
    """Features `names` (the source model's) and targets of target rows on `spec`'s
    figures (rows grouped by graph)."""
    return design_matrix(rows, lambda _name: spec, group_by="graph_key", names=names)


def adapt_saved(
    source: CorrectionMLP,
    source_meta: ModelMeta,
    rows: Sequence[Mapping[str, Any]],
    spec: DeviceSpec,
    cfg: AdaptConfig,
    out: str | Path,
    *,
    data_files: Sequence[str] = (),
    command: str = "",
) -> tuple[ModelMeta, dict[str, Any]]:
    """Adapt `source` to the group rows `rows` of device `spec` and save it at `out`
    (.json + .npz), a model for that device; returns its metadata and a summary (rows
    used, bias, in-sample MAPE before and after: a fit, not a held-out score)."""
    d = target_design(rows, spec, source.feature_names_ or FEATURE_NAMES)
    if len(d) < 1:
        raise CostModelError(
            f"no usable group rows of device {spec.name!r} to adapt with; collect some with "
            f"`fusion-plan collect --device {spec.name} --out data/{spec.name}_profiles.parquet`"
        )
    adapted = adapt_mlp(source, d.X, d.y, cfg)
    before = without_twins(source).predict(d.X)
    summary = {
        "adapted_from": {
            "model_id": source_meta.model_id,
            "device": source_meta.device,
            "data_files": list(source_meta.data_files),
            "n_rows": source_meta.n_rows,
        },
        "adaptation": {
            **asdict(cfg),
            "steps": cfg.n_steps,
            "n_rows": len(d),
            "n_graphs": len(set(d.groups.tolist())),
            "bias": adapted.bias,
            "in_sample_mape_source": _mape(d.analytical_s * np.exp(before), d.measured_s),
            "in_sample_mape_adapted": _mape(
                d.analytical_s * np.exp(adapted.predict(d.X)), d.measured_s
            ),
        },
        "committed_model": f"mlp-{source.form}" + ("+twins" if cfg.twins else ""),
    }
    online = OnlineBias.from_state(source_meta.online)
    online.bias = adapted.bias
    online.max_abs_bias = max(online.max_abs_bias, abs(adapted.bias) + 1.0)
    meta = save_model(
        adapted.mlp,
        out,
        spec=spec,
        device_fingerprints=tuple(sorted({str(r.get("device_fingerprint") or "") for r in rows})),
        data_hash=rows_hash(rows),
        data_files=tuple(data_files),
        n_rows=len(d),
        metrics=summary,
        online=online.state(),
        plan_context=source_meta.plan_context,
        command=command,
    )
    return meta, summary
