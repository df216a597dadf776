"""Saving and loading trained corrections without pickle: weights in .npz, the rest in JSON.

A saved model is two files side by side: `<name>.json` (metadata: feature schema, device,
the device figures the analytical base used, torch version, metrics, data hash, the
command that trained it) and `<name>.npz` (named float arrays, read with
allow_pickle=False). Its `model_id` is a digest of both (the weights, the settings, the
feature schema, the device figures and the plan context: everything a group's cost
depends on), so a plan made under it names exactly this model.

The device figures are saved because the target was ln(measured / analytical) under
those figures: a later `device-bench` that changes the local peaks must not shift the
base under a trained correction, so `CorrectedModel` rebuilds the base from them.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learned_cost.features import (
    DTYPES,
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    SCHEMA_HASH,
    SCHEMAS,
)
from learned_cost.mlp import CorrectionMLP
from learned_cost.plan_context import GRAPH_FEATURES
from planner.errors import CostModelError, DeviceSpecError
from planner.hardware import TF32, DeviceSpec, get_spec

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ModelMeta:
    """Everything a saved correction says about itself."""

    model_id: str
    form: str
    params: dict[str, Any]
    device: str  # spec name, e.g. "h100"
    device_kind: str  # "gpu" | "cpu"
    device_fingerprints: tuple[str, ...]  # of the machines the rows were measured on
    spec_figures: dict[str, Any]  # what the analytical base used (spec_figures())
    feature_schema_version: int = FEATURE_SCHEMA_VERSION
    feature_schema_hash: str = SCHEMA_HASH
    feature_names: tuple[str, ...] = FEATURE_NAMES
    torch_version: str = field(default_factory=lambda: torch.__version__.split("+")[0])
    data_hash: str = ""
    data_files: tuple[str, ...] = ()
    n_rows: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    online: dict[str, Any] = field(default_factory=dict)
    plan_context: dict[str, Any] = field(default_factory=dict)  # plan_context.PlanContext
    command: str = ""
    trained_at: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    )
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def spec_figures(spec: DeviceSpec) -> dict[str, Any]:
    """The effective figures of `spec` the features and the analytical base read."""
    return {
        "name": spec.name,
        "kind": spec.kind,
        "matmul_flops": {d: spec.peak_matmul_flops(d) for d in DTYPES}
        | ({TF32: spec.tf32_flops} if spec.tf32_flops else {}),
        "vector_flops": {d: spec.peak_vector_flops(d) for d in DTYPES},
        "bandwidth_Bps": spec.bandwidth_Bps,
        "launch_s": spec.launch_s,
        "sm_count": spec.sm_count,
        "l2_bytes": spec.l2_bytes,
        "measured": spec.measured is not None,
    }


def spec_from_figures(figures: dict[str, Any]) -> DeviceSpec:
    """A DeviceSpec with exactly the saved figures (datasheet fields fill the rest)."""
    try:
        base = get_spec(figures["name"], measured=False)
        return replace(
            base,
            matmul_flops=dict(figures["matmul_flops"]),
            vector_flops=dict(figures["vector_flops"]),
            mem_bw_Bps=float(figures["bandwidth_Bps"]),
            launch_overhead_s=float(figures["launch_s"]),
            sm_count=int(figures["sm_count"]),
            l2_bytes=int(figures["l2_bytes"]),
            measured=None,
            sources={**base.sources, "figures": "restored from a saved learned_cost model"},
        )
    except (KeyError, TypeError, ValueError, DeviceSpecError) as e:
        raise CostModelError(f"saved device figures do not parse ({e}); retrain the model") from e


def _digest_core(
    params: dict[str, Any],
    schema: str,
    figures: dict[str, Any],
    plan_context: dict[str, Any] | None,
) -> dict[str, Any]:
    """What the model_id digests besides the arrays. The plan context (the in-plan factor
    the planner's group costs go through) joined it later: a model saved before names
    only the rest (`plan_context` None), and still loads under that name."""
    core = {"params": params, "schema": schema, "figures": figures}
    if plan_context is not None:
        core["plan_context"] = plan_context
    return core


def _arrays_digest(arrays: dict[str, np.ndarray], meta_core: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(meta_core, sort_keys=True, default=str).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype=np.float64)
        h.update(name.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:12]


def paths_for(path: str | Path) -> tuple[Path, Path]:
    """(metadata .json, weights .npz) for a model path given with or without a suffix."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".json", ".npz") else p
    return stem.with_suffix(".json"), stem.with_suffix(".npz")


def save_model(
    model: CorrectionMLP,
    path: str | Path,
    *,
    spec: DeviceSpec,
    device_fingerprints: tuple[str, ...] = (),
    data_hash: str = "",
    data_files: tuple[str, ...] = (),
    n_rows: int = 0,
    metrics: dict[str, Any] | None = None,
    online: dict[str, Any] | None = None,
    plan_context: dict[str, Any] | None = None,
    command: str = "",
) -> ModelMeta:
    """Write `<path>.json` + `<path>.npz`; returns the metadata (with its model_id). Only a
    model fitted on the columns of a known feature schema is saved (today's FEATURE_NAMES,
    or an earlier schema's for a model adapted from one): the planner feeds it those."""
    arrays = model.state_arrays()
    names = tuple(getattr(model, "feature_names_", None) or FEATURE_NAMES)
    schema = next((h for h, (_, n) in SCHEMAS.items() if n == names), None)
    if schema is None or model.n_features_in_ != len(names):
        raise CostModelError(
            f"save_model: the model was fitted on {model.n_features_in_} columns, not the "
            f"{len(FEATURE_NAMES)} of learned_cost.features.FEATURE_NAMES the planner feeds it"
        )
    version = SCHEMAS[schema][0]
    params = model.get_params()
    params["hidden"] = list(params["hidden"])
    figures = spec_figures(spec)
    core = _digest_core(params, schema, figures, plan_context or {})
    meta = ModelMeta(
        model_id=f"mlp-{model.form}-{_arrays_digest(arrays, core)}",
        form=model.form,
        params=params,
        device=spec.name,
        device_kind=spec.kind,
        device_fingerprints=tuple(sorted(set(device_fingerprints))),
        spec_figures=figures,
        feature_schema_version=version,
        feature_schema_hash=schema,
        feature_names=names,
        data_hash=data_hash,
        data_files=tuple(data_files),
        n_rows=n_rows,
        metrics=metrics or {},
        online=online or {},
        plan_context=plan_context or {},
        command=command,
    )
    json_path, npz_path = paths_for(path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(npz_path, **arrays)  # the twin table repeats itself: it packs well
    json_path.write_text(json.dumps(meta.to_json(), indent=2, sort_keys=True, default=float) + "\n")
    return meta


def read_meta(path: str | Path) -> ModelMeta:
    """The metadata of a saved model, checked for format but not for fit to a setting."""
    json_path, _ = paths_for(path)
    if not json_path.is_file():
        raise CostModelError(
            f"no saved model at {json_path}; train one with `fusion-plan cost train`"
        )
    try:
        data = json.loads(json_path.read_text())
        if not isinstance(data, dict):
            raise CostModelError(
                f"{json_path} holds a JSON {type(data).__name__}, not a saved learned_cost model"
            )
        if data.get("format_version") != FORMAT_VERSION:
            raise CostModelError(
                f"{json_path} has format {data.get('format_version')}, expected "
                f"{FORMAT_VERSION}; retrain with `fusion-plan cost train`"
            )
        data["device_fingerprints"] = tuple(data.get("device_fingerprints", ()))
        data["feature_names"] = tuple(data.get("feature_names", ()))
        data["data_files"] = tuple(data.get("data_files", ()))
        return ModelMeta(**data)
    except (ValueError, TypeError) as e:
        raise CostModelError(f"{json_path} is not a saved learned_cost model ({e})") from e


def check_compatible(meta: ModelMeta, device: str | None = None) -> list[str]:
    """Reasons the saved model must not be used here (empty: it may)."""
    reasons = []
    if meta.feature_schema_hash not in SCHEMAS:
        reasons.append(
            f"feature schema {meta.feature_schema_hash} (v{meta.feature_schema_version}) "
            f"is none this code knows (today's: {SCHEMA_HASH}, v{FEATURE_SCHEMA_VERSION}; "
            f"it also reads v{', v'.join(str(v) for v, _ in list(SCHEMAS.values())[1:])})"
        )
    if device is not None and device.lower() != meta.device:
        reasons.append(f"trained for device {meta.device!r}, asked for {device!r}")
    graph_features = tuple((meta.plan_context or {}).get("graph_features") or ())
    if graph_features and graph_features != GRAPH_FEATURES:
        reasons.append(
            f"its plan context reads graph features {list(graph_features)}, this code "
            f"knows {list(GRAPH_FEATURES)}"
        )
    return reasons


def load_model(path: str | Path, *, device: str | None = None) -> tuple[CorrectionMLP, ModelMeta]:
    """Load a saved correction; raises CostModelError if it does not fit this code/device."""
    meta = read_meta(path)
    reasons = check_compatible(meta, device)
    if reasons:
        raise CostModelError(
            f"saved model {meta.model_id} cannot be used: {'; '.join(reasons)}. Retrain it "
            "with `fusion-plan cost train` for this device and code"
        )
    _, npz_path = paths_for(path)
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise CostModelError(f"weights {npz_path} are missing or unreadable ({e})") from e
    model = CorrectionMLP.from_state(meta.params, arrays)
    names = SCHEMAS[meta.feature_schema_hash][1]
    if model.n_features_in_ != len(names):
        raise CostModelError(
            f"weights in {npz_path} read {model.n_features_in_} features, but feature schema "
            f"{meta.feature_schema_hash} has {len(names)}: the files were changed or mixed up"
        )
    model.feature_names_ = names  # the planner feeds it these (features.feature_vector)
    arrays = model.state_arrays()
    digests = [
        _arrays_digest(
            arrays,
            _digest_core(meta.params, meta.feature_schema_hash, meta.spec_figures, context),
        )
        for context in (meta.plan_context, None)  # None: saved before the context was in it
    ]
    digest = digests[0]
    if not any(meta.model_id.endswith(d) for d in digests):
        raise CostModelError(
            f"weights in {npz_path} do not match {meta.model_id} (digest {digest}): the files "
            "were changed or mixed up; retrain or restore both together"
        )
    return model, meta
