"""Held-out error of the correction MLP under a few hyper-parameter settings:

    python benchmarks/mlp_sweep.py --data data/h100_profiles.parquet \
        --data data/h100_repeatability/collect1.parquet --device h100 \
        --config dropout=0.3 --config dropout=0.1 --config dropout=0 \
        --config dropout=0,hidden=128x128

One network per setting (`n_members=1` unless the setting names it), the free form, grouped
5-fold cross-validation by graph and by family on the rows training uses (today's
descriptors), as `fusion-plan cost train` scores it; with `--plans`, the plan rows too
(plan error and regret, each fold's plan context fitted on the other folds' plans). This
is how `--dropout`/`--hidden`/`--steps` of the committed models were chosen; the choice
looks at the same folds the report shows, so those numbers are a little optimistic (as
the form's choice is; docs/learned_cost.md, docs/design_notes.md).
"""

from __future__ import annotations

import argparse
import time

from learned_cost.data import group_rows, load_profiles, plan_rows
from learned_cost.study.evaluate import MODELS, cross_validate, group_metrics
from learned_cost.study.plan_eval import GraphCache, current_descriptors, evaluate_plans
from planner.hardware import get_spec


def parse_config(text: str) -> dict:
    """ "dropout=0,hidden=128x128" -> {"dropout": 0.0, "hidden": (128, 128)}."""
    out: dict = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key == "hidden":
            out[key] = tuple(int(w) for w in value.split("x"))
        elif key in ("steps", "n_members", "batch_size"):
            out[key] = int(value)
        elif key in ("loss", "form"):
            out[key] = value
        else:
            out[key] = float(value)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--config", action="append", required=True, type=parse_config)
    ap.add_argument("--split", default="graph_key,family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", action="store_true", help="score the plan rows too")
    args = ap.parse_args(argv)
    spec = get_spec(args.device)
    profiles, graphs = load_profiles(args.data), GraphCache()
    rows = current_descriptors(group_rows(profiles, device=spec.name), graphs)
    prows = plan_rows(profiles, device=spec.name) if args.plans else []
    mlp = [m for m in MODELS if m[0] == "mlp-free"]
    print(
        f"{len(rows)} group rows"
        + (f", {len(prows)} plan rows" if prows else "")
        + f" of {spec.name}"
    )
    plan_cols = " plan error | regret |" if prows else ""
    print(
        f"| held out by | setting | MAPE | median APE | tau (all) | tau (within graph) |{plan_cols} s |"
    )
    print("|---|---|---|---|---|---|" + ("---|---|" if prows else "") + "---|")
    for split in args.split.split(","):
        for cfg in args.config:
            t0 = time.perf_counter()
            cv = cross_validate(
                rows,
                lambda _name: spec,
                split=split,
                n_splits=5,
                seed=args.seed,
                models=mlp,
                overrides={"mlp-free": {"n_members": 1, **cfg}},
            )
            m = group_metrics(cv.predicted_s("mlp-free"), cv.design.measured_s, cv.graph_ids)
            plan = ""
            if prows:
                pm = evaluate_plans(prows, cv, lambda _name: spec, graphs).metrics("mlp-free")
                plan = f" {100 * pm.plan_mape:.1f}% | {100 * pm.mean_regret:.1f}% |"
            print(
                f"| {split} | {cfg} | {100 * m.mape:.1f}% | {100 * m.median_ape:.1f}% "
                f"| {m.kendall_tau:.3f} | {m.kendall_tau_within:.3f} |{plan}"
                f" {time.perf_counter() - t0:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
