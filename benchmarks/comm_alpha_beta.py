"""α-β fits of gloo all-reduce on this machine, checked on held-out message sizes:

    python benchmarks/comm_alpha_beta.py [--world-sizes 2,3,4] [--quick] [--reps 120]
        [--quantile 0.05] [--out benchmarks/results/comm_alpha_beta_cpu.json]

For each world size: all-reduce timed at powers of two (the fit) and at 1.5x each power
of two (held out), interleaved in rounds; the fit per size range; the relative error of its
prediction on every held-out size; and the link-level α, β the fit implies (ring formula).

Each size's figure is a low quantile of its repetitions (the 5% quantile of 120 by
default): on a CPU shared with other jobs, or with more ranks than cores, a sample is the
collective's own time plus whatever the scheduler adds (a rank that is not running when
its message arrives), so the samples form a fast mode and a long tail whose share moves
with the load; the median lands wherever that share puts it. The low quantile estimates
the fast mode, what the α-β model describes; enough repetitions keep several samples
below it. docs/distributed.md has the runs.
The link fit measured at one world size is also used to predict the others (the α-β
model's claim that one link figure covers every p).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path

from planner.distributed.comm_cost import collective_time_s
from profiling.commbench import bench_comm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="per size (120; --quick 20)")
    ap.add_argument("--quantile", type=float, default=0.05, help="of each size's repetitions")
    ap.add_argument("--out", default="benchmarks/results/comm_alpha_beta_cpu.json")
    args = ap.parse_args()
    reps = args.reps or (20 if args.quick else 120)
    load_before = os.getloadavg()
    results = {}
    for p in (int(x) for x in args.world_sizes.split(",")):
        r = bench_comm(p, "all_reduce", args.quick, reps, args.quantile, timeout_s=900)
        results[p] = r
        errs = ", ".join(f"{b}: {e:.1%}" for (b, _), e in zip(r.heldout, r.heldout_rel_err))
        print(
            f"p={p}: fits {[(f.alpha_s * 1e6, f.bandwidth_Bps / 1e9) for f in r.collective_fits]}"
        )
        print(f"  held-out errors {errs}; worst {r.link.heldout_max_rel_err:.1%}")
    cross = []
    for p_fit, r_fit in results.items():
        for p, r in results.items():
            if p == p_fit:
                continue
            for b, t in r.train + r.heldout:
                pred = collective_time_s("all_reduce", "ring", b, p, r_fit.link.fit_for(b))
                cross.append(
                    {
                        "fit_p": p_fit,
                        "p": p,
                        "bytes": b,
                        "measured_s": t,
                        "predicted_s": pred,
                        "rel_err": abs(pred - t) / t,
                    }
                )
    out = {
        "quantile": args.quantile,
        "reps": reps,
        # 1-minute load average before and after the run, and the cores it shared
        "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "per_world_size": {
            p: {
                "link": asdict(r.link),
                "collective_fits": [asdict(f) for f in r.collective_fits],
                "train": r.train,
                "heldout": [
                    {"bytes": b, "measured_s": t, "rel_err": e}
                    for (b, t), e in zip(r.heldout, r.heldout_rel_err)
                ],
                "heldout_max_rel_err": r.link.heldout_max_rel_err,
            }
            for p, r in results.items()
        },
        "cross_world_size": cross,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if cross:
        worst = max(c["rel_err"] for c in cross)
        med = sorted(c["rel_err"] for c in cross)[len(cross) // 2]
        print(f"link fit of one p predicting another: median error {med:.1%}, worst {worst:.1%}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()


# ---- tables of committed results (benchmarks/generated.py) -------------------------------
def _size(nbytes: int) -> str:
    return f"{nbytes // 1024 // 1024} MiB" if nbytes >= 1 << 20 else f"{nbytes // 1024} KiB"


def fits_text(fits: list[dict]) -> str:
    """`α us, B GB/s` per size range, each range named by its bounds when there are several."""
    out = []
    for i, f in enumerate(fits):
        bw = f"{1 / f['beta_s_per_byte'] / 1e9:.2f} GB/s" if f["beta_s_per_byte"] > 0 else "— GB/s"
        where = ""
        if f.get("bridge"):
            where = f"bridge {_size(f['lo_bytes'])}-{_size(f['hi_bytes'])}: "
        elif len(fits) > 1:
            where = f"< {_size(f['hi_bytes'])}: " if i == 0 else "above: "
        out.append(f"{where}{f['alpha_s'] * 1e6:.0f} us, {bw}")
    return "; ".join(out)


def _errors(r: dict) -> tuple[str, str]:
    errs = sorted(h["rel_err"] for h in r["heldout"])
    within = f"{sum(e <= 0.15 for e in errs)} of {len(errs)}"
    return within, f"{statistics.median(errs):.1%} / {errs[-1]:.1%}"


def render(path: Path) -> str:
    """The per-world-size table of one results file, and how well one p's link fit
    predicts the others."""
    data = json.loads(path.read_text())
    lines = [
        "| ranks | whole-collective fit α_c, B_c | link α, B (ring inverted) | "
        "held-out within 15% | median / worst error |",
        "|---|---|---|---|---|",
    ]
    for p, r in data["per_world_size"].items():
        within, errs = _errors(r)
        lines.append(
            f"| {p} | {fits_text(r['collective_fits'])} | {fits_text(r['link']['fits'])} | "
            f"{within} | {errs} |"
        )
    cross = sorted(c["rel_err"] for c in data.get("cross_world_size", []))
    if cross:
        lines += [
            "",
            f"The link fit of one p predicting the others' sizes: median error "
            f"{statistics.median(cross):.0%}, worst {cross[-1]:.0%}.",
        ]
    return "\n".join(lines) + "\n"


def render_runs(paths: list[Path], p: str = "2", small_bytes: int = 64 * 1024) -> str:
    """One row per results file at `p` ranks (the statistic, the fit, the held-out
    errors), and per file the worst held-out error below and above `small_bytes`."""
    lines = [
        "| run | statistic | fit (per size range) | held-out within 15% | median / worst error |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for path in paths:
        data = json.loads(path.read_text())
        r = data["per_world_size"][p]
        q = data.get("quantile", 0.5) or 0.5
        stat = "median" if q == 0.5 else f"{q:.0%} quantile"
        within, errs = _errors(r)
        lines.append(
            f"| `{path.name}` | {stat} | {fits_text(r['collective_fits'])} | {within} | {errs} |"
        )
        small = [h["rel_err"] for h in r["heldout"] if h["bytes"] < small_bytes]
        large = [h["rel_err"] for h in r["heldout"] if h["bytes"] >= small_bytes]
        notes.append(
            f"`{path.name}`: worst held-out error below {_size(small_bytes)} "
            f"{max(small):.1%}, at or above {max(large):.1%}."
        )
    return "\n".join([*lines, "", *notes]) + "\n"


def render_low_quantile(paths: list[Path], from_bytes: int = 256 * 1024) -> str:
    """Per results file and world size: the run's load, statistic, fit and held-out errors
    (with the size of the worst); then per world size, over the files, how the time of
    each held-out size 1.5·2^k at or above `from_bytes` compares with that of 2^(k+1)."""
    lines = [
        "| run (load before, after) | ranks | statistic | fit (per size range) | "
        "held-out within 15% | median / worst error | worst at |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        load = ", ".join(f"{x:.1f}" for x in data["load_average"])
        stat = f"{data['quantile']:.0%} quantile of {data['reps']}"
        for p, r in data["per_world_size"].items():
            within, errs = _errors(r)
            worst = max(r["heldout"], key=lambda h: h["rel_err"])
            lines.append(
                f"| `{path.name}` ({load} on {data['cpus']} cores) | {p} | {stat} | "
                f"{fits_text(r['collective_fits'])} | {within} | {errs} | {_size(worst['bytes'])} |"
            )
            train = dict((int(b), t) for b, t in r["train"])
            ratios.setdefault(p, []).extend(
                h["measured_s"] / train[h["bytes"] * 4 // 3]
                for h in r["heldout"]
                if h["bytes"] >= from_bytes and h["bytes"] * 4 // 3 in train
            )
    notes = [
        f"- {p} ranks: a held-out size 1.5·2^k from {_size(from_bytes)} up took "
        f"{min(rs):.2f} to {max(rs):.2f} of the time of 2^(k+1)"
        for p, rs in ratios.items()
    ]
    return "\n".join([*lines, "", *notes]) + "\n"
