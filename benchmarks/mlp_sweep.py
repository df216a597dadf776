"""Held-out error of the correction MLP under a few hyper-parameter settings:

    python benchmarks/mlp_sweep.py --data data/h100_profiles.parquet \
        --data data/h100_repeatability/collect1.parquet --device h100 \
        --config dropout=0.3 --config dropout=0.1 --config dropout=0 \
        --config dropout=0,hidden=128x128 --out benchmarks/results/mlp_sweep_h100.md
    python benchmarks/mlp_sweep.py --from-json benchmarks/results/mlp_sweep_h100.json

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
import shlex
import sys
import time
from dataclasses import asdict

from benchmarks import raw_rows
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


def collect(args: argparse.Namespace, command: str) -> dict:
    """Cross-validate every setting on every split; the rows `render` turns into markdown."""
    spec = get_spec(args.device)
    profiles, graphs = load_profiles(args.data), GraphCache()
    rows = current_descriptors(group_rows(profiles, device=spec.name), graphs)
    prows = plan_rows(profiles, device=spec.name) if args.plans else []
    mlp = [m for m in MODELS if m[0] == "mlp-free"]
    out = []
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
            row = {"split": split, "setting": repr(cfg), **asdict(m)}
            if prows:
                pm = evaluate_plans(prows, cv, lambda _name: spec, graphs).metrics("mlp-free")
                row |= {"plan_mape": pm.plan_mape, "mean_regret": pm.mean_regret}
            row["seconds"] = time.perf_counter() - t0
            out.append(row)
            print(format_row(row), flush=True)
    return {
        "command": command,
        "device": spec.name,
        "data": list(args.data),
        "n_group_rows": len(rows),
        "n_plan_rows": len(prows),
        "rows": out,
    }


def format_row(r: dict) -> str:
    plan = (
        f" {100 * r['plan_mape']:.1f}% | {100 * r['mean_regret']:.1f}% |"
        if "plan_mape" in r
        else ""
    )
    return (
        f"| {r['split']} | {r['setting']} | {100 * r['mape']:.1f}% | {100 * r['median_ape']:.1f}% "
        f"| {r['kendall_tau']:.3f} | {r['kendall_tau_within']:.3f} |{plan} {r['seconds']:.0f} |"
    )


def render(run: dict) -> str:
    """The markdown of a sweep's rows (`collect`)."""
    plans = run["n_plan_rows"] > 0
    plan_cols = " plan error | regret |" if plans else ""
    lines = [
        f"# Correction MLP settings, held out ({run['device']})",
        "",
        f"`{run['command']}`; raw rows: `{run['rows_file']}` beside this file. One network per "
        "setting (free form), grouped 5-fold cross-validation; s: seconds per setting on the "
        "machine that ran it.",
        "",
        f"{run['n_group_rows']} group rows"
        + (f", {run['n_plan_rows']} plan rows" if plans else "")
        + f" of {run['device']}",
        "",
        f"| held out by | setting | MAPE | median APE | tau (all) | tau (within graph) |{plan_cols} s |",
        "|---|---|---|---|---|---|" + ("---|---|" if plans else "") + "---|",
        *(format_row(r) for r in run["rows"]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append")
    ap.add_argument("--device")
    ap.add_argument("--config", action="append", type=parse_config)
    ap.add_argument("--split", default="graph_key,family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", action="store_true", help="score the plan rows too")
    ap.add_argument("--out", default=None, help="the markdown; its rows go beside it (.json)")
    raw_rows.add_from_json(ap)
    args = ap.parse_args(argv)
    if args.from_json:
        raw_rows.rerender(args.from_json, render)
        return
    if not (args.data and args.device and args.config):
        ap.error("--data, --device and --config are required (or --from-json)")
    command = "python benchmarks/mlp_sweep.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    run = collect(args, command)
    if args.out:
        raw_rows.write(args.out, run, render)


if __name__ == "__main__":
    main()
