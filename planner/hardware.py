"""Device specs: datasheet figures with their sources, and measured peaks beside them.

The analytical model asks a `DeviceSpec` for peak FLOP/s per dtype, memory bandwidth
and launch overhead. `effective()` returns the measured figure when `device-bench` has
stored one for this device (the project's own micro-benchmarks), else the datasheet's.

Measured figures live in JSON files: committed ones in `planner/devices/` (measured on
lent machines, with the command that produced them) and local ones in the user's cache
directory (`$XDG_CACHE_HOME/fusion-planner/devices/`), which win.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import DeviceSpecError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that use it: the CLI reads the device names
# (`known_devices`) to build its parsers, and `--help` must not wait for torch.

TFLOP = 1e12
GB = 1e9
KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class MeasuredPeaks:
    """What `fusion-plan device-bench` measured on one device."""

    matmul_flops: dict[str, float]  # dtype -> FLOP/s of a large GEMM
    mem_bw_Bps: float  # device copy, bytes read + written per second
    launch_overhead_s: float  # one tiny kernel, eager, median
    device_fingerprint: str
    torch_version: str
    measured_at: str
    command: str = "fusion-plan device-bench"
    vector_flops: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet figures of a device, each with a source.

    `matmul_flops[dtype]`: dense matrix-unit peak for matmul-like ops (tensor cores; for
    float32 the plain FP32 rate, since torch does not use TF32 for matmuls by default).
    `matmul_flops["tfloat32"]`, where the device has TF32 tensor cores: the rate of a
    float32 matmul-like op that torch lets run in TF32 (`peak_compute_flops`).
    `vector_flops[dtype]`: elementwise/reduction arithmetic rate (CUDA cores / SIMD).
    """

    name: str
    kind: str  # "gpu" or "cpu"
    matmul_flops: dict[str, float]
    vector_flops: dict[str, float]
    mem_bw_Bps: float
    launch_overhead_s: float
    smem_per_sm_bytes: int
    regs_per_sm: int
    sm_count: int
    l2_bytes: int
    mem_bytes: int
    sources: dict[str, str]
    measured: MeasuredPeaks | None = None

    # ---- what the model uses ------------------------------------------------------
    def peak_matmul_flops(self, dtype: str) -> float:
        if self.measured and dtype in self.measured.matmul_flops:
            return self.measured.matmul_flops[dtype]
        return _per_dtype(self.matmul_flops, dtype, self.name)

    @property
    def tf32_flops(self) -> float | None:
        """The TF32 tensor-core rate (measured where device-bench stored one); None where
        the device has none."""
        if self.measured and TF32 in self.measured.matmul_flops:
            return self.measured.matmul_flops[TF32]
        return self.matmul_flops.get(TF32)

    def peak_compute_flops(self, dtype: str, conv: bool = False) -> float:
        """The rate of one matmul-like op (a convolution when `conv`): the TF32 rate for a
        float32 op that torch's flags let run in TF32 on a device that has it
        (`tf32_allowed`), else `peak_matmul_flops`."""
        if dtype == "float32" and self.tf32_flops and tf32_allowed(conv):
            return self.tf32_flops
        return self.peak_matmul_flops(dtype)

    def peak_vector_flops(self, dtype: str) -> float:
        if self.measured and dtype in self.measured.vector_flops:
            return self.measured.vector_flops[dtype]
        return _per_dtype(self.vector_flops, dtype, self.name)

    @property
    def bandwidth_Bps(self) -> float:
        return self.measured.mem_bw_Bps if self.measured else self.mem_bw_Bps

    @property
    def launch_s(self) -> float:
        return self.measured.launch_overhead_s if self.measured else self.launch_overhead_s

    def ridge_point(self, dtype: str) -> float:
        """I_c = P_peak / B in FLOP/byte (docs/formulas.md §9)."""
        return self.peak_matmul_flops(dtype) / self.bandwidth_Bps

    def with_overrides(self, **kw: Any) -> DeviceSpec:
        """A what-if copy (e.g. `mem_bw_Bps=4.8e12`), measured figures dropped."""
        return replace(self, measured=None, name=kw.pop("name", self.name + "*"), **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TF32 = "tfloat32"  # the key of the TF32 tensor-core rate in `matmul_flops`


def tf32_allowed(conv: bool) -> bool:
    """Whether torch runs a float32 convolution (`conv`) or matmul in TF32 on a GPU that
    has it: `torch.backends.cudnn.allow_tf32` for convolutions (True by default),
    `torch.backends.cuda.matmul.allow_tf32` for matmuls (False by default;
    `torch.set_float32_matmul_precision("high")` sets it). Read when a cost is computed,
    so the planner follows the flags of the process it plans for."""
    import torch

    if conv:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32)


def _per_dtype(table: dict[str, float], dtype: str, name: str) -> float:
    if dtype in table:
        return table[dtype]
    if dtype in ("bfloat16", "float16") and "float16" in table:
        return table["float16"]
    if "float32" in table:
        return table["float32"]
    raise DeviceSpecError(f"device {name} has no peak figure for dtype {dtype}")


_GPU_TABLE = "docs/formulas.md §16 (memory bandwidth, FP32/FP16 TFLOPS)"
_LAUNCH = (
    "typical eager PyTorch kernel launch on a modern host (~4-6 us); "
    "run `fusion-plan device-bench` for a measured figure"
)


def _gpu(
    name: str,
    fp32: float,
    fp16: float,
    bf16: float | None,
    bw_gbs: float,
    sms: int,
    smem_kib: int,
    l2_mib: float,
    mem_gb: float,
    sources: dict[str, str],
    tf32: float | None = None,
) -> DeviceSpec:
    mm = {"float32": fp32 * TFLOP, "float16": fp16 * TFLOP}
    if bf16:
        mm["bfloat16"] = bf16 * TFLOP
    if tf32:
        mm[TF32] = tf32 * TFLOP
    return DeviceSpec(
        name=name,
        kind="gpu",
        matmul_flops=mm,
        vector_flops={"float32": fp32 * TFLOP, "bfloat16": fp32 * TFLOP, "float16": fp32 * TFLOP},
        mem_bw_Bps=bw_gbs * GB,
        launch_overhead_s=5e-6,
        smem_per_sm_bytes=smem_kib * KIB,
        regs_per_sm=65536,
        sm_count=sms,
        l2_bytes=int(l2_mib * MIB),
        mem_bytes=int(mem_gb * GB),
        sources={"launch_overhead_s": _LAUNCH, **sources},
    )


SPECS: dict[str, DeviceSpec] = {
    "a100": _gpu(
        "a100",
        19.5,
        312,
        312,
        2039,
        108,
        164,
        40,
        80,
        {
            "peaks": _GPU_TABLE,
            "bf16": "NVIDIA A100 datasheet (BF16 = FP16 dense 312 TFLOPS)",
            "tf32": "NVIDIA A100 datasheet: TF32 tensor core 156 TFLOPS dense (312 sparse)",
            "sm/smem/l2": "NVIDIA A100 whitepaper: 108 SMs, 164 KB smem/SM, 40 MB L2",
        },
        tf32=156,
    ),
    "v100": _gpu(
        "v100",
        15.7,
        125,
        None,
        900,
        80,
        96,
        6,
        16,
        {
            "peaks": _GPU_TABLE,
            "sm/smem/l2": "NVIDIA V100 whitepaper: 80 SMs, 96 KB smem/SM, 6 MB L2",
            "bf16": "V100 has no bf16 tensor cores: bf16 falls back to the FP16 figure",
        },
    ),
    "a6000": _gpu(
        "a6000",
        38,
        150,
        150,
        768,
        84,
        100,
        6,
        48,
        {"peaks": _GPU_TABLE, "sm/smem/l2": "NVIDIA RTX A6000 datasheet / GA102 whitepaper"},
    ),
    "rtx3090ti": _gpu(
        "rtx3090ti",
        40,
        160,
        160,
        1008,
        84,
        100,
        6,
        24,
        {"peaks": _GPU_TABLE, "sm/smem/l2": "GA102 whitepaper: 84 SMs, 100 KB smem/SM, 6 MB L2"},
    ),
    "h100": _gpu(
        "h100",
        67,
        989,
        989,
        3350,
        132,
        228,
        50,
        80,
        {
            "peaks": "NVIDIA H100 SXM5 datasheet: FP32 67, BF16/FP16 dense 989.4 TFLOPS, 3.35 TB/s",
            "tf32": "NVIDIA H100 SXM5 datasheet: TF32 tensor core 494.7 TFLOPS dense (989 sparse)",
            "sm/smem/l2": "NVIDIA H100 whitepaper: 132 SMs (SXM5), 228 KB smem/SM, 50 MB L2",
        },
        tf32=494.7,
    ),
    "h200": _gpu(
        "h200",
        67,
        989,
        989,
        4800,
        132,
        228,
        50,
        141,
        {
            "peaks": "NVIDIA H200 SXM datasheet: same compute as H100 SXM, 4.8 TB/s HBM3e",
            "sm/smem/l2": "GH100 die as in H100 SXM: 132 SMs, 228 KB smem/SM",
        },
        tf32=494.7,
    ),
}


def cpu_model_name() -> str:
    """This machine's CPU model, e.g. "AMD EPYC" (from /proc/cpuinfo where there is one)."""
    try:
        if m := re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()):
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


@lru_cache(maxsize=1)
def _cpu_spec() -> DeviceSpec:
    """The local CPU, estimated from /proc/cpuinfo: cores x clock x FLOP/cycle."""
    cores = os.cpu_count() or 1
    model, mhz, flags = cpu_model_name(), 2500.0, ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        if m := re.search(r"cpu MHz\s*:\s*([\d.]+)", info):
            mhz = float(m.group(1))
        if m := re.search(r"flags\s*:\s*(.+)", info):
            flags = m.group(1)
    except OSError:
        pass
    # FP32 FLOP/cycle/core: two FMA units x vector lanes x 2 (multiply + add).
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    per_cycle = 2 * lanes * 2 if "fma" in flags or "avx512f" in flags else lanes * 2
    fp32 = cores * mhz * 1e6 * per_cycle
    # AMX tiles (Sapphire Rapids and later): 1024 bf16 FLOP/cycle/core for matmuls.
    bf16 = cores * mhz * 1e6 * 1024 if "amx_bf16" in flags else fp32
    return DeviceSpec(
        name="cpu",
        kind="cpu",
        matmul_flops={"float32": fp32, "bfloat16": bf16, "float16": fp32},
        vector_flops={"float32": fp32 / 2, "bfloat16": fp32 / 2, "float16": fp32 / 2},
        mem_bw_Bps=10 * GB * min(cores, 8),
        launch_overhead_s=2e-6,
        smem_per_sm_bytes=1 * MIB,
        regs_per_sm=16 * 32,
        sm_count=cores,
        l2_bytes=1 * MIB * cores,
        mem_bytes=_mem_total(),
        sources={
            "peaks": f"estimate for {model}: {cores} cores x {mhz:.0f} MHz x {per_cycle} "
            "FP32 FLOP/cycle (vector width and FMA from /proc/cpuinfo flags; AMX bf16 at "
            "1024 FLOP/cycle when present)",
            "mem_bw_Bps": "rough estimate (10 GB/s per core, at most 8 cores); measure it",
            "launch_overhead_s": "per-op dispatch in eager PyTorch on CPU, rough estimate",
            "smem/regs": "a CPU has no shared memory: 1 MiB of L2 per core stands in for it",
        },
    )


def _mem_total() -> int:
    try:
        m = re.search(r"MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text())
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


# ---- which device is this ------------------------------------------------------------
def device_fingerprint(device: str | torch.device | None = None) -> str:
    """A stable id of the physical device kind (not of torch's version)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return _fingerprint(str(dev))


@lru_cache(maxsize=16)
def _fingerprint(device: str) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        text = f"cuda|{p.name}|{p.major}.{p.minor}|{p.multi_processor_count}|{p.total_memory >> 30}"
    else:
        spec = _cpu_spec()
        text = f"cpu|{spec.sources['peaks'].split(':')[0]}|{spec.sm_count}"
    return text.split("|")[0] + "-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def local_device_name(device: str | torch.device | None = None) -> str:
    """The spec name of this machine's device: "h100", "a100", ..., or "cpu"."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda":
        return "cpu"
    gpu = torch.cuda.get_device_name(dev).lower().replace(" ", "")
    for key, pat in (
        ("h200", "h200"),
        ("h100", "h100"),
        ("a100", "a100"),
        ("v100", "v100"),
        ("a6000", "a6000"),
        ("rtx3090ti", "3090ti"),
    ):
        if pat in gpu:
            return key
    return "cpu"


def cache_dir() -> Path:
    """The user's cache directory for fusion-planner (created on demand)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "fusion-planner"
    path.mkdir(parents=True, exist_ok=True)
    return path


COMMITTED_DIR = Path(__file__).parent / "devices"


def _measured_path(name: str, committed: bool) -> Path:
    return (COMMITTED_DIR if committed else cache_dir() / "devices") / f"{name}.json"


def load_measured(name: str) -> MeasuredPeaks | None:
    """Measured peaks for spec `name`: the user's own first, then the committed ones."""
    for committed in (False, True):
        path = _measured_path(name, committed)
        if path.is_file():
            try:
                return MeasuredPeaks(**json.loads(path.read_text()))
            except (ValueError, TypeError) as e:
                raise DeviceSpecError(
                    f"measured-peaks file {path} does not parse ({e}); "
                    "delete it or re-run `fusion-plan device-bench`"
                ) from e
    return None


def save_measured(name: str, peaks: MeasuredPeaks, committed: bool = False) -> Path:
    path = _measured_path(name, committed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(peaks), indent=2, sort_keys=True) + "\n")
    return path


def get_spec(name: str | None = None, *, measured: bool = True) -> DeviceSpec:
    """A device spec by name ("h100", "a100", "cpu", ... or None for this machine's).

    With `measured`, figures from `device-bench` replace the datasheet ones when present.
    """
    name = (name or local_device_name()).lower()
    if name in ("local", "auto"):
        name = local_device_name()
    if name == "cpu":
        spec = _cpu_spec()
    elif name in SPECS:
        spec = SPECS[name]
    else:
        raise DeviceSpecError(f"unknown device {name!r}; known: {', '.join(known_devices())}")
    if measured:
        peaks = load_measured(name)
        # A CPU measurement describes one machine; a GPU one describes the model of card.
        if peaks is not None and (
            name != "cpu" or peaks.device_fingerprint == device_fingerprint("cpu")
        ):
            spec = replace(spec, measured=peaks)
    return spec


def known_devices() -> list[str]:
    return [*SPECS, "cpu"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, restored afterwards: for tiny networks (the
    learned cost MLP, the RL policy) thread hand-offs cost more than the arithmetic
    (training the MLP: 7x slower on 2 busy cores; a policy step: 1.3 ms vs 0.25 ms)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
