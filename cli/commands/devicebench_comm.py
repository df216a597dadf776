"""`fusion-plan device-bench --comm`: time collectives over gloo (CPU) or NCCL (one process
per GPU) on local processes, fit α-β per size range, show the held-out error, and store
each fit as the measured figure of a link ("local" for gloo, "local-nccl" for NCCL, or the
`--link` given)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from cli.common import emit
from planner.distributed.links import LINKS, MEASURED_ONLY, save_measured_link
from planner.errors import FusionPlannerError
from profiling.commbench import bench_comm


def run_comm(args: argparse.Namespace) -> int:
    if not 0.0 <= args.quantile <= 1.0:
        raise FusionPlannerError(f"--quantile must be within [0, 1], got {args.quantile}")
    if not 2 <= args.world_size <= 8:
        raise FusionPlannerError(
            f"--world-size must be between 2 and 8 local processes, got {args.world_size}"
        )
    backend = getattr(args, "backend", "gloo")
    link = getattr(args, "link", None) or ("local-nccl" if backend == "nccl" else "local")
    if link not in LINKS and link not in MEASURED_ONLY:
        raise FusionPlannerError(
            f"--link {link!r} is not a link of the table; known: {', '.join([*LINKS, *MEASURED_ONLY])}"
        )
    kinds = (
        ["all_reduce", "all_gather", "reduce_scatter"]
        if args.collective == "all"
        else [args.collective]
    )
    texts, payload = [], []
    for kind in kinds:
        text, data = _one(args, backend, link, kind)
        texts.append(text)
        payload.append(data)
    emit(args, payload[0] if len(payload) == 1 else {"collectives": payload}, "\n\n".join(texts))
    return 0


def _one(args: argparse.Namespace, backend: str, link: str, kind: str) -> tuple[str, dict]:
    res = bench_comm(
        args.world_size,
        kind,
        quick=args.quick,
        quantile=args.quantile,
        backend=backend,
        command="fusion-plan device-bench --comm"
        + (" --quick" if args.quick else "")
        + f" --backend {backend} --world-size {args.world_size} --collective {kind}"
        + f" --quantile {args.quantile:g} --link {link}",
    )
    path = None if args.no_save else save_measured_link(link, res.link, committed=args.commit)
    m = res.link
    rows = [
        f"{m.collective} over {backend}, {m.world_size} local processes "
        f"({m.device_fingerprint}, torch {m.torch_version})",
        f"{'size range bytes':<24} {'alpha_c us':>11} {'B_c GB/s':>9} "
        f"{'link alpha us':>14} {'link B GB/s':>12}",
    ]
    for c, lf in zip(res.collective_fits, m.fits, strict=True):
        hi = "inf" if c.hi_bytes >= 1 << 60 else str(c.hi_bytes)
        where = f"[{c.lo_bytes}, {hi})" + (" bridge" if c.bridge else "")
        rows.append(
            f"{where:<24} {c.alpha_s * 1e6:11.1f} {c.bandwidth_Bps / 1e9:9.3f} "
            f"{lf.alpha_s * 1e6:14.2f} {lf.bandwidth_Bps / 1e9:12.3f}"
        )
    rows.append(f"{'held-out bytes':<16} {'measured us':>12} {'predicted us':>13} {'error':>7}")
    heldout = res.heldout_rows()
    for h in heldout:
        rows.append(
            f"{h['bytes']:<16} {h['measured_s'] * 1e6:12.1f} {h['predicted_s'] * 1e6:13.1f} "
            f"{h['rel_err']:7.1%}"
        )
    rows.append(f"held-out worst error {m.heldout_max_rel_err:.1%}")
    rows.append(f"saved to {path}" if path else "not saved (--no-save)")
    data = {
        "measured": asdict(m),
        "collective_fits": [asdict(f) for f in res.collective_fits],
        "heldout": heldout,
        "saved_to": str(path) if path else None,
    }
    return "\n".join(rows), data
