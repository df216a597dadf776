"""Interconnect figures: per-link latency α and bandwidth B, with sources, and the
measured α-β fits `fusion-plan device-bench --comm` stores beside them.

An `AlphaBeta` is the cost of one point-to-point message of S bytes: α + S·β, with
β = 1/B seconds per byte. A `LinkSpec` holds the datasheet figure of an interconnect and,
where one was measured, a fit per message-size range; `alpha_beta(nbytes)` returns the
measured range covering `nbytes` when there is one, else the datasheet figure; with a
collective's kind, that collective's own measured fit where one was stored (each
collective is fitted separately: NCCL runs them with different kernels).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.errors import DeviceSpecError
from planner.hardware import COMMITTED_DIR, cache_dir

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class AlphaBeta:
    """One α-β fit: a message of S bytes in [lo_bytes, hi_bytes) costs alpha_s + S*beta_s_per_byte.

    `bridge`: the line joins two fitted ranges across the sizes between their measured
    ones (not fitted to measurements of its own)."""

    alpha_s: float
    beta_s_per_byte: float
    lo_bytes: int = 0
    hi_bytes: int = 1 << 62
    bridge: bool = False

    @property
    def bandwidth_Bps(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


@dataclass(frozen=True)
class MeasuredLink:
    """What `fusion-plan device-bench --comm` measured: α-β fits per size range of one
    collective (`collective`, `algorithm`) over `world_size` local processes."""

    backend: str
    world_size: int
    collective: str
    algorithm: str
    fits: tuple[AlphaBeta, ...]
    heldout_max_rel_err: float
    device_fingerprint: str
    torch_version: str
    measured_at: str
    command: str = "fusion-plan device-bench --comm"
    samples: tuple[tuple[int, float], ...] = ()  # (bytes, seconds at `quantile`)
    quantile: float = 0.5  # of each size's repetitions (0.5: the median)

    def fit_for(self, nbytes: float) -> AlphaBeta:
        for f in self.fits:
            if f.lo_bytes <= nbytes < f.hi_bytes:
                return f
        return self.fits[-1] if nbytes >= self.fits[-1].lo_bytes else self.fits[0]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MeasuredLink:
        d = dict(d)
        d["fits"] = tuple(AlphaBeta(**f) for f in d["fits"])
        d["samples"] = tuple((int(b), float(t)) for b, t in d.get("samples", ()))
        return MeasuredLink(**d)


@dataclass(frozen=True)
class LinkSpec:
    """An interconnect: per-direction bandwidth of one rank's link and the latency of one
    message (software included), each with a source."""

    name: str
    bandwidth_Bps: float  # one direction, per rank
    alpha_s: float
    sources: dict[str, str] = field(default_factory=dict)
    measured: MeasuredLink | None = None
    by_kind: dict[str, MeasuredLink] = field(default_factory=dict)  # per collective

    def alpha_beta(self, nbytes: float = 0, kind: str | None = None) -> AlphaBeta:
        """The α-β pair for a message of `nbytes` (of collective `kind`, where given):
        measured where a fit exists."""
        if kind is not None and str(kind) in self.by_kind:
            return self.by_kind[str(kind)].fit_for(nbytes)
        if self.measured is not None:
            return self.measured.fit_for(nbytes)
        return AlphaBeta(self.alpha_s, 1.0 / self.bandwidth_Bps)

    def with_overrides(self, **kw: Any) -> LinkSpec:
        return replace(self, measured=None, by_kind={}, name=kw.pop("name", self.name + "*"), **kw)


_NCCL_LAT = (
    "order of magnitude of one NCCL ring step (NCCL tests: ~5-10 us small-message all-reduce "
    "over 2(p-1) steps); measure with `fusion-plan device-bench --comm` where possible"
)

# fmt: off
LINKS: dict[str, LinkSpec] = {
    "nvlink4": LinkSpec("nvlink4", 450 * GB, 3 * US, {
        "bandwidth": "NVIDIA H100 SXM5 datasheet: NVLink 900 GB/s total = 450 GB/s per direction",
        "alpha": _NCCL_LAT}),
    "nvlink3": LinkSpec("nvlink3", 300 * GB, 3 * US, {
        "bandwidth": "NVIDIA A100 SXM datasheet: NVLink 600 GB/s total = 300 GB/s per direction",
        "alpha": _NCCL_LAT}),
    "nvlink2": LinkSpec("nvlink2", 150 * GB, 3 * US, {
        "bandwidth": "NVIDIA V100 SXM2 datasheet: NVLink 300 GB/s total = 150 GB/s per direction",
        "alpha": _NCCL_LAT}),
    "pcie5": LinkSpec("pcie5", 64 * GB, 5 * US, {
        "bandwidth": "PCIe 5.0 x16: 32 GT/s x 16 lanes x 128b/130b = 63 GB/s per direction",
        "alpha": "PCIe round trip ~1-2 us plus host staging; NCCL over PCIe ~5 us per step"}),
    "pcie4": LinkSpec("pcie4", 32 * GB, 5 * US, {
        "bandwidth": "PCIe 4.0 x16: 16 GT/s x 16 lanes x 128b/130b = 31.5 GB/s per direction",
        "alpha": "PCIe round trip ~1-2 us plus host staging; NCCL over PCIe ~5 us per step"}),
    "ib-ndr": LinkSpec("ib-ndr", 50 * GB, 5 * US, {
        "bandwidth": "InfiniBand NDR (ConnectX-7): 400 Gb/s = 50 GB/s per direction per port",
        "alpha": "RDMA one-way ~1-2 us (IB spec, ConnectX-7 brief) plus NCCL's proxy: ~5 us"}),
    "ib-hdr": LinkSpec("ib-hdr", 25 * GB, 5 * US, {
        "bandwidth": "InfiniBand HDR (ConnectX-6): 200 Gb/s = 25 GB/s per direction per port",
        "alpha": "RDMA one-way ~1-2 us (IB spec, ConnectX-6 brief) plus NCCL's proxy: ~5 us"}),
}
# fmt: on

# What-if names users type, mapped onto the table.
ALIASES = {"nvlink": "nvlink4", "pcie": "pcie4", "infiniband": "ib-ndr", "ib": "ib-ndr"}


# Links that exist only as measured figures: gloo over loopback, NCCL between this host's GPUs.
MEASURED_ONLY = ("local", "local-nccl")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def known_links() -> list[str]:
    return [*LINKS, *ALIASES, *MEASURED_ONLY]


def measured_link_filename(name: str, collective: str = "all_reduce") -> str:
    """link-<name>.json holds the all-reduce fit (what a link's α-β means by default),
    link-<name>.<collective>.json each other collective's."""
    suffix = "" if collective == "all_reduce" else f".{collective}"
    return f"link-{name}{suffix}.json"


def _measured_path(name: str, committed: bool, collective: str = "all_reduce") -> Path:
    base = COMMITTED_DIR if committed else cache_dir() / "devices"
    return base / measured_link_filename(name, collective)


def save_measured_link(name: str, m: MeasuredLink, committed: bool = False) -> Path:
    path = _measured_path(name, committed, m.collective)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(m.to_json())
    return path


def load_measured_link(name: str, collective: str = "all_reduce") -> MeasuredLink | None:
    """The measured fit of `collective` for link `name`: the user's own first, then the
    committed one."""
    for committed in (False, True):
        path = _measured_path(name, committed, collective)
        if path.is_file():
            try:
                return MeasuredLink.from_dict(json.loads(path.read_text()))
            except (ValueError, TypeError, KeyError) as e:
                raise DeviceSpecError(
                    f"measured-link file {path} does not parse ({e}); delete it or re-run "
                    "`fusion-plan device-bench --comm`"
                ) from e
    return None


def get_link(name: str, *, measured: bool = True) -> LinkSpec:
    """A link by name ("nvlink4", "pcie4", "ib-ndr", an alias such as "nvlink", "local"
    for the gloo loopback or "local-nccl" for NCCL between this host's GPUs, as measured
    here)."""
    key = ALIASES.get(name.lower(), name.lower())
    by_kind = {}
    if measured:
        for kind in KINDS:
            if (m := load_measured_link(key, kind)) is not None:
                by_kind[kind] = m
    if key in MEASURED_ONLY:
        m = by_kind.get("all_reduce")
        if m is None:
            backend = " --backend nccl" if key == "local-nccl" else ""
            raise DeviceSpecError(
                f"no measured figures for link {key!r}; run `fusion-plan device-bench --comm"
                f"{backend}`"
            )
        f = m.fits[-1]
        return LinkSpec(key, f.bandwidth_Bps, f.alpha_s, {"all": m.command}, m, by_kind)
    if key not in LINKS:
        raise DeviceSpecError(f"unknown interconnect {name!r}; known: {', '.join(known_links())}")
    spec = LINKS[key]
    return replace(spec, measured=by_kind.get("all_reduce"), by_kind=by_kind)
