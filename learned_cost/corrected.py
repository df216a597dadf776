"""The analytical model corrected by a trained MLP: a `planner.cost.CostModel`.

    C(P) = ctx( C_analytical(P) * exp(mlp(features(P)) + b) )

with b the online log-bias (online.py) and ctx the plan-context calibration
(plan_context.py: what a group costs inside a realized plan rather than alone). Planner objectives and search strategies take it
wherever they take `AnalyticalModel`, with no change: same protocol, same GroupCost (with
`correction` = the factor applied). Its `version` names the trained weights (their
digest) and the online state, so a plan made under it is recognisable and a cache of
group costs keyed on the version is never stale.

`load_corrected(path, device)` is the safe way in: a model saved for another device or
for another feature schema warns and gives back the plain analytical model, so planning
never stops for want of a correction. A CPU model trained on another CPU is used
normalized to this one (`CpuTransferWarning` says so, and by which figures): its features
are computed on the training machine's figures, as the network saw them, and the
correction it predicts multiplies this machine's roofline, built from the peak FLOP/s,
bandwidth and launch overhead `fusion-plan device-bench` measured here (a /proc/cpuinfo
estimate where it has not run). `CorrectedModel.update` adapts it further from a short
collection on this machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from learned_cost.analytical import AnalyticalModel
from learned_cost.data import descriptor_of
from learned_cost.features import (
    FEATURE_NAMES,
    analytical_parts,
    feature_vector,
    normalize_dtype,
)
from learned_cost.mlp import CorrectionMLP
from learned_cost.online import Observation, OnlineBias, UpdateReport
from learned_cost.persist import ModelMeta, load_model, save_model, spec_from_figures
from learned_cost.plan_context import FLOOR as PLAN_FLOOR
from learned_cost.plan_context import PlanContext, graph_footprint
from planner.cost import CostModel, GroupCost
from planner.errors import CostModelError
from planner.features import group_descriptor
from planner.fusion.realization import realization_of, split_label
from planner.hardware import DeviceSpec, device_fingerprint, get_spec
from planner.ir.graph import Category, OpGraph

RealizationOf = Callable[[OpGraph, frozenset[int]], str]


class CostModelFallbackWarning(UserWarning):
    """A saved correction did not fit this setting; the analytical model is used instead."""


class CpuTransferWarning(UserWarning):
    """A CPU correction trained on another CPU is used, normalized to this one's figures."""


def default_realization(graph: OpGraph, nodes: frozenset[int]) -> str:
    """A group's realization label: planner.fusion.realization's rule, the one the Plan records,
    realize runs and the collector wrote into every training row, so the model sees at
    planning time the label it learned from."""
    return realization_of(graph, nodes)


def graph_dtype(graph: OpGraph) -> str:
    """The model's compute dtype: its first floating user input, else its first parameter."""
    for kinds in (("input",), ("param", "buffer", "const")):
        for t in graph.tensors:
            if t.kind in kinds and t.dtype.startswith(("float", "bfloat")):
                return t.dtype
    return "float32"


class CorrectedModel:
    """Analytical roofline x learned correction; implements `planner.cost.CostModel`.

    Contract (CostModel's): `group_cost` is a pure function of (graph, nodes) between
    updates and is safe to call from several threads; `update` changes `version`.
    """

    name = "corrected"

    def __init__(
        self,
        analytical: AnalyticalModel,
        mlp: CorrectionMLP,
        *,
        model_id: str = "mlp-unsaved",
        online: OnlineBias | None = None,
        realization_of: RealizationOf | None = None,
        meta: ModelMeta | None = None,
        plan_context: PlanContext | None = None,
        feature_spec: DeviceSpec | None = None,
    ):
        """`feature_spec`: the device figures the network's features are computed on,
        where they differ from the analytical model's (a correction trained on another
        CPU: its figures there, while the roofline it corrects is this machine's)."""
        if not mlp.is_fitted:
            raise CostModelError("CorrectedModel needs a fitted CorrectionMLP (fit or load one)")
        self.analytical = analytical
        self.spec = analytical.spec
        self.feature_spec = feature_spec or analytical.spec
        self.mlp = mlp
        self.model_id = model_id
        self.online = online or OnlineBias()
        self.realization_of = realization_of or default_realization
        self.meta = meta
        self.plan_context = plan_context or PlanContext()
        self._lock = threading.RLock()
        self._dtypes: dict[str, str] = {}  # graph.key -> compute dtype (scanning costs ~20 us)
        self._footprints: dict[str, float] = {}  # graph.key -> plan_context.graph_footprint

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The features the network reads: its schema's (a model saved under an earlier
        feature schema reads that schema's, the first columns of today's)."""
        return tuple(getattr(self.mlp, "feature_names_", None) or FEATURE_NAMES)

    def __repr__(self) -> str:
        return f"CorrectedModel({self.spec.name}, {self.model_id}, bias={self.online.bias:+.3f})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickles (into compile workers, say) without its lock and per-graph caches."""
        state = dict(self.__dict__)
        del state["_lock"]
        state["_dtypes"] = {}
        state["_footprints"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def transferred(self) -> bool:
        """Whether the features are computed on another machine's figures than the roofline."""
        return self.feature_spec is not self.spec

    @property
    def version(self) -> str:
        n = self.online.n_observations
        # a transferred model corrects this machine's roofline: its figures name the costs
        where = f"@{figures_digest(self.spec)}" if self.transferred else ""
        return f"{self.analytical.version}+{self.model_id}{where}" + (f"+online{n}" if n else "")

    # ---- CostModel -----------------------------------------------------------------------
    def group_cost(self, graph: OpGraph, nodes: Iterable[int]) -> GroupCost:
        return self.group_costs(graph, [frozenset(nodes)])[0]

    def group_cost_as(self, graph: OpGraph, nodes: Iterable[int], label: str | None) -> GroupCost:
        """The group's cost when it runs as `label` (planner.fusion.realization.LABELS; None:
        the rule's). The network knows the base label (its one-hot feature), not a compile
        mode; a group of several ops run eagerly costs its ops alone."""
        members = frozenset(nodes)
        base = split_label(label)[0] if label else None
        if base == "eager":
            work = [i for i in sorted(members) if graph.nodes[i].category is not Category.VIEW]
            if len(work) > 1:
                parts = self.group_costs(graph, [frozenset((i,)) for i in work])
                whole = self.group_cost(graph, members)
                return replace(whole, latency_s=sum(c.latency_s for c in parts), correction=1.0)
        return self.group_costs(graph, [members], None if base is None else [base])[0]

    def group_cost_recomputing(
        self,
        graph: OpGraph,
        nodes: Iterable[int],
        copies: Iterable[int],
        label: str | None = None,
        unread: Iterable[int] = (),
    ) -> GroupCost:
        """The group `nodes` that also recomputes `copies` (planner.fusion.recompute): the
        roofline's figure with the copies' results unwritten, times the correction the
        network gives the same ops as one group."""
        members, copied = frozenset(nodes), frozenset(copies)
        fused = self.group_cost_as(graph, members | copied, label)
        plain = self.analytical.group_cost(graph, members | copied)
        base = self.analytical.group_cost_recomputing(graph, members, copied, label, unread)
        ratio = fused.latency_s / plain.latency_s if plain.latency_s > 0 else 1.0
        return replace(base, latency_s=base.latency_s * ratio, correction=ratio)

    def group_costs(
        self,
        graph: OpGraph,
        groups: Sequence[Iterable[int]],
        labels: Sequence[str] | None = None,
    ) -> list[GroupCost]:
        """Costs of several groups of one graph with one MLP call (what search loops want);
        `labels`: each group's realization feature (default: the model's `realization_of`)."""
        groups = [frozenset(g) for g in groups]
        bases = [self.analytical.group_cost(graph, g) for g in groups]
        work = [i for i, b in enumerate(bases) if b.latency_s > 0]
        if not work:
            return bases
        dtype = self._dtypes.get(graph.key) or self._dtypes.setdefault(
            graph.key, graph_dtype(graph)
        )
        X = np.vstack(
            [
                feature_vector(
                    group_descriptor(graph, groups[i]),
                    dtype=dtype,
                    spec=self.feature_spec,
                    realization=labels[i] if labels else self.realization_of(graph, groups[i]),
                    names=self.feature_names,
                )
                for i in work
            ]
        )
        with self._lock:
            r = self.mlp.predict(X) + self.online.bias
        footprint = self._footprints.get(graph.key)
        if footprint is None and self.plan_context.needs_footprint:
            footprint = self._footprints.setdefault(graph.key, graph_footprint(graph, self.spec))
        # every work group has latency > 0: in_plan is apply for the whole batch at once
        lats = self.plan_context.in_plan(
            np.array([bases[i].latency_s for i in work]) * np.exp(r), X, footprint
        )
        out = list(bases)
        for i, lat in zip(work, lats.tolist()):
            out[i] = replace(bases[i], latency_s=lat, correction=lat / bases[i].latency_s)
        return out

    def plan_cost_s(self, graph: OpGraph, groups: Sequence[Iterable[int]]) -> float:
        """Predicted latency of the realized plan `groups`: its group costs (in plan
        context) plus the executor's fixed cost per call (plan_context.py)."""
        total = sum(c.latency_s for c in self.group_costs(graph, groups))
        # per_plan_s is a fitted intercept and may be negative: floored like apply_sum,
        # so a small plan is never predicted to take no time (or less than none).
        return max(total + self.plan_context.per_plan_s, PLAN_FLOOR * total)

    # ---- online refinement ---------------------------------------------------------------------
    def update(self, rows: Iterable[Mapping[str, Any] | Observation]) -> UpdateReport:
        """Refine the correction from new measurements without retraining (online.py).

        `rows`: dataset-v1 rows of kind "group" (mappings with desc_* columns, dtype,
        device, measured_median_s, ok), and/or `Observation`s of whole plans from the tune
        loop. Rows of another device, failed rows and plan rows without a graph are skipped.
        """
        group_rows: list[Mapping[str, Any]] = []
        observations: list[Observation] = []
        skipped = 0
        for r in rows:
            if isinstance(r, Observation):
                if r.device in (None, self.spec.name) and r.measured_s > 0:
                    observations.append(r)
                else:
                    skipped += 1
            elif (
                r.get("kind", "group") == "group"
                and r.get("ok", True)
                and str(r.get("device", self.spec.name)) == self.spec.name
                and float(r.get("measured_median_s") or 0) > 0
            ):
                group_rows.append(r)
            else:
                skipped += 1
        with self._lock:
            before = self.online.bias
            residuals: list[float] = []
            if group_rows:
                X, y = self._rows_design(group_rows)
                keep = np.isfinite(y)
                X, y = X[keep], y[keep]
                skipped += int((~keep).sum())
                if self.online.last_layer_steps > 0 and len(y):
                    self.mlp.partial_fit(
                        X, y, steps=self.online.last_layer_steps, lr=self.online.lr
                    )
                base_r = self.mlp.predict(X) if len(y) else np.zeros(0)
                for yi, ri in zip(y, base_r):
                    residuals.append(float(yi - ri - self.online.bias))
                    self.online.observe(residuals[-1])
            for ob in observations:
                predicted = self.plan_cost_s(ob.graph, ob.groups)
                if predicted > 0:
                    residuals.append(math.log(ob.measured_s / predicted))
                    self.online.observe(residuals[-1])
                else:
                    skipped += 1
            return UpdateReport(
                used=len(residuals),
                skipped=skipped,
                bias_before=before,
                bias_after=self.online.bias,
                mean_abs_residual=float(np.mean(np.abs(residuals))) if residuals else 0.0,
                version=self.version,
            )

    def _rows_design(self, rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for r in rows:
            desc = descriptor_of(r)
            dtype = normalize_dtype(str(r.get("dtype") or "float32"))
            parts = analytical_parts(desc, self.feature_spec, dtype)
            xs.append(
                feature_vector(
                    desc,
                    dtype=dtype,
                    spec=self.feature_spec,
                    realization=str(r.get("realization") or "inductor"),
                    parts=parts,
                    names=self.feature_names,
                )
            )
            # the target is relative to the roofline the model corrects (this machine's)
            lat = (
                analytical_parts(desc, self.spec, dtype).latency_s
                if self.transferred
                else parts.latency_s
            )
            ys.append(math.log(float(r["measured_median_s"]) / lat) if lat > 0 else float("nan"))
        return np.vstack(xs), np.array(ys)

    # ---- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path) -> ModelMeta:
        """Save weights, online state and the metadata this model was loaded with."""
        m = self.meta
        meta = save_model(
            self.mlp,
            path,
            spec=self.spec,
            device_fingerprints=m.device_fingerprints if m else (),
            data_hash=m.data_hash if m else "",
            data_files=m.data_files if m else (),
            n_rows=m.n_rows if m else 0,
            metrics=m.metrics if m else {},
            online=self.online.state(),
            plan_context=self.plan_context.to_json(),
            command=m.command if m else "",
        )
        self.model_id, self.meta = meta.model_id, meta
        return meta


def load_corrected(
    path: str | Path,
    device: str | None = None,
    *,
    realization_of: RealizationOf | None = None,
) -> CostModel:
    """The saved correction for `device` as a CostModel, or the analytical model with a
    `CostModelFallbackWarning` when the saved model does not fit (another device, another
    feature schema, another CPU, missing or corrupt files)."""
    try:
        mlp, meta = load_model(path, device=device)
        spec = spec_from_figures(meta.spec_figures)
        feature_spec = None
        if meta.device_kind == "cpu" and device_fingerprint("cpu") not in meta.device_fingerprints:
            feature_spec, spec = spec, get_spec("cpu")
            warnings.warn(
                cpu_transfer_message(meta, feature_spec, spec, path), CpuTransferWarning, 2
            )
    except CostModelError as e:
        fallback = get_spec(device) if device else get_spec(None)
        warnings.warn(
            f"learned cost model {path} not used ({e}); falling back to the analytical "
            f"model for {fallback.name}",
            CostModelFallbackWarning,
            stacklevel=2,
        )
        return AnalyticalModel(fallback)
    return CorrectedModel(
        AnalyticalModel(spec),
        mlp,
        model_id=meta.model_id,
        online=OnlineBias.from_state(meta.online),
        realization_of=realization_of,
        meta=meta,
        plan_context=PlanContext.from_json(meta.plan_context),
        feature_spec=feature_spec,
    )


def _figures(spec: DeviceSpec) -> str:
    return (
        f"peak {spec.peak_matmul_flops('float32') / 1e9:.0f} GFLOP/s fp32, bandwidth "
        f"{spec.bandwidth_Bps / 1e9:.1f} GB/s, launch {spec.launch_s * 1e6:.1f} us"
    )


def figures_digest(spec: DeviceSpec) -> str:
    """A short digest of the figures a roofline is built from (peaks, bandwidth, launch)."""
    text = json.dumps(
        [spec.peak_matmul_flops("float32"), spec.bandwidth_Bps, spec.launch_s, spec.sm_count]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def cpu_transfer_message(
    meta: ModelMeta, trained: DeviceSpec, here: DeviceSpec, path: str | Path = "MODEL.json"
) -> str:
    """What a CPU correction from another machine is used as, by which figures, and the
    commands that adapt it to this machine."""
    how = (
        "this machine's figures measured by `fusion-plan device-bench`"
        if here.measured is not None
        else "this machine's figures ESTIMATED from /proc/cpuinfo (no device-bench run here: "
        "run `fusion-plan device-bench` to measure peak FLOP/s, bandwidth and launch "
        "overhead, then the model is normalized by those)"
    )
    return (
        f"learned cost model {meta.model_id} was trained on CPU(s) "
        f"{list(meta.device_fingerprints)}, this one is {device_fingerprint('cpu')}: it is "
        f"used NORMALIZED, its correction applied to {how} ({_figures(here)}; trained on "
        f"{_figures(trained)}). To adapt it to this CPU, collect a few minutes of rows "
        "here and fine-tune it on them: `fusion-plan collect --models all --max-seconds 300 "
        f"--out data/this_cpu.parquet`, then `fusion-plan cost adapt --model {path} --data "
        "data/this_cpu.parquet --device cpu --out this_cpu.json` and pass --cost-model "
        "this_cpu.json (or retrain with `fusion-plan cost train` on more rows)."
    )
