"""α-β fits of gloo all-reduce on this machine, checked on held-out message sizes:

    python benchmarks/comm_alpha_beta.py [--world-sizes 2,3,4] [--quick]
        [--out benchmarks/results/comm_alpha_beta_cpu.json]

For each world size: all-reduce timed at powers of two (the fit) and at 1.5x each power
of two (held out), interleaved in rounds; the fit per size range; the relative error of its
prediction on every held-out size; and the link-level α, β the fit implies (ring formula).
The link fit measured at one world size is also used to predict the others (the α-β
model's claim that one link figure covers every p).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from planner.distributed.comm_cost import collective_time_s
from profiling.commbench import bench_comm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--quantile", type=float, default=0.5, help="of each size's repetitions")
    ap.add_argument("--out", default="benchmarks/results/comm_alpha_beta_cpu.json")
    args = ap.parse_args()
    results = {}
    for p in (int(x) for x in args.world_sizes.split(",")):
        r = bench_comm(p, "all_reduce", quick=args.quick, quantile=args.quantile)
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
