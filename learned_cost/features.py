"""Model features of a group: raw descriptor + device spec + the analytical prediction's parts.

docs/formulas.md §8: f_S = [op types, tensor shapes, compute intensity, memory pattern]; §11:
T_fused = max(T_compute, T_memory) + T_overhead, corrected by factors learned from profiles.
The learned model predicts log(measured / analytical) from the features below, so the
analytical roofline carries the scale and the model learns only what the roofline misses.

Every feature is an entry of `FEATURES`: (name, function of a `FeatureContext`, why).
Changing the table changes `SCHEMA_HASH`. Features are only ever appended, so the features
of an earlier schema are the first columns of today's: `SCHEMAS` maps the hash of each
schema a saved model may carry to its names, a model is fed exactly the features it was
trained on (`feature_vector(..., names=...)`), and a model of a schema this code does not
know is refused (persist.py).

The analytical parts are recomputed here from the descriptor and a device spec, with the
same formulas as `learned_cost.analytical.AnalyticalModel` (tests check they agree on real
graphs), so a model is trained against exactly the roofline it will correct at planning time.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.hardware import DeviceSpec
from planner.ir.graph import Category

FEATURE_SCHEMA_VERSION = 6  # 3: TF32 convolutions; 4: GEMM waves; 5: anchor N, alignment;
# 6: what the hardware sees (per-op traffic, kernels, tiles and waves, reductions)
_TINY = 1e-12  # floor for logs of seconds, FLOPs and bytes: log10(0) would be -inf

# Ops that cost more than one FMA per element (exp/erf/tanh inside): they dominate
# vector-bound groups on CPUs and add SFU pressure on GPUs.
TRANSCENDENTAL_OPS = frozenset(
    {
        "exp",
        "exp2",
        "log",
        "log1p",
        "erf",
        "tanh",
        "sigmoid",
        "silu",
        "gelu",
        "softplus",
        "sqrt",
        "rsqrt",
        "pow",
        "sin",
        "cos",
        "_softmax",
        "softmax",
        "_log_softmax",
        "log_softmax",
        "layer_norm",
        "native_layer_norm",
        "rms_norm",
        "group_norm",
    }
)
GEMM_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "addbmm"})
CONV_OPS = frozenset({"convolution", "conv1d", "conv2d", "conv3d", "_convolution"})
DTYPES = ("float32", "bfloat16", "float16")
# The labels of planner.fusion.realization.REALIZATIONS, in the order the trained models'
# one-hot features were saved with (their names enter SCHEMA_HASH: a change is refused on
# load; tests/test_realization.py checks the two lists hold the same labels).
REALIZATIONS = ("inductor", "sdpa", "concat_gemm", "eager")


@dataclass(frozen=True)
class AnalyticalParts:
    """The roofline prediction of one group (seconds), as AnalyticalModel computes it."""

    t_compute_s: float
    t_memory_s: float
    t_launch_s: float

    @property
    def latency_s(self) -> float:
        return max(self.t_compute_s, self.t_memory_s) + self.t_launch_s


_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def normalize_dtype(name: str) -> str:
    """ "bf16" / "torch.bfloat16" / "bfloat16" -> "bfloat16" (rows and graphs spell it alike)."""
    name = name.removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def group_dtype(desc: Mapping[str, Any], dtype: str) -> str:
    """The dtype whose peaks apply: the group's own when it has one, else the model's."""
    d = str(desc.get("dtype") or "")
    return normalize_dtype(d if d and "," not in d else dtype)


def analytical_parts(desc: Mapping[str, Any], spec: DeviceSpec, dtype: str) -> AnalyticalParts:
    """T_compute, T_memory, T_launch of a descriptor on `spec` (docs/formulas.md §11)."""
    dt = group_dtype(desc, dtype)
    conv = float(desc.get("flops_conv") or 0)  # convolutions may run in TF32 (hardware.py)
    t_c = (
        (float(desc.get("flops_matmul") or 0) - conv) / spec.peak_compute_flops(dt)
        + conv / spec.peak_compute_flops(dt, conv=True)
        + float(desc.get("flops_vector") or 0) / spec.peak_vector_flops(dt)
    )
    t_m = (
        float(desc.get("bytes_in") or 0) + float(desc.get("bytes_out") or 0)
    ) / spec.bandwidth_Bps
    t_l = float(desc.get("n_kernels") or 0) * spec.launch_s
    return AnalyticalParts(t_c, t_m, t_l)


@dataclass(frozen=True)
class FeatureContext:
    """What one feature function sees: the group, its setting and its roofline."""

    desc: Mapping[str, Any]
    dtype: str
    realization: str
    spec: DeviceSpec
    parts: AnalyticalParts

    def num(self, key: str) -> float:
        v = self.desc.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else 0.0

    def ops(self, key: str) -> list[str]:
        text = self.desc.get(key) or ""
        return [o for o in str(text).split(",") if o]


TILE = 128 * 128  # output elements per tile of a tensor-core GEMM, the usual cuBLAS size


def _output_tiles(c: FeatureContext) -> float:
    """Tiles of the largest output of a group with an anchor on a GPU (0 without one, and
    on a CPU: its cores do not run a GEMM in waves of 128x128 tiles)."""
    if not c.num("n_compute") or c.spec.kind != "gpu":
        return 0.0
    return float(math.ceil(max(c.num("max_out_numel"), 1.0) / TILE))


def _wave_efficiency(tiles: float, sms: int) -> float:
    if not tiles or sms <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / sms) * sms)


def _lg(x: float) -> float:
    return math.log10(max(x, _TINY))


def _lg1p(x: float) -> float:
    return math.log10(1.0 + max(x, 0.0))


def _intensity(c: FeatureContext) -> float:
    moved = c.num("bytes_in") + c.num("bytes_out")
    return (c.num("flops_matmul") + c.num("flops_vector")) / moved if moved else 0.0


def _boundary_bytes(c: FeatureContext) -> float:
    return c.num("bytes_in") + c.num("bytes_out")


def _ridge(c: FeatureContext) -> float:
    return c.spec.peak_matmul_flops(group_dtype(c.desc, c.dtype)) / c.spec.bandwidth_Bps


Feature = tuple[str, Callable[[FeatureContext], float], str]

_CATEGORY_FEATURES: tuple[Feature, ...] = tuple(
    (
        f"n_{cat.value}",
        (lambda c, k=f"n_{cat.value}": _lg1p(c.num(k))),
        "op-category histogram (log1p count): what kind of work the group holds",
    )
    for cat in Category
)

# The features of schema 5, the first columns of every later schema.
FEATURES_V5: tuple[Feature, ...] = (
    *_CATEGORY_FEATURES,
    ("n_ops", lambda c: _lg1p(c.num("n_ops")), "group size: more ops, more code per kernel"),
    ("n_work_ops", lambda c: _lg1p(c.num("n_work_ops")), "ops that are not free views"),
    ("flops_matmul", lambda c: _lg1p(c.num("flops_matmul")), "tensor-core work (log10)"),
    ("flops_vector", lambda c: _lg1p(c.num("flops_vector")), "vector-unit work (log10)"),
    ("bytes_in", lambda c: _lg1p(c.num("bytes_in")), "boundary reads (log10 bytes)"),
    ("bytes_out", lambda c: _lg1p(c.num("bytes_out")), "boundary writes (log10 bytes)"),
    (
        "bytes_internal",
        lambda c: _lg1p(c.num("bytes_internal")),
        "what fusion keeps on chip: big internals may spill or recompute",
    ),
    ("n_inputs", lambda c: _lg1p(c.num("n_inputs")), "boundary tensors read: more streams"),
    ("n_outputs", lambda c: _lg1p(c.num("n_outputs")), "boundary tensors written"),
    (
        "log2_max_out_numel",
        lambda c: c.num("log2_max_out_numel"),
        "log shape: small tensors underfill the device, so efficiency falls",
    ),
    ("itemsize", lambda c: c.num("itemsize"), "bytes per element of the narrowest output"),
    (
        "n_anchors",
        lambda c: _lg1p(len(c.ops("anchor_ops"))),
        "compute anchors in the group: 2+ is a horizontal or attention fusion",
    ),
    (
        "has_gemm",
        lambda c: float(any(o in GEMM_OPS for o in c.ops("anchor_ops"))),
        "GEMM anchors reach a different fraction of peak than convolutions",
    ),
    (
        "has_conv",
        lambda c: float(any(o in CONV_OPS for o in c.ops("anchor_ops"))),
        "convolutions: layout and algorithm choice move efficiency",
    ),
    (
        "has_sdpa",
        lambda c: float(any("attention" in o for o in c.ops("anchor_ops"))),
        "a fused attention kernel has its own efficiency curve",
    ),
    (
        "anchor_max_flops",
        lambda c: _lg1p(c.num("anchor_max_flops")),
        "the largest anchor's size: small GEMMs reach a small fraction of peak",
    ),
    (
        "n_transcendental",
        lambda c: _lg1p(sum(o in TRANSCENDENTAL_OPS for o in c.ops("ops"))),
        "exp/erf/tanh cost more than an FMA: vector-bound groups on CPU feel it",
    ),
    (
        "n_reductions",
        lambda c: _lg1p(c.num("n_reduction") + c.num("n_norm") + c.num("n_softmax")),
        "reductions force a two-pass or a block-wide reduce inside the kernel",
    ),
    (
        "anchor_flops_per_out",
        lambda c: _lg1p(c.num("anchor_max_flops") / max(c.num("max_out_numel"), 1.0)),
        "FLOPs per output element of the largest anchor: 2K of a GEMM, 2*C_in*k*k of a "
        "convolution; a short reduction dimension keeps tensor cores from their peak",
    ),
    (
        "anchor_waves",
        lambda c: _lg(_output_tiles(c) / max(c.spec.sm_count, 1)) if _output_tiles(c) else 0.0,
        "output tiles (128x128) of the largest output over the SM count (log10): under one "
        "wave, a GEMM or convolution leaves SMs idle",
    ),
    (
        "wave_efficiency",
        lambda c: _wave_efficiency(_output_tiles(c), c.spec.sm_count),
        "the share of the last wave's SMs that get a tile: tiles / (waves x SMs); a GEMM "
        "one tile past a full wave runs nearly two waves' time",
    ),
    (
        "anchor_n_fill",
        lambda c: min(c.num("anchor_n"), 128.0) / 128.0 if c.num("anchor_n") else 1.0,
        "the share of a 128-wide tile that the largest anchor's N (a GEMM's output columns, "
        "a convolution's output channels) fills: 32 channels leave 3/4 of each tile idle",
    ),
    (
        "anchor_log2_n",
        lambda c: math.log2(c.num("anchor_n")) if c.num("anchor_n") else 0.0,
        "log2 of that N",
    ),
    (
        "anchor_misaligned",
        lambda c: float(
            c.spec.kind == "gpu"
            and c.num("anchor_n") > 0
            and (int(c.num("anchor_n")) % 8 != 0 or int(c.num("anchor_k")) % 8 != 0)
        ),
        "1 where the largest anchor's N or K is not a multiple of 8 on a GPU: tensor cores "
        "want 16-byte aligned rows (a 3-channel convolution has K = 27)",
    ),
    (
        "elems_in_per_out",
        lambda c: math.log10(
            max(
                c.num("bytes_in") / max(c.num("itemsize"), 1.0) / max(c.num("max_out_numel"), 1.0),
                1e-3,
            )
        ),
        "elements read per element written (log10, floored at 1e-3 for groups that read "
        "nothing): reductions and gathers read many, broadcasts few",
    ),
    (
        "internal_share",
        lambda c: (
            c.num("bytes_internal") / (_boundary_bytes(c) + c.num("bytes_internal"))
            if _boundary_bytes(c) + c.num("bytes_internal")
            else 0.0
        ),
        "fraction of the group's traffic kept on chip: the fusion's own saving",
    ),
    (
        "working_set_over_l2",
        lambda c: _lg(_boundary_bytes(c) / max(c.spec.l2_bytes, 1.0)),
        "boundary bytes against the L2 size: a group replayed back to back whose tensors fit "
        "in L2 runs faster than the DRAM roof says",
    ),
    (
        "intensity",
        lambda c: _lg1p(_intensity(c)),
        "arithmetic intensity I = FLOPs / bytes (docs/formulas.md §9), log10",
    ),
    (
        "intensity_over_ridge",
        lambda c: _lg(_intensity(c) / _ridge(c)) if _intensity(c) else -6.0,
        "Habitat: efficiency scales with I against the target's ridge point I_c",
    ),
    ("t_compute", lambda c: _lg(c.parts.t_compute_s), "analytical T_compute (log10 s)"),
    ("t_memory", lambda c: _lg(c.parts.t_memory_s), "analytical T_memory (log10 s)"),
    ("t_launch", lambda c: _lg(c.parts.t_launch_s), "analytical T_launch (log10 s)"),
    ("t_analytical", lambda c: _lg(c.parts.latency_s), "the prediction being corrected"),
    (
        "compute_share",
        lambda c: (
            c.parts.t_compute_s / (c.parts.t_compute_s + c.parts.t_memory_s)
            if c.parts.t_compute_s + c.parts.t_memory_s
            else 0.0
        ),
        "where on the roofline: 1 = compute-bound, 0 = memory-bound",
    ),
    (
        "roof_over_launch",
        lambda c: (
            _lg(max(c.parts.t_compute_s, c.parts.t_memory_s) / c.parts.t_launch_s)
            if c.parts.t_launch_s
            else 6.0
        ),
        "launch-dominated groups (tiny work) are corrected by overhead, not by roofs",
    ),
    *(
        (f"dtype_{d}", (lambda c, d=d: float(group_dtype(c.desc, c.dtype) == d)), "dtype one-hot")
        for d in DTYPES
    ),
    *(
        (
            f"realization_{r}",
            (lambda c, r=r: float(c.realization == r)),
            "how the group runs: Inductor, a fused kernel, or eager ops",
        )
        for r in REALIZATIONS
    ),
    (
        "dev_peak_matmul",
        lambda c: _lg(c.spec.peak_matmul_flops(group_dtype(c.desc, c.dtype))),
        "device: matmul peak (log10 FLOP/s)",
    ),
    (
        "dev_peak_vector",
        lambda c: _lg(c.spec.peak_vector_flops(group_dtype(c.desc, c.dtype))),
        "device: vector peak",
    ),
    ("dev_bandwidth", lambda c: _lg(c.spec.bandwidth_Bps), "device: memory bandwidth"),
    ("dev_launch", lambda c: _lg(c.spec.launch_s), "device: launch overhead"),
    ("dev_ridge", lambda c: _lg(_ridge(c)), "device: ridge point I_c = P_peak / B"),
    ("dev_sm_count", lambda c: _lg1p(c.spec.sm_count), "device: parallel units to fill"),
    ("dev_l2", lambda c: _lg1p(c.spec.l2_bytes), "device: L2 size: small groups run from cache"),
)


def _ops_bytes(c: FeatureContext) -> float:
    return c.num("op_bytes_read") + c.num("op_bytes_written")


def est_kernels(c: FeatureContext) -> float:
    """Kernels the group launches, as its realization runs it: eager, one per op that is
    not a view; compiled, one library call per GEMM or convolution anchor (a fused
    attention or concatenated GEMM: one for all of them), one generated kernel for the
    other ops, one more per further shape of reduction input."""
    work, anchors = c.num("n_work_ops"), c.num("n_compute")
    if c.realization.startswith("eager"):
        return max(work, 1.0)
    other = work - anchors
    k = anchors + (1.0 if other > 0 else 0.0) + max(c.num("n_reduction_shapes") - 1.0, 0.0)
    if c.realization.startswith(("sdpa", "concat_gemm")):
        k -= max(anchors - 1.0, 0.0)
    return max(k, 1.0)


def _anchor_tiles(c: FeatureContext) -> list[float]:
    """128x128 output tiles of each anchor on a GPU ([] on a CPU: no waves of tiles)."""
    if c.spec.kind != "gpu":
        return []
    return [float(t) for t in str(c.desc.get("anchor_tiles") or "").split(",") if t.strip()]


def _waves(tiles: list[float], sms: int) -> list[int]:
    return [math.ceil(t / sms) for t in tiles if t > 0] if sms > 0 else []


def _worst_wave_fill(c: FeatureContext) -> float:
    """The lowest tiles / (waves x SMs) over the anchors (1 without one, and on a CPU)."""
    sms = c.spec.sm_count
    tiles = [t for t in _anchor_tiles(c) if t > 0]
    return min((t / (math.ceil(t / sms) * sms) for t in tiles), default=1.0) if sms > 0 else 1.0


def _gemm_m(c: FeatureContext) -> float:
    """The largest anchor's M per GEMM (batched GEMMs: per batch entry)."""
    return c.num("anchor_m") / max(c.num("anchor_batch"), 1.0)


# Schema 6: what the hardware sees, from the group's ops and shapes and the device spec,
# never from which model or family a group came from (docs/learned_cost.md).
FEATURES_V6: tuple[Feature, ...] = (
    (
        "op_bytes",
        lambda c: _lg1p(_ops_bytes(c)),
        "traffic of the ops run one by one (log10 bytes): what an eager group moves",
    ),
    (
        "op_over_boundary",
        lambda c: _lg((_ops_bytes(c) + 1.0) / (_boundary_bytes(c) + 1.0)),
        "that traffic over the boundary traffic the roofline counts (log10)",
    ),
    (
        "t_memory_ops",
        lambda c: _lg(_ops_bytes(c) / c.spec.bandwidth_Bps),
        "the per-op traffic at the memory roof (log10 s)",
    ),
    (
        "write_share",
        lambda c: c.num("op_bytes_written") / _ops_bytes(c) if _ops_bytes(c) else 0.0,
        "writes over reads and writes: a write costs a read-for-ownership and a flush",
    ),
    (
        "bytes_per_kernel",
        lambda c: _lg1p(_boundary_bytes(c) / est_kernels(c)),
        "boundary bytes per launched kernel: a kernel moving little never reaches the roof",
    ),
    ("est_kernels", lambda c: _lg1p(est_kernels(c)), "kernels launched (log10 1+n)"),
    (
        "t_launch_est",
        lambda c: _lg(est_kernels(c) * c.spec.launch_s),
        "launch time of those kernels (log10 s)",
    ),
    (
        "gemm_waves",
        lambda c: _lg1p(sum(_waves(_anchor_tiles(c), c.spec.sm_count))),
        "waves of output tiles over the SMs, summed over the anchors (each its own kernel)",
    ),
    (
        "gemm_tiles_over_sms",
        lambda c: _lg1p(sum(_anchor_tiles(c)) / max(c.spec.sm_count, 1)),
        "output tiles of all anchors over the SM count (log10 1+x), batched GEMMs counted",
    ),
    (
        "gemm_wave_eff_min",
        _worst_wave_fill,
        "the worst anchor's last-wave fill: tiles / (waves x SMs)",
    ),
    (
        "gemm_pad_ratio",
        lambda c: _lg(c.num("gemm_pad_ratio") or 1.0),
        "work padded to 128x128x64 tiles over useful work (log10): what tile quantization costs",
    ),
    (
        "anchor_log2_batch",
        lambda c: math.log2(max(c.num("anchor_batch"), 1.0)),
        "GEMMs in the largest anchor (a batched matmul: one per batch entry), log2",
    ),
    (
        "anchor_log2_m",
        lambda c: math.log2(max(_gemm_m(c), 1.0)),
        "the largest anchor's M per GEMM, log2: a short M leaves tiles empty",
    ),
    (
        "anchor_log2_k",
        lambda c: math.log2(max(c.num("anchor_k"), 1.0)),
        "the largest anchor's K, log2: a short K runs few main-loop steps per tile",
    ),
    (
        "red_len",
        lambda c: _lg1p(c.num("red_len_max")),
        "the longest reduction (elements reduced into one, log10 1+n)",
    ),
    (
        "red_rows_over_sms",
        lambda c: _lg1p(c.num("red_rows_min") / max(c.spec.sm_count, 1)),
        "the fewest independent reductions over the SM count: few rows leave SMs idle",
    ),
    (
        "red_noncontig",
        lambda c: c.num("red_noncontig"),
        "1 where a reduction runs across the contiguous dim (a batch norm): strided reads",
    ),
)

FEATURES: tuple[Feature, ...] = (*FEATURES_V5, *FEATURES_V6)
FEATURE_NAMES: tuple[str, ...] = tuple(name for name, _, _ in FEATURES)
_FEATURE_FN = {name: fn for name, fn, _ in FEATURES}
# The raw analytical parts (log10 seconds), which the roofline-bounded MLP reads back.
PART_FEATURES = ("t_compute", "t_memory", "t_launch")


def _schema_hash(version: int, names: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps([version, list(names)]).encode()).hexdigest()[:12]


SCHEMA_HASH = _schema_hash(FEATURE_SCHEMA_VERSION, FEATURE_NAMES)
# hash -> (version, names) of every schema a saved model may carry: today's, and schema 5
# (the models trained before schema 6 keep loading and are fed their own columns).
SCHEMAS: dict[str, tuple[int, tuple[str, ...]]] = {
    SCHEMA_HASH: (FEATURE_SCHEMA_VERSION, FEATURE_NAMES),
    _schema_hash(5, [n for n, _, _ in FEATURES_V5]): (5, tuple(n for n, _, _ in FEATURES_V5)),
}


def feature_vector(
    desc: Mapping[str, Any],
    *,
    dtype: str,
    spec: DeviceSpec,
    realization: str = "inductor",
    parts: AnalyticalParts | None = None,
    names: Sequence[str] = FEATURE_NAMES,
) -> np.ndarray:
    """The features `names` (default: every feature, `FEATURE_NAMES` order; a saved
    model's own `feature_names` for a model of an earlier schema) of one group."""
    parts = parts or analytical_parts(desc, spec, dtype)
    ctx = FeatureContext(desc, dtype, realization, spec, parts)
    return np.array([_FEATURE_FN[n](ctx) for n in names], dtype=np.float64)


@dataclass(frozen=True)
class Design:
    """A design matrix for rows: features X, analytical latency, measured latency, target.

    y = ln(measured / analytical): what every correction model predicts.
    """

    X: np.ndarray  # (n, n_features)
    analytical_s: np.ndarray  # (n,)
    measured_s: np.ndarray  # (n,) NaN where a row has no measurement
    groups: np.ndarray  # (n,) the split key of each row (family or graph), as str

    @property
    def y(self) -> np.ndarray:
        return np.log(self.measured_s / self.analytical_s)

    def __len__(self) -> int:
        return len(self.analytical_s)

    def take(self, idx: np.ndarray) -> Design:
        return Design(self.X[idx], self.analytical_s[idx], self.measured_s[idx], self.groups[idx])


def design_matrix(
    rows: Sequence[Mapping[str, Any]],
    spec_for: Callable[[str], DeviceSpec],
    *,
    group_by: str = "family",
    names: Sequence[str] = FEATURE_NAMES,
) -> Design:
    """Features `names` of dataset rows (desc_* columns), with the analytical parts
    recomputed on `spec_for(row["device"])` so the target is relative to the roofline in
    use now. Rows whose stored descriptors are of different versions get a warning: a
    field added after a row's version is missing from it and reads as 0."""
    versions = sorted(
        {int(r["desc_descriptor_version"]) for r in rows if "desc_descriptor_version" in r}
    )
    if len(versions) > 1:
        warnings.warn(
            f"the rows hold group descriptors of versions {versions}: the fields added "
            f"after version {versions[0]} are missing from the older rows and read as 0, "
            "so those features partly say which collection a row came from; recapture the "
            "graphs (leave out --stored-descriptors) to compute every field",
            stacklevel=2,
        )
    xs, an, ms, gs = [], [], [], []
    for r in rows:
        desc = {k[5:]: v for k, v in r.items() if k.startswith("desc_")}
        spec = spec_for(str(r["device"]))
        dtype = normalize_dtype(str(r["dtype"]))
        parts = analytical_parts(desc, spec, dtype)
        xs.append(
            feature_vector(
                desc,
                dtype=dtype,
                spec=spec,
                realization=str(r.get("realization") or "inductor"),
                parts=parts,
                names=names,
            )
        )
        an.append(parts.latency_s)
        m = r.get("measured_median_s")
        ms.append(float(m) if isinstance(m, int | float) else float("nan"))
        gs.append(str(r.get(group_by)))
    X = np.vstack(xs) if xs else np.zeros((0, len(names)))
    return Design(X, np.array(an, dtype=np.float64), np.array(ms), np.array(gs, dtype=object))
