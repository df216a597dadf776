"""Measured search quality: each strategy's best plan, realized and timed on the device.

    python benchmarks/search_quality.py --measure --out DIR [--cells PATTERNS] \
        [--budget-s 20] [--trials 200] [--top-k 2] [--time-limit-s 480] [--quick]

Per cell (a zoo model or a real-model suite cell at one shape, `CELLS`):

1. the model is built on the device (bf16 on CUDA, fp32 on CPU) and captured as `tune`
   captures it; the roofline lower bound is the whole graph as one kernel under the
   analytical model on this device's figures (total FLOPs at peak, graph inputs and
   outputs moved once);
2. the alternatives: eager and torch.compile's modes (default, max-autotune without CUDA
   graphs; on CUDA also reduce-overhead and max-autotune), each first call timed as its
   compile time, then timed in interleaved rounds by the project's runner;
3. every strategy of `STRATEGIES` searches under the same budget (seconds and trials) and
   the cost model ranks its points; its top-k distinct plans (a partition strategy has
   one) are realized with their labels and measured through the runner's serving path
   (profiling.runner.ServedExecutor: the user's model under the planner backend, checked
   against eager), exactly as `tune` measures a candidate. A plan two strategies share is
   measured once and credited to both; its realize-and-measure time still counts in each
   strategy's tuning time, which is search plus realize-and-measure of its candidates.

Rows (one JSON object per cell) are appended to DIR/search_measured.jsonl; a cell
already there for this device and dtype is skipped (resume), and no cell starts once
`--time-limit-s` has passed. DIR/search_measured.md is regenerated from all rows.
"""

from __future__ import annotations

import fnmatch
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.models import SUITE
from learned_cost.analytical import AnalyticalModel
from planner.hardware import get_spec, local_device_name
from planner.measurement import PlanJob
from planner.objective import Objective
from planner.runtime.graph import capture_for_serving
from profiling.runner import DeviceRunner, ServedExecutor, first_call
from search.cost_models import cost_model_for
from search.joint_search import WARM
from search.optuna_storage import optuna
from search.strategies import get_strategy
from search.strategy import Budget
from search.tune import Candidate, candidate_plan
from zoo.modelspec import dtype_name, resolve

STRATEGIES = ("priority", "greedy", "tpe", "joint-tpe", "joint-nsga2", "joint-rl")
JOINT = ("joint-tpe", "joint-nsga2", "joint-rl")
NEEDS_OPTUNA = ("tpe", "joint-tpe", "joint-nsga2")
ZOO_CELLS: tuple[tuple[str, dict[str, int]], ...] = (
    ("transformer-block", {"B": 32, "S": 512, "D": 1024, "H": 16}),
    ("llama-block", {"B": 4, "S": 2048}),
    ("mlp", {}),
    ("gpt2-block", {}),
    ("shared-act", {"B": 8, "S": 1024, "D": 1024}),
)
QUICK_CELLS: tuple[tuple[str, dict[str, int]], ...] = (
    ("mlp", {"B": 8, "D": 32, "HID": 64, "L": 2}),
    ("shared-act", {"B": 2, "S": 16, "D": 32}),
)
MODES_CUDA = ("eager", "compile", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MODES_CPU = ("eager", "compile")
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
QUICK_TIMER = {"warmup": 1, "min_reps": 3, "max_reps": 5, "max_seconds": 0.5}
QUICK_STEADY = {"rounds": 3, "round_s": 0.01, "warmup": 1}


def cells(quick: bool, patterns: list[str]) -> list[tuple[str, str, dict[str, int]]]:
    """(cell name, model spec, shape) of the chosen cells: zoo first, then the suite."""
    out = []
    for name, shape in QUICK_CELLS if quick else ZOO_CELLS:
        label = f"zoo:{name}" + (
            "" if not shape else ":" + "x".join(f"{k}{v}" for k, v in shape.items())
        )
        out.append((label, f"zoo:{name}", shape))
    for m in SUITE:
        for shape in (m.tiny_shape,) if quick else m.shapes:
            label = f"{m.name}:" + "x".join(f"{k}{v}" for k, v in shape.items())
            out.append((label, m.spec(tiny=quick), shape))
    if quick and not patterns:
        out = [out[0], out[len(QUICK_CELLS)]]  # a zoo cell and one tiny real model
    if patterns:
        out = [c for c in out if any(fnmatch.fnmatch(c[0], p) for p in patterns)]
    return out


def roofline_lower_bound(graph: Any, device: str) -> float:
    """The whole graph as one kernel under the analytical roofline (seconds)."""
    model = AnalyticalModel(get_spec(device))
    try:
        return model.group_cost(graph, frozenset(range(len(graph.nodes)))).latency_s
    except Exception:  # an op the model cannot price: no bound rather than a wrong one
        return math.nan


def available(strategies: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The strategies that can run here and why the others cannot."""
    if optuna is not None:
        return strategies, {}
    skipped = {s: "optuna is not installed" for s in strategies if s in NEEDS_OPTUNA}
    return tuple(s for s in strategies if s not in skipped), skipped


def strategy_candidates(
    name: str, graph: Any, objective: Objective, budget: Budget, trials: int, top_k: int
) -> tuple[list[Candidate], float, str]:
    """(its candidates, lowest predicted first; search seconds; its notes)."""
    kw: dict[str, Any] = {}
    if name in JOINT or name == "tpe":
        kw["max_trials"] = trials
    t0 = time.perf_counter()
    res = get_strategy(name, **kw).plan(graph, objective, budget, seed=0)
    search_s = time.perf_counter() - t0
    if name in JOINT:  # its top-k, and its warm start (priority's plan) as tune measures it
        variants = res.extra.get("variants", [])
        rows = variants[:top_k] + [v for v in variants[top_k:] if v[3] == WARM]
        cands = [
            Candidate(name, p, pred, labels=lab, found_by=fb, copies=cp)
            for p, lab, pred, fb, cp in rows
        ]
    else:
        cands = [Candidate(name, res.partition, res.total_s, found_by=name)]
    return cands, search_s, res.notes


def run_cell(
    cell: tuple[str, str, dict[str, int]],
    args: Any,
    runner: DeviceRunner,
    say: Callable[[str], None],
) -> dict[str, Any]:
    label, spec_text, shape = cell
    dev = runner.device
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    device_name = local_device_name(dev)
    row: dict[str, Any] = {
        "cell": label,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.machine(),
        "dtype": dtype_name(dtype),
        "torch": torch.__version__,
        "budget_s": args.budget_s,
        "trials": args.trials,
        "top_k": args.top_k,
    }
    spec = resolve(spec_text, shape)
    torch.manual_seed(0)
    module, inputs = spec.build(dtype=dtype, device=dev, seed=0)
    captured = capture_for_serving(module, inputs, name=label)
    graph = captured.graph
    row["ops"] = len(graph.nodes)
    row["roofline_lb_s"] = roofline_lower_bound(graph, device_name)
    row["alternatives"] = alternatives(module, inputs, dev, runner, say, label, args.modes)
    strategies, skipped = available(tuple(args.strategies))
    row["skipped"] = skipped
    measured: dict[Any, dict[str, Any]] = {}  # candidate key -> its measurement row
    out: dict[str, Any] = {}
    cost_model = cost_model_for(args.cost_model, device_name)
    for name in strategies:
        objective = Objective(cost_model)
        budget = Budget(max_seconds=args.budget_s)
        try:
            cands, search_s, notes = strategy_candidates(
                name, graph, objective, budget, args.trials, args.top_k
            )
        except Exception as e:  # a strategy that fails is reported; the others go on
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        rows, measure_s = [], 0.0
        for c in cands:
            if c.key not in measured:
                say(f"{label}: {name}: measuring a plan of {len(c.partition)} groups")
                measured[c.key] = measure_candidate(c, objective, captured, module, inputs,
                                                    runner, device_name, row["dtype"])  # fmt: skip
            m = measured[c.key]
            measure_s += m["measure_s"]
            rows.append(m | {"found_by": c.found_by, "predicted_s": c.predicted_s})
        ok = [r for r in rows if r.get("median_s") is not None]
        best = min(ok, key=lambda r: r["median_s"], default=None)
        out[name] = {
            "search_s": search_s,
            "tune_s": search_s + measure_s,
            "notes": notes,
            "candidates": rows,
            "best_s": best["median_s"] if best else None,
            "best_spread": best["spread"] if best else None,
            "best_found_by": best["found_by"] if best else None,
            "best_labels": best["labels"] if best else None,
        }
    row["strategies"] = out
    return row


def measure_candidate(
    c: Candidate,
    objective: Objective,
    captured: Any,
    module: Any,
    inputs: Any,
    runner: DeviceRunner,
    device_name: str,
    dtype: str,
) -> dict[str, Any]:
    """Realize and time one candidate through the runner (the path `tune` uses)."""
    plan = candidate_plan(objective, c, device=device_name, dtype=dtype)
    t0 = time.perf_counter()
    m = runner.measure_plan(PlanJob(captured, plan, label=c.strategy, module=module,
                                    inputs=tuple(inputs)))  # fmt: skip
    row: dict[str, Any] = {
        "measure_s": time.perf_counter() - t0,
        "groups": len(c.partition),
        "labels": list(plan_labels(plan)),
        "realized": list(m.realizations or ()),
        "fallbacks": len(m.fallbacks or {}),
        "compile_s": m.compile_s,
        "median_s": m.timing.median_s if m.timing is not None else None,
        "spread": m.timing.spread if m.timing is not None else None,
    }
    if m.error:
        row["error"] = str(m.error)[:300]
    return row


def plan_labels(plan: Any) -> tuple[str, ...]:
    return tuple(gp.realization for gp in plan.groups)


def alternatives(
    module: Any,
    inputs: Any,
    dev: torch.device,
    runner: DeviceRunner,
    say: Callable,
    label: str,
    only: list[str] | None = None,
) -> dict[str, Any]:
    """Eager and torch.compile's modes (those of `only`, when given, that this device
    runs): compile time (first call) and interleaved timing."""
    modes = MODES_CUDA if dev.type == "cuda" else MODES_CPU
    modes = tuple(m for m in modes if not only or m in only)
    fns: dict[str, Callable[[], Any]] = {}
    compile_s: dict[str, float] = {}
    errors: dict[str, str] = {}
    torch._dynamo.reset()
    for mode in modes:
        if mode == "eager":
            fn = module
        elif mode == "compile":
            fn = torch.compile(module)
        else:
            fn = torch.compile(module, mode=mode)
        say(f"{label}: first call of {mode}")
        try:
            compile_s[mode], _ = first_call(lambda f=fn: f(*inputs), dev)
            fns[mode] = lambda f=fn: f(*inputs)
        except Exception as e:  # a mode that cannot run is reported, not fatal
            errors[mode] = f"{type(e).__name__}: {str(e)[:200]}"
    timed = runner.measure_interleaved(fns, compile_s=compile_s)
    out: dict[str, Any] = {m: {"error": e} for m, e in errors.items()}
    for mode, m in timed.items():
        if m.timing is None:
            out[mode] = {"error": str(m.error)[:300]}
        else:
            out[mode] = {
                "median_s": m.timing.median_s,
                "spread": m.timing.spread,
                "compile_s": compile_s.get(mode, 0.0),
            }
    torch._dynamo.reset()
    return out


# ---- rows and the table ----------------------------------------------------------------
def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run: that cell runs again
    return rows


def done_cells(rows: list[dict[str, Any]], device: str, dtype: str) -> set[str]:
    return {r["cell"] for r in rows if r.get("device") == device and r.get("dtype") == dtype}


def best_alternative(row: dict[str, Any]) -> tuple[str, float] | None:
    ok = [(m, v["median_s"]) for m, v in row["alternatives"].items() if "median_s" in v]
    return min(ok, key=lambda x: x[1]) if ok else None


def _best(row: dict[str, Any], names: tuple[str, ...]) -> float | None:
    vals = [row["strategies"].get(n, {}).get("best_s") for n in names]
    vals = [v for v in vals if v is not None]
    return min(vals) if vals else None


def autotune_compile_s(row: dict[str, Any]) -> float | None:
    """max-autotune's compile time: the larger first call of its two modes (the first of
    them to run pays the autotuning, the other finds its results cached)."""
    vals = [row["alternatives"].get(m, {}).get("compile_s") for m in AUTOTUNE_MODES]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _us(s: float | None) -> str:
    return "—" if s is None or not math.isfinite(s) else f"{s * 1e6:.1f}"


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, computed from the rows (no figure typed in)."""
    ratios, wins, n_cmp, lb_ok, lb_n, tt = [], 0, 0, 0, 0, []
    for r in rows:
        prio = _best(r, ("priority",))
        joint = _best(r, JOINT)
        base = _best(r, ("greedy", "priority"))
        if prio and joint:
            ratios.append(min(joint, prio) / prio)
        searched = _best(r, ("joint-tpe", "joint-rl"))
        if base and searched:
            n_cmp += 1
            wins += searched < base
        best = _best(r, STRATEGIES)
        if best and r["roofline_lb_s"] > 300e-6:
            lb_n += 1
            lb_ok += best <= 1.3 * r["roofline_lb_s"]
        ma = autotune_compile_s(r)
        tune_s = [v.get("tune_s") for n, v in r["strategies"].items() if n in JOINT]
        tune_s = [t for t in tune_s if t is not None]
        if ma and tune_s:
            tt.append(max(tune_s) <= ma)
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else math.nan
    return [
        f"- best joint plan vs priority's plan, measured, geo-mean over {len(ratios)} cells: "
        f"{geo:.3f}x ({'met' if geo <= 0.95 else 'NOT met'}: target <= 0.95x)",
        f"- joint-tpe or joint-rl strictly faster than best-of(greedy, priority): {wins}/{n_cmp}"
        f" cells ({'met' if n_cmp and 2 * wins >= n_cmp else 'NOT met'}: target half)",
        f"- best plan <= 1.3x the roofline lower bound where the bound is > 300 us: "
        f"{lb_ok}/{lb_n} cells",
        f"- joint tuning time <= max-autotune's compile time: {sum(tt)}/{len(tt)} cells",
    ]


def _commands(rows: list[dict[str, Any]], command: str) -> list[str]:
    """The commands that measured the rows, in order (`command` where no row names one)."""
    seen = list(dict.fromkeys(r["command"] for r in rows if r.get("command"))) or [command]
    if len(seen) == 1:
        return [f"Command: `{seen[0]}`"]
    return ["Commands, in the order they ran (each row was measured by one of them):", ""] + [
        f"- `{c}`" for c in seen
    ]


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    head = ["cell", "ops", "priority us", "greedy", "tpe", "joint-tpe", "joint-nsga2",
            "joint-rl", "best alternative", "roofline LB us", "best / LB",
            "tuning s (joint max) / max-autotune compile s"]  # fmt: skip
    lines = [
        "# Search quality, measured",
        "",
        *_commands(rows, command),
        "",
        "Latency: median per call through the planner backend (the runner's serving path, "
        "as `tune` measures), us; strategy cells: best measured plan of the strategy's "
        "top-k, as a ratio to priority's plan (< 1: faster); `!` marks a plan found by "
        "priority's warm start inside a joint search.",
        "",
        "## Targets",
        "",
        *targets(rows),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        st = r["strategies"]
        prio = st.get("priority", {}).get("best_s")
        cells_ = [r["cell"], str(r["ops"]), _us(prio)]
        for n in STRATEGIES[1:]:
            v = st.get(n, {})
            b = v.get("best_s")
            if b is None:
                why = "not run" if n not in st else "failed"
                cells_.append("skipped" if n in r.get("skipped", {}) else why)
                continue
            mark = "!" if str(v.get("best_found_by", "")).startswith("priority") else ""
            cells_.append(f"{b / prio:.3f}{mark}" if prio else _us(b))
        alt = best_alternative(r)
        cells_.append(f"{alt[0]} {_us(alt[1])}" if alt else "—")
        lb = r["roofline_lb_s"]
        best = _best(r, STRATEGIES)
        cells_ += [_us(lb), f"{best / lb:.2f}" if best and lb and math.isfinite(lb) else "—"]
        ma = autotune_compile_s(r)
        tune_s = max((v.get("tune_s") or 0.0 for n, v in st.items() if n in JOINT), default=0.0)
        cells_.append(f"{tune_s:.0f} / {ma:.0f}" if ma else f"{tune_s:.0f} / —")
        lines.append("| " + " | ".join(cells_) + " |")
    lines += ["", *tuning_table(rows)]
    return "\n".join(lines) + "\n"


def tuning_table(rows: list[dict[str, Any]]) -> list[str]:
    """Tuning seconds per strategy (search, then realize and measure its candidates) next
    to max-autotune's compile time, per cell (one shape: one bucket)."""
    names = [n for n in STRATEGIES if any(n in r["strategies"] for r in rows)]
    head = ["cell", *(f"{n} s" for n in names), "max-autotune compile s"]
    out = [
        "Tuning time per bucket: each strategy's search plus realize-and-measure of its "
        "candidates, seconds (search seconds in brackets), next to max-autotune's compile "
        "time for the same model and shape.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells_ = [r["cell"]]
        for n in names:
            v = r["strategies"].get(n, {})
            t, s = v.get("tune_s"), v.get("search_s")
            cells_.append("—" if t is None else f"{t:.0f}" + ("" if s is None else f" ({s:.1f})"))
        ma = autotune_compile_s(r)
        cells_.append("—" if ma is None else f"{ma:.0f}")
        out.append("| " + " | ".join(cells_) + " |")
    return out


def render_jsonl(path: Path) -> str:
    """The table of a committed search_measured.jsonl (with the commands of its rows)."""
    rows = read_rows(path)
    return markdown(rows, next((r["command"] for r in reversed(rows) if r.get("command")), ""))


def main(args: Any, command: str, say: Callable[[str], None]) -> int:
    """The --measure mode of benchmarks/search_quality.py (see the module doc)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl, md = out / "search_measured.jsonl", out / "search_measured.md"
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.quick:
        runner = DeviceRunner(executor=ServedExecutor(), device=dev, timer=QUICK_TIMER,
                              steady=QUICK_STEADY, trials=1)  # fmt: skip
    else:
        runner = DeviceRunner(executor=ServedExecutor(), device=dev)
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.machine()
    done = done_cells(read_rows(jsonl), device, dtype)
    t0, longest = time.perf_counter(), 0.0

    def write_table() -> None:
        rows = [r for r in read_rows(jsonl) if (r.get("device"), r.get("dtype")) == (device, dtype)]
        md.write_text(markdown(rows, command))

    for cell in cells(args.quick, args.cells):
        if cell[0] in done:
            say(f"{cell[0]}: already measured, skipped")
            continue
        elapsed = time.perf_counter() - t0
        if args.time_limit_s and elapsed + longest > args.time_limit_s:
            say(f"time limit: {cell[0]} and later cells left for the next run (the longest "
                f"cell took {longest:.0f} s, {elapsed:.0f} s of {args.time_limit_s:.0f} s spent)")  # fmt: skip
            break
        say(f"{cell[0]}: start")
        c0 = time.perf_counter()
        try:
            row = run_cell(cell, args, runner, say)
        except Exception as e:  # one cell's failure is reported, the others go on
            say(f"{cell[0]}: failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        finally:
            longest = max(longest, time.perf_counter() - c0)
        row["cell_s"] = time.perf_counter() - c0
        row["command"] = command
        with jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        write_table()  # after every cell: a run cut short still leaves its table
        say(f"{cell[0]}: done in {row['cell_s']:.0f} s")
    write_table()
    print(md.read_text())
    return 0
