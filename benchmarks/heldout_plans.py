"""Does the learned cost model choose faster plans for graphs it never saw?

Steps around GPU collections (data/README.md has the exact commands of each run):

    # 1. here (CPU): plan every graph of the dataset with the fold model that held it out
    python benchmarks/heldout_plans.py make --data data/h100_profiles.parquet --device h100 \
        --out data/h100_heldout_plans.json
    # 2. on the GPU: measure those plans (and their groups) on a copy of the dataset
    python -m cli.main collect ... --resume --plans data/h100_heldout_plans.json
    # 3. here: the pairs (each graph's best analytical and held-out plan) to re-time ...
    python benchmarks/heldout_plans.py pairs --data ... --plans data/h100_heldout_plans.json \
        --out data/h100_heldout_pairs.json
    # 4. ... in one GPU run, whole plans only (collect --no-strategy-groups --plans PAIRS)
    # 5. here: each graph's measured best held-out-learned plan against the analytical one
    python benchmarks/heldout_plans.py compare --data data/h100_profiles.parquet \
        --data data/h100_heldout.parquet --plans data/h100_heldout_plans.json \
        --retime data/h100_plan_retime.parquet > benchmarks/results/heldout_plans_h100.md

`make` runs the grouped cross-validation of `fusion-plan cost train` (split by graph, the
same folds, seed and MLP settings as given) for the MLP alone, with each fold's plan
context fitted on the other folds' plans; each graph is planned by the strategies under
the model of the fold that held it out, so no group of the graph was
in that model's training data. `compare` reads the measured plans: per graph, the
fastest measured plan among the analytical model's strategies (greedy, priority, exact)
against the fastest among the held-out learned model's (STRATEGY@heldout), plans matched
by their groups. A graph where the held-out model proposed only plans the analytical
strategies also proposed counts as a tie.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import CorrectedModel
from learned_cost.data import group_rows, load_profiles, plan_rows
from learned_cost.mlp import FORMS
from learned_cost.study.evaluate import MODELS, cross_validate
from learned_cost.study.plan_eval import GraphCache, current_descriptors, evaluate_plans
from planner.hardware import get_spec
from search.planning import plan_maker

HELDOUT = "@heldout"


def make(args: argparse.Namespace) -> None:
    spec = get_spec(args.device)
    profiles = load_profiles(args.data)
    graphs = GraphCache()
    rows = current_descriptors(group_rows(profiles, device=spec.name), graphs)
    params = {"dropout": args.dropout, "hidden": tuple(args.hidden)}
    if args.steps:
        params["steps"] = args.steps
    name = f"mlp-{args.form}"  # mixed is built from the free and roofline fold models
    need = {name} | ({"mlp-free", "mlp-roofline"} if args.form == "mixed" else set())
    models = [m for m in MODELS if m[0] in need]
    t0 = time.perf_counter()
    cv = cross_validate(
        rows,
        lambda _n: spec,
        split="graph_key",
        n_splits=args.folds,
        seed=args.seed,
        models=models,
        overrides={n: params for n in need},
    )
    print(f"{len(cv.fitted)} fold models in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    prows = plan_rows(profiles, device=spec.name)
    # each fold's plan context, fitted on the other folds' plans as `cost train` does
    contexts = evaluate_plans(prows, cv, lambda _n: spec, graphs).contexts[name]
    seen: dict[str, dict] = {}
    for r in prows:
        seen.setdefault(str(r["graph_key"]), r)
    plans = []
    for n, (key, row) in enumerate(sorted(seen.items())):
        graph = graphs.get(row)
        if graph is None:
            print(f"  {row['model']} {row['shape']}: cannot recapture; skipped", file=sys.stderr)
            continue
        k = cv.fold_for(key)
        model = CorrectedModel(
            AnalyticalModel(spec),
            cv.fitted[k][name],
            model_id=f"{name}-fold{k}",
            plan_context=contexts[k],
        )
        for strategy in args.strategies.split(","):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                part = plan_maker(strategy, model, budget_s=args.budget_s)(graph)
            plans.append(
                {
                    "graph_key": key,
                    "model": row["model"],
                    "shape": row["shape"],
                    "dtype": row["dtype"],
                    "fold": k,
                    "strategy": strategy + HELDOUT,
                    "groups": [sorted(g) for g in part.groups],
                }
            )
        print(
            f"  [{n + 1}/{len(seen)}] {row['model']} {row['shape']} {row['dtype']}", file=sys.stderr
        )
    out = {
        "command": "python " + " ".join(sys.argv),
        "data": list(args.data),
        "device": spec.name,
        "held_out": [sorted(h) for h in cv.held_out],
        "plans": plans,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(plans)} plans for {len(seen)} graphs -> {args.out}", file=sys.stderr)


def _canon(groups) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(int(i) for i in g)) for g in groups))


def _measured(data: list[str], device: str) -> tuple[dict, dict, dict]:
    """(graph_key, groups) -> measured seconds, graph_key -> a row, graph_key -> exact plans."""
    measured: dict[tuple[str, tuple], float] = {}
    row_of: dict[str, dict] = {}
    exact: dict[str, list[tuple]] = defaultdict(list)
    for r in plan_rows(load_profiles(data), device=device):
        key = str(r["graph_key"])
        groups = _canon(json.loads(r["nodes"]))
        measured[(key, groups)] = float(r["measured_median_s"])
        row_of.setdefault(key, r)
        if r["strategy"] == "exact":
            exact[key].append(groups)
    return measured, row_of, exact


def _best_pairs(args: argparse.Namespace) -> dict:
    """Per graph, the fastest measured analytical plan and the fastest held-out one.

    Plans are matched by their groups, not by the name a row carries: the collector
    measures a plan once, under the name of the first strategy that proposed it."""
    spec = get_spec(args.device)
    measured, row_of, exact = _measured(args.data, spec.name)
    held: dict[str, list[tuple[str, tuple]]] = defaultdict(list)
    for e in json.loads(Path(args.plans).read_text())["plans"]:
        held[e["graph_key"]].append((e["strategy"], _canon(e["groups"])))
    graphs = GraphCache()
    analytical = AnalyticalModel(spec)
    pairs, ties, unmeasured = [], 0, 0
    same: dict[str, list[float]] = defaultdict(list)
    for key, row in sorted(row_of.items(), key=lambda kv: (kv[1]["model"], kv[1]["shape"])):
        graph = graphs.get(row)
        if graph is None or key not in held:
            continue
        ana = [(s, _canon(plan_maker(s, analytical)(graph).groups)) for s in ("greedy", "priority")]
        ana += [("exact", g) for g in exact[key]]
        a = [(measured[(key, g)], s, g) for s, g in ana if (key, g) in measured]
        h = [(measured[(key, g)], s, g) for s, g in held[key] if (key, g) in measured]
        unmeasured += len(held[key]) - len(h)
        for s, g in ana[:2]:  # the same strategy under each model: greedy, priority
            mine = next((g2 for s2, g2 in held[key] if s2 == s + HELDOUT), None)
            if (key, g) in measured and (key, mine) in measured:
                same[s].append(measured[(key, mine)] / measured[(key, g)])
        if not a or not h:
            continue
        a_set = {g for _, _, g in a}
        if all(g in a_set for _, _, g in h):
            ties += 1
            continue
        pairs.append({"key": key, "row": row, "analytical": min(a), "heldout": min(h)})
    return {"spec": spec, "pairs": pairs, "ties": ties, "unmeasured": unmeasured, "same": same}


def pairs(args: argparse.Namespace) -> None:
    """A --plans file of each graph's two best plans, for a run that re-times them together."""
    got = _best_pairs(args)
    plans = [
        {"graph_key": p["key"], "strategy": f"{side}-best:{p[side][1]}", "groups": p[side][2]}
        for p in got["pairs"]
        for side in ("analytical", "heldout")
    ]
    out = {"command": "python " + " ".join(sys.argv), "plans": plans}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(plans)} plans of {len(got['pairs'])} graphs -> {args.out}", file=sys.stderr)


def _summary(r: np.ndarray) -> str:
    return (
        f"geometric-mean ratio {np.exp(np.log(r).mean()):.3f}; faster in {(r < 1).sum()}, "
        f"slower in {(r > 1).sum()}, equal in {(r == 1).sum()}; best {r.min():.3f}, worst "
        f"{r.max():.3f}"
    )


def compare(args: argparse.Namespace) -> None:
    sys.stdout.write(render(args))


def render(args: argparse.Namespace) -> str:
    """The table `compare` prints (benchmarks/results/heldout_plans_h100.md)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _compare(args)
    return buf.getvalue()


def _compare(args: argparse.Namespace) -> None:
    got = _best_pairs(args)
    spec, ps = got["spec"], got["pairs"]
    ratios = np.array([p["heldout"][0] / p["analytical"][0] for p in ps])
    retimed: dict[str, float] = {}
    if args.retime:
        again, _, _ = _measured(args.retime, spec.name)
        for p in ps:
            ka, kh = (p["key"], p["analytical"][2]), (p["key"], p["heldout"][2])
            if ka in again and kh in again:
                retimed[p["key"]] = again[kh] / again[ka]
    print(f"# Held-out learned plans against the analytical model's, measured ({spec.name})\n")
    retime_arg = "".join(f" --retime {f}" for f in args.retime or [])
    print(
        "Generated by `python benchmarks/heldout_plans.py compare "
        f"{' '.join('--data ' + d for d in args.data)} --plans {args.plans}{retime_arg}`."
    )
    print("Ratio: the fastest held-out learned plan over the fastest analytical one (greedy,")
    print("priority, exact), each measured (lower is better; < 1: the learned model, which")
    print("never saw the graph, chose a faster plan).\n")
    if len(ratios):
        print(
            f"{len(ratios)} graphs where the held-out model proposed a plan the analytical "
            f"strategies did not; {got['ties']} where it proposed only theirs; "
            f"{got['unmeasured']} held-out plans without a measurement. As collected: "
            f"{_summary(ratios)}.\n"
        )
    if retimed:
        r2 = np.array(list(retimed.values()))
        first = np.array([p["heldout"][0] / p["analytical"][0] for p in ps if p["key"] in retimed])
        agree = ((first < 1) == (r2 < 1)).sum()
        print(
            f"Re-timed, both plans of a graph in one run ({len(r2)} graphs): {_summary(r2)}; "
            f"the same winner as when collected in {agree} of {len(r2)}.\n"
        )
        noise = _plan_noise(args.data, args.retime, spec.name)
        if len(noise):
            print(
                f"Plan-level noise floor: {len(noise)} plans timed in both runs differ by "
                f"{np.median(noise) * 100:.1f}% at the median, {noise.mean() * 100:.1f}% on "
                f"average (|t2/t1 - 1|).\n"
            )
    for s, v in got["same"].items():
        v = np.array(v)
        print(
            f"- {s} under the held-out model against {s} under the analytical one, over all "
            f"{len(v)} graphs: {_summary(v)}."
        )
    print()
    head = "| model | shape | dtype | analytical best (us) | held-out learned best (us) | ratio |"
    sep = "|---|---|---|---|---|---|"
    if retimed:
        head, sep = head + " re-timed |", sep + "---|"
    print(head)
    print(sep)
    for p in ps:
        row, (ta, sa, _), (th, sh, _) = p["row"], p["analytical"], p["heldout"]
        line = (
            f"| {row['model'].removeprefix('zoo:')} | {row['shape']} | {row['dtype']} | "
            f"{sa} {ta * 1e6:.1f} | {sh} {th * 1e6:.1f} | {th / ta:.3f} |"
        )
        if retimed:
            line += f" {retimed[p['key']]:.3f} |" if p["key"] in retimed else " - |"
        print(line)


def _plan_noise(data: list[str], retime: list[str], device: str) -> np.ndarray:
    """|t2/t1 - 1| of every plan measured in both the dataset and the re-timing run."""
    first, _, _ = _measured(data, device)
    again, _, _ = _measured(retime, device)
    return np.array([abs(again[k] / first[k] - 1) for k in again if k in first])


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--data", action="append", required=True)
    m.add_argument("--device", default="h100")
    m.add_argument("--folds", type=int, default=5)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dropout", type=float, default=0.0)
    m.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    m.add_argument("--steps", type=int, default=None, help="MLP steps (default: the MLP's)")
    m.add_argument(
        "--form",
        choices=FORMS,
        default="free",
        help="the MLP form planning (free: what the v1 and v2 files were made with)",
    )
    m.add_argument("--strategies", default="greedy,priority,exact")
    m.add_argument("--budget-s", type=float, default=3.0, help="per strategy and graph")
    m.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--data", action="append", required=True)
    c.add_argument("--device", default="h100")
    c.add_argument("--plans", required=True, help="the file `make` wrote")
    c.add_argument(
        "--retime", action="append", default=None, help="a dataset that re-timed the pairs"
    )
    pr = sub.add_parser("pairs")
    pr.add_argument("--data", action="append", required=True)
    pr.add_argument("--device", default="h100")
    pr.add_argument("--plans", required=True, help="the file `make` wrote")
    pr.add_argument("--out", required=True)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    {"make": make, "compare": compare, "pairs": pairs}[args.cmd](args)
