"""Search quality: every strategy's modelled cost against exact (or the best found), and time.

    python benchmarks/search_quality.py [--out benchmarks/results/search_quality.md] [--quick]
    python benchmarks/search_quality.py --encoding-study [--out benchmarks/results/encoding_study.md]
    python benchmarks/search_quality.py --from-json benchmarks/results/search_quality.json

The modelled benchmark and the encoding study save their raw rows as JSON beside their
markdown (benchmarks/raw_rows.py, same name, `.json`); the markdown is rendered from them
and `--from-json` renders it again (to stdout).
    python benchmarks/search_quality.py --measure --out DIR [--quick] [--cells P,...] \
        [--budget-s S] [--trials N] [--top-k K] [--time-limit-s T] [--modes M,...]
    python benchmarks/search_quality.py --render-measured DIR   # DIR/search_measured.md again

--measure: each strategy's best plans realized and timed on this machine's device against
priority's plan, torch.compile's modes and the roofline lower bound
(benchmarks/search_measured.py says how); needs optuna only for tpe, joint-tpe and
joint-nsga2 (skipped, and said so, without it).

Graphs: the zoo models at several shapes (bf16, meta-device capture) and random DAGs of 10
to 500 ops from zoo.randgraph with seeds >= HELD_OUT_SEED, which the RL policy never
saw (nor the zoo families in HELD_OUT_ZOO). Cost model: the analytical roofline on the H100
datasheet figures (the inner objective every strategy optimizes here).

Strategies: greedy, priority, exact (a time budget; its answer is the reference when it
proves optimality), tpe and rl-ft at equal budgets (the same evaluations and seconds; each
strategy's own stopping rules are lifted so the budget is what binds), rl zero-shot.

Equal budget per graph of n ops (`equal_budget`): 12 n + 400 objective evaluations and
5 s (n <= 30), 10 s (n < 100) or 20 s (n >= 100), whichever binds first; and at most as
many tpe trials, or rl-ft episodes, as that evaluation budget (a trial or episode answered
wholly from a cache spends no evaluation). The trial/episode cap is there because on a
graph whose every reachable group is already scored (the 10-op resnet-bottleneck, say)
neither strategy spends evaluations any more: without it both would re-sample known plans
until the seconds ran out, and the comparison would measure the clock.

Targets (docs/search.md): tpe and rl-ft within 1% of exact on every graph of <= 30 ops; rl
zero-shot at least as good as greedy on held-out graphs; on large graphs (>= 100 ops) the
best search strictly better than priority on at least half of them.

--encoding-study: tpe on the contested encoding vs the plain one-bit-per-link encoding,
TPE vs random sampling, pruning on vs off, at equal trials (docs/search.md quotes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import benchmarks.search_measured as measured  # noqa: E402
import zoo  # noqa: E402
from benchmarks import raw_rows  # noqa: E402
from learned_cost.analytical import AnalyticalModel  # noqa: E402
from planner.hardware import get_spec  # noqa: E402
from planner.ir.capture import capture  # noqa: E402
from planner.ir.graph import OpGraph  # noqa: E402
from planner.objective import Objective  # noqa: E402
from search.encoding import build_encoding  # noqa: E402
from search.optuna_storage import optuna  # noqa: E402
from search.rl_train import HELD_OUT_SEED, HELD_OUT_ZOO, TRAIN_ZOO  # noqa: E402
from search.strategies import get_strategy  # noqa: E402
from search.strategy import Budget  # noqa: E402
from zoo.randgraph import random_graph  # noqa: E402

SMALL = 30  # "graphs of <= 30 nodes"
LARGE = 100  # "large graphs"
RL_ROLLOUTS = 4  # rl-ft episodes per iteration (the strategy's default)

ZOO_SHAPES: tuple[tuple[str, dict[str, int]], ...] = (
    ("transformer-block", {"B": 1, "S": 128}),
    ("transformer-block", {}),
    ("transformer-block", {"B": 4, "S": 2048, "D": 1024, "H": 16}),
    ("gpt2-block", {"B": 1, "S": 128}),
    ("gpt2-block", {}),
    ("llama-block", {}),
    ("llama-block", {"B": 1, "S": 4096, "D": 4096, "H": 32}),
    ("bert-layer", {}),
    ("transformer-block-sdpa", {}),
    ("resnet-bottleneck", {}),
    ("resnet-bottleneck", {"B": 32, "HW": 28}),
    ("conv-bn-relu-2pool", {}),
    ("mlp", {"B": 512}),
    ("pointwise-chain", {}),
)
RANDOM_SIZES = ((10, 3), (20, 3), (30, 3), (50, 2), (100, 2), (200, 2), (300, 2), (500, 2))


@dataclasses.dataclass
class Row:
    graph: str
    nodes: int
    held_out: str  # "yes" | "family seen" | "shape seen"
    unfused_us: float
    results: dict[
        str, tuple[float, float, bool, str]
    ]  # name -> (total_s, seconds, complete, notes)
    reference: str = ""
    ref_s: float = math.nan


def row_dict(r: Row) -> dict[str, Any]:
    """One graph's row as saved in the rows file."""
    d = dataclasses.asdict(r)
    d["results"] = {
        n: {"total_s": t, "seconds": secs, "complete": c, "notes": notes}
        for n, (t, secs, c, notes) in r.results.items()
    }
    return d


def row_from_dict(d: dict[str, Any]) -> Row:
    res = {
        n: (v["total_s"], v["seconds"], v["complete"], v["notes"]) for n, v in d["results"].items()
    }
    return Row(**{**d, "results": res})


def objective() -> Objective:
    spec = get_spec("h100", measured=False)
    return Objective(AnalyticalModel(spec), spec=spec)


def graphs(quick: bool) -> list[tuple[OpGraph, str]]:
    out: list[tuple[OpGraph, str]] = []
    shapes = ZOO_SHAPES[::3] if quick else ZOO_SHAPES
    for name, params in shapes:
        module, inputs = zoo.get(name).build(params or None, dtype=torch.bfloat16, device="meta")
        label = name + ("" if not params else " " + ",".join(f"{k}={v}" for k, v in params.items()))
        g = capture(module, inputs, name=label)
        if name in HELD_OUT_ZOO:
            seen = "yes"
        elif params in TRAIN_ZOO.get(name, ()):
            seen = "shape seen"
        else:
            seen = "family seen"
        out.append((g, seen))
    sizes = RANDOM_SIZES[::2] if quick else RANDOM_SIZES
    for n, count in sizes:
        for k in range(count):
            out.append((random_graph(n, HELD_OUT_SEED + 100 * n + k), "yes"))
    return out


def equal_budget(n: int, quick: bool) -> Budget:
    """The same budget for tpe and rl-ft: evaluations and seconds growing with the graph."""
    seconds = 5.0 if n <= SMALL else 10.0 if n < LARGE else 20.0
    return Budget(max_evals=12 * n + 400, max_seconds=seconds / (2 if quick else 1))


def exact_seconds(quick: bool) -> float:
    return 10.0 if quick else 30.0


def run_graph(g: OpGraph, seen: str, quick: bool) -> Row:
    budget = equal_budget(len(g.nodes), quick)
    cap = budget.max_evals or 0  # trials (tpe) or episodes (rl-ft): see the docstring
    iters = cap // RL_ROLLOUTS
    plans: list[tuple[str, Any, Budget | None]] = [
        ("greedy", get_strategy("greedy"), None),
        ("priority", get_strategy("priority"), None),
        ("exact", get_strategy("exact"), Budget(max_seconds=exact_seconds(quick))),
        ("tpe", get_strategy("tpe", max_trials=cap, patience=cap), budget),
        ("rl", get_strategy("rl"), None),
        (
            "rl-ft",
            get_strategy("rl-ft", rollouts=RL_ROLLOUTS, max_iters=iters, patience=iters),
            budget,
        ),
    ]
    row = Row(g.name, len(g.nodes), seen, objective().unfused(g).total_s * 1e6, {})
    for name, strat, b in plans:
        if name == "exact" and len(g.nodes) > 2 * LARGE:
            continue  # beyond its reach: the budget would only be spent to return priority
        t0 = time.perf_counter()
        r = strat.plan(g, objective(), b, seed=0)
        row.results[name] = (r.total_s, time.perf_counter() - t0, r.complete, r.notes)
    exact = row.results.get("exact")
    if exact is not None and exact[2]:
        row.reference, row.ref_s = "exact", exact[0]
    else:
        row.reference, row.ref_s = "best", min(v[0] for v in row.results.values())
    return row


def fmt_rel(total_s: float, ref_s: float) -> str:
    rel = total_s / ref_s - 1
    return "0" if abs(rel) < 5e-7 else f"{100 * rel:+.2f}%"


NAMES = ("greedy", "priority", "exact", "tpe", "rl", "rl-ft")


def table(rows: list[Row]) -> list[str]:
    head = "| graph | ops | unseen by RL | unfused us | ref us | " + " | ".join(NAMES) + " |"
    lines = [head, "|" + "---|" * (5 + len(NAMES))]
    for r in rows:
        cells = []
        for n in NAMES:
            if n not in r.results:
                cells.append("—")
                continue
            total, secs, complete, _ = r.results[n]
            mark = "" if complete or n not in ("exact",) else " (incomplete)"
            cells.append(f"{fmt_rel(total, r.ref_s)} / {secs:.1f}s{mark}")
        ref = f"{r.ref_s * 1e6:.2f} ({r.reference})"
        lines.append(
            f"| {r.graph} | {r.nodes} | {r.held_out} | {r.unfused_us:.1f} | {ref} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def targets(rows: list[Row]) -> list[str]:
    out = []
    small = [r for r in rows if r.nodes <= SMALL]
    for name in ("tpe", "rl-ft"):
        gaps = []
        for r in small:
            if r.reference == "exact":
                gaps.append(r.results[name][0] / r.ref_s - 1)
        worst = max(gaps, default=math.nan)
        ok = "met" if gaps and worst <= 0.01 else "NOT met"
        out.append(
            f"- {name} within 1% of exact on every graph of <= {SMALL} ops: {ok} (worst "
            f"{100 * worst:+.3f}% over {len(gaps)} graphs where exact proved optimality, of "
            f"{len(small)})"
        )
    held = [r for r in rows if r.held_out == "yes"]
    wins = sum(r.results["rl"][0] <= r.results["greedy"][0] * (1 + 1e-9) for r in held)
    ok = "met" if wins == len(held) else "NOT met"
    out.append(
        f"- rl zero-shot at least as good as greedy on held-out graphs: {ok} ({wins}/{len(held)})"
    )
    large = [r for r in rows if r.nodes >= LARGE]
    better = 0
    for r in large:
        best = min(r.results[n][0] for n in ("tpe", "rl-ft"))
        better += best < r.results["priority"][0] * (1 - 1e-9)
    ok = "met" if 2 * better >= len(large) else "NOT met"
    out.append(
        f"- best search (tpe or rl-ft) strictly better than priority on >= half of the graphs "
        f"of >= {LARGE} ops: {ok} ({better}/{len(large)})"
    )
    return out


def summary(rows: list[Row]) -> list[str]:
    """Mean cost over the reference and total time, per strategy."""
    lines = [
        "| strategy | mean cost vs ref | worst | graphs at ref | total time s |",
        "|---|---|---|---|---|",
    ]
    for n in NAMES:
        rel = [r.results[n][0] / r.ref_s for r in rows if n in r.results]
        at_ref = sum(abs(x - 1) < 5e-7 for x in rel)
        secs = sum(r.results[n][1] for r in rows if n in r.results)
        lines.append(
            f"| {n} | {100 * (sum(rel) / len(rel) - 1):+.3f}% | {100 * (max(rel) - 1):+.2f}% | "
            f"{at_ref}/{len(rel)} | {secs:.0f} |"
        )
    return lines


ENCODING_VARIANTS = (
    ("contested, TPE", {"mode": "contested"}, "tpe"),
    ("contested, random", {"mode": "contested"}, "random"),
    ("contested, TPE, pruning", {"mode": "contested", "prune": True}, "tpe"),
    ("all links, TPE", {"mode": "all", "max_free": 100_000}, "tpe"),
    ("all links, random", {"mode": "all", "max_free": 100_000}, "random"),
)


def encoding_trials(quick: bool) -> int:
    return 60 if quick else 150


def encoding_study(quick: bool) -> list[dict[str, Any]]:
    """tpe: contested vs plain encoding, TPE vs random sampler, pruning, equal trials; one
    row per graph and variant."""
    trials = encoding_trials(quick)
    cases = [
        (n, HELD_OUT_SEED + 7000 + n + k) for n in (100, 250, 500) for k in range(2 if quick else 3)
    ]
    rows = []
    for n, seed in cases:
        g = random_graph(n, seed)
        prio = get_strategy("priority").plan(g, objective()).total_s
        for label, kw, sampler in ENCODING_VARIANTS:
            strat = get_strategy("tpe", max_trials=trials, patience=trials, sampler=sampler, **kw)
            t0 = time.perf_counter()
            r = strat.plan(g, objective(), seed=0)
            k = len(
                build_encoding(
                    g, objective(), mode=kw["mode"], max_free=kw.get("max_free", 64)
                ).decisions
            )
            rows.append(
                {
                    "graph": g.name,
                    "nodes": n,
                    "seed": seed,
                    "variant": label,
                    "total_s": r.total_s,
                    "priority_s": prio,
                    "decisions": k,
                    "seconds": time.perf_counter() - t0,
                }
            )
            print(f"{g.name} {label}: {100 * (r.total_s / prio - 1):+.2f}%", flush=True)
    return rows


def encoding_table(rows: list[dict[str, Any]], trials: int) -> list[str]:
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = [
        f"Equal trials ({trials}, warm-started with priority and greedy), cost relative to "
        "priority (negative: better); decisions exposed; seconds.",
        "",
        "| graph | ops | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    totals: dict[str, list[float]] = {v: [] for v in variants}
    for name in dict.fromkeys(r["graph"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["graph"] == name}
        cells = []
        for v in variants:
            r = mine[v]
            rel = r["total_s"] / r["priority_s"] - 1
            totals[v].append(rel)
            cells.append(f"{100 * rel:+.2f}% (k={r['decisions']}, {r['seconds']:.0f}s)")
        lines.append(f"| {name} | {r['nodes']} | " + " | ".join(cells) + " |")
    means = [
        f"{100 * sum(v) / len(v):+.2f}%, better on {sum(x < -1e-9 for x in v)}/{len(v)}"
        for v in totals.values()
    ]
    lines.append("| mean | | " + " | ".join(means) + " |")
    return lines


def _header(run: dict[str, Any]) -> list[str]:
    lines = [
        f"Command: `{run['command']}`  ",
        f"Machine: {run['machine']}; cost model: analytical roofline, H100 datasheet figures.  ",
        f"Raw rows: `{run['rows_file']}` beside this file.",
    ]
    if run["settings"]["quick"]:
        lines += [
            "",
            "Settings other than the defaults: `--quick` (every third zoo shape and every "
            "other random-DAG size; fewer trials or smaller budgets, as stated below).",
        ]
    return [*lines, ""]


def render(run: dict[str, Any]) -> str:
    """The markdown of a run's rows (the modelled benchmark's or the encoding study's)."""
    quick = run["settings"]["quick"]
    if run["benchmark"] == "encoding_study":
        body = [
            "# Encoding study (tpe)",
            "",
            *_header(run),
            *encoding_table(run["rows"], run["settings"]["trials"]),
        ]
    else:
        rows = [row_from_dict(d) for d in run["rows"]]
        small, mid, b = (equal_budget(n, quick) for n in (SMALL, LARGE - 1, LARGE))
        body = [
            "# Search quality",
            "",
            *_header(run),
            "Cells: modelled cost relative to the reference (exact when it proved optimality "
            "within its budget, else the best any strategy found) / wall time. tpe and rl-ft "
            "share one budget per graph, whichever binds first: 12 x ops + 400 objective "
            f"evaluations, and {small.max_seconds:.0f} s (<= {SMALL} ops), "
            f"{mid.max_seconds:.0f} s (< {LARGE}) or {b.max_seconds:.0f} s, and at most as "
            "many tpe trials or rl-ft episodes as evaluations (the script's docstring says "
            "why); exact has "
            f"{exact_seconds(quick):.0f} s (not run past {2 * LARGE} ops).",
            "",
            "## Targets",
            "",
            *targets(rows),
            "",
            "## Per strategy",
            "",
            *summary(rows),
            "",
            "## Per graph",
            "",
            *table(rows),
        ]
    body += ["", f"Total benchmark time: {run['total_seconds']:.0f} s.", ""]
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer graphs, smaller budgets")
    ap.add_argument("--encoding-study", action="store_true")
    ap.add_argument("--measure", action="store_true", help="measure on this machine's device")
    ap.add_argument("--cells", default="", help="--measure: comma-separated fnmatch patterns")
    ap.add_argument("--strategies", default=",".join(measured.STRATEGIES))
    ap.add_argument("--budget-s", type=float, default=20.0, help="--measure: search seconds")
    ap.add_argument("--trials", type=int, default=200, help="--measure: trials or samples")
    ap.add_argument("--top-k", type=int, default=2, help="--measure: plans measured per search")
    ap.add_argument("--cost-model", default=None, help="--measure: the tune flag's values")
    ap.add_argument("--time-limit-s", type=float, default=0.0, help="--measure: no cell after")
    ap.add_argument(
        "--modes",
        default="",
        help="--measure: the alternatives timed, comma-separated from "
        f"{','.join(measured.MODES_CUDA)} (default: all this device runs)",
    )
    ap.add_argument(
        "--render-measured",
        default=None,
        metavar="DIR",
        help="rewrite DIR/search_measured.md from DIR/search_measured.jsonl (no measuring)",
    )
    raw_rows.add_from_json(ap)
    args = ap.parse_args(argv)
    if args.from_json:
        return raw_rows.rerender(args.from_json, render)
    if args.render_measured:
        folder = Path(args.render_measured)
        if not (folder / "search_measured.jsonl").exists():
            ap.error(f"--render-measured: no search_measured.jsonl in {folder}")
        (folder / "search_measured.md").write_text(
            measured.render_jsonl(folder / "search_measured.jsonl")
        )
        return 0
    cmd = "python benchmarks/search_quality.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.measure:
        if not args.out:
            ap.error("--measure needs --out DIR (rows are appended there, resumable)")
        unknown = set(args.strategies.split(",")) - set(measured.STRATEGIES)
        if unknown or args.budget_s <= 0 or args.trials < 1 or args.top_k < 1:
            ap.error(f"--strategies from {measured.STRATEGIES}; budgets >= 1 (got {unknown})")
        args.cells = [c for c in args.cells.split(",") if c]
        args.modes = [m for m in args.modes.split(",") if m]
        if set(args.modes) - set(measured.MODES_CUDA):
            ap.error(f"--modes from {measured.MODES_CUDA}, got {args.modes}")
        args.strategies = [s for s in measured.STRATEGIES if s in args.strategies.split(",")]
        return measured.main(args, cmd.strip(), lambda m: print(f"[sq] {m}", flush=True))
    if optuna is None:
        ap.error("the modelled benchmark needs optuna (tpe); pip install optuna")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.2f} at start), {torch.get_num_threads()} torch thread, Python "
        f"{platform.python_version()}, torch {torch.__version__}, optuna {optuna.__version__}"
    )
    settings: dict[str, Any] = {"quick": args.quick}
    if args.encoding_study:
        name = "encoding_study"
        settings["trials"] = encoding_trials(args.quick)
        rows = encoding_study(args.quick)
    else:
        name = "search_quality"
        rows = []
        for g, seen in graphs(args.quick):
            rows.append(run_graph(g, seen, args.quick))
            print(table(rows[-1:])[-1], flush=True)
        rows = [row_dict(r) for r in rows]
    out = Path(args.out or ROOT / f"benchmarks/results/{name}.md")
    run = {
        "benchmark": name,
        "command": cmd.strip(),
        "machine": machine,
        "settings": settings,
        "total_seconds": time.perf_counter() - t0,
        "rows_file": raw_rows.rows_path(out).name,
        "rows": rows,
    }
    print(raw_rows.write(out, run, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())
