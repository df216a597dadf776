"""Is a plan's latency the sum of its groups' latencies? On a profile dataset:

    python benchmarks/plan_additivity.py data/h100_profiles.parquet [--column call_median_s]

For every plan row all of whose groups were also timed alone (group rows of the same
graph), the plan's measured latency against the plain sum of its groups' measured
latencies, and against the plan-context form (learned_cost.plan_context) fitted on those
plans; and the oracle regret: per graph with two or more such plans, the measured latency
of the plan whose measured group sum is least, over the best measured. This is the error
the planner's additive objective would make with perfect group costs: the floor under the
learned model's plan error and regret. `--column call_median_s` judges whole calls from
the host instead (collector version 3 rows keep both).

`--residual` asks whether a plan-level model could lower that floor: gradient-boosted
trees on features of the whole plan (dtype, groups, its footprint and its largest group's
against the L2, the share of GEMM FLOPs, of tiny groups), predicting log(plan / sum),
cross-validated by graph (5 folds), so each plan is corrected by trees that never saw
its graph; and the per-group in-plan factor the learned model fits
(`learned_cost.plan_context.fit_plan_context_groups`), cross-validated the same way, on
the groups' features alone and with their graph's footprint against the L2 (the form
`fusion-plan cost train` fits).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq

from learned_cost.features import normalize_dtype
from learned_cost.plan_context import fit_plan_context, fit_plan_context_groups, graph_footprint
from learned_cost.study.plan_eval import GraphCache, plan_group_design
from planner.cost import group_io
from planner.hardware import get_spec


def covered_plans(
    rows: list[dict], column: str, graphs: GraphCache | None = None
) -> list[tuple[dict, float, list[float]]]:
    """(plan row, measured plan latency, its groups' measured latencies) per covered plan.

    A group of views only launches nothing and is never timed alone; with `graphs` (to
    recapture each plan's graph) such groups are known free and do not leave a plan out."""
    alone = {
        (r["graph_key"], tuple(sorted(json.loads(r["nodes"])))): r["measured_median_s"]
        for r in rows
        if r["kind"] == "group" and r["ok"]
    }
    out = []
    for r in rows:
        if r["kind"] != "plan" or not r["ok"] or not np.isfinite(r.get(column) or np.nan):
            continue
        groups = json.loads(r["nodes"])
        graph = graphs.get(r) if graphs is not None else None
        if graph is not None:
            groups = [g for g in groups if group_io(graph, g).n_kernels]
        ts = [alone.get((r["graph_key"], tuple(sorted(g)))) for g in groups]
        if None not in ts:
            out.append((r, float(r[column]), [float(t) for t in ts]))
    return out


def plan_features(row: dict, graph, times: list[float], l2_bytes: float) -> list[float]:
    """What a plan-level correction could see: the plan as a whole, against the L2."""
    groups = [g for g in json.loads(row["nodes"]) if group_io(graph, g).n_kernels]
    ios = [group_io(graph, g) for g in groups]
    roots: dict[int, int] = {}
    for io in ios:
        for t in io.inputs + io.outputs:
            roots[graph.root(t)] = graph.tensors[graph.root(t)].nbytes
    footprint = max(sum(roots.values()), 1)
    moved = [max(io.bytes, 1) for io in ios]
    flops = sum(io.flops for io in ios)
    ts = np.array(times)
    return [
        float(row["dtype"] == "bfloat16"),
        np.log10(len(ios)),
        np.log10(footprint / l2_bytes),
        np.log10(max(moved) / l2_bytes),
        np.log10(ts.sum()),
        float((ts < 5e-6).mean()),
        np.log10(sum(moved) / footprint),
        sum(io.matmul_flops for io in ios) / max(flops, 1),
        float(footprint > l2_bytes),
        float(np.mean([b > l2_bytes for b in moved])),
    ]


def group_factor_cv(plans: list, graphs: GraphCache, spec) -> dict[str, np.ndarray]:
    """Each plan's groups' measured latencies through the in-plan factor of
    learned_cost.plan_context, fitted by graph (5 folds): on the groups' features alone
    ("in-plan factor") and with their graph's footprint against the L2 ("+ graph
    footprint"), both from one design of the plans."""
    from sklearn.model_selection import GroupKFold

    lats, feats, fps = [], [], []
    for row, _, ts in plans:
        graph = graphs.get(row)
        groups = [g for g in json.loads(row["nodes"]) if group_io(graph, g).n_kernels]
        X, _ = plan_group_design(graph, groups, spec, normalize_dtype(str(row["dtype"])))
        lats.append(np.array(ts))
        feats.append(X if len(X) == len(ts) else None)  # None: that plan's factor is 1
        fps.append(graph_footprint(graph, spec))
    m = np.array([m for _, m, _ in plans])
    keys = np.array([r["graph_key"] for r, _, _ in plans])
    out = {}
    for label, footprint in (("in-plan factor", False), ("+ graph footprint", True)):
        pred = np.zeros(len(plans))
        for train, test in GroupKFold(5).split(m, m, keys):
            ctx = fit_plan_context_groups(
                [lats[i] for i in train],
                [feats[i] for i in train],
                m[train],
                footprints=[fps[i] for i in train] if footprint else None,
            )
            for i in test:
                pred[i] = ctx.apply_sum(lats[i], feats[i], fps[i] if footprint else None)
        out[label] = pred
    return out


def residual_cv(plans: list, graphs: GraphCache, l2_bytes: float) -> np.ndarray:
    """Each plan's predicted sum x exp(residual) from trees that never saw its graph."""
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.model_selection import GroupKFold

    X = np.array([plan_features(r, graphs.get(r), ts, l2_bytes) for r, _, ts in plans])
    sums = np.array([sum(ts) for _, _, ts in plans])
    y = np.log(np.array([m for _, m, _ in plans]) / sums)
    keys = np.array([r["graph_key"] for r, _, _ in plans])
    pred = np.zeros_like(y)
    for train, test in GroupKFold(5).split(X, y, keys):
        gbt = GradientBoostingRegressor(
            n_estimators=100, max_depth=2, learning_rate=0.05, subsample=0.8, random_state=0
        )
        pred[test] = gbt.fit(X[train], y[train]).predict(X[test])
    return sums * np.exp(pred)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--column", default="measured_median_s")
    ap.add_argument("--residual", action="store_true", help="also a plan-level model, by graph")
    ap.add_argument("--device", default="h100", help="whose L2 (--residual)")
    args = ap.parse_args(argv)
    rows = pq.read_table(args.data).to_pylist()
    graphs = GraphCache()
    plans = covered_plans(rows, args.column, graphs)
    n_plans = sum(r["kind"] == "plan" and r["ok"] for r in rows)
    print(f"{args.data}: {len(plans)} of {n_plans} plans have every group timed alone")
    if not plans:
        return
    measured = np.array([m for _, m, _ in plans])
    sums = np.array([sum(ts) for _, _, ts in plans])
    ctx = fit_plan_context(sums, np.array([len(ts) for _, _, ts in plans]), measured)
    fitted = np.array([ctx.apply_sum(np.array(ts)) for _, _, ts in plans])
    preds = [("plain sum", sums), ("plan-context form", fitted)]
    if args.residual:
        spec = get_spec(args.device)
        preds.append(("plan-level trees", residual_cv(plans, graphs, float(spec.l2_bytes))))
        preds.extend(group_factor_cv(plans, graphs, spec).items())
    for label, pred in preds:
        e = np.abs(pred / measured - 1)
        print(f"  {label:18s} error: mean {100 * e.mean():.1f}%, median {100 * np.median(e):.1f}%")
    print(
        f"  fitted form: scale {ctx.scale:.3f}, per group {ctx.per_group_s * 1e6:+.2f} us, "
        f"per plan {ctx.per_plan_s * 1e6:+.2f} us"
    )
    by_graph: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (row, m, _), s in zip(plans, sums):
        by_graph[row["graph_key"]].append((s, m))
    regret = [min(c)[1] / min(m for _, m in c) - 1 for c in by_graph.values() if len(c) >= 2]
    if regret:
        print(
            f"  oracle regret over {len(regret)} graphs: mean {100 * np.mean(regret):.1f}%, "
            f"max {100 * np.max(regret):.1f}%"
        )
    print("  where the plain sum misses (plan / sum - 1, mean; |error| mean):")
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (row, m, _), s in zip(plans, sums):
        family = str(row["model"]).removeprefix("zoo:")
        kind = "random" if row["strategy"] == "random" else "strategies"
        for cell in ((family, str(row["dtype"])), ("all", kind)):
            cells[cell].append(m / s - 1)
    worst = sorted(cells.items(), key=lambda kv: -np.mean(np.abs(kv[1])))
    for (a, b), v in worst:
        print(
            f"    {a:24s} {b:10s} {len(v):4d} plans: {100 * np.mean(v):+6.1f}%, "
            f"|{100 * np.mean(np.abs(v)):.1f}%|"
        )


if __name__ == "__main__":
    main()
