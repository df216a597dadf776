"""Hugging Face `generate` as users decode: the planner backend against eager and torch.compile.

    PYTHONPATH=. python benchmarks/generate.py --out benchmarks/results/generate_h100      # GPU
    PYTHONPATH=. python benchmarks/generate.py --quick --out /tmp/generate                 # CPU

Per model of the real-model suite that generates (`gpt2`, `llama`: 4 layers at their real
width, bf16 on CUDA; tiny float32 configs with `--quick`): greedy decoding of
`--new-tokens` tokens after a prompt of `--prompt` tokens, batch `--batch`, with
`model.forward` compiled as a user would (`torch.compile(model.forward, backend=...,
dynamic=True)`), for each contender:

- eager; `torch.compile` (default, dynamic); `mode="reduce-overhead"` (dynamic, the
  library's default dynamic cache); `mode="reduce-overhead", fullgraph=True` with the
  static cache (`cache_implementation="static"`, the library's recipe for CUDA graphs); the
  fusion-planner backend with default plans (an empty cache: the prefill and decode graphs
  are planned by the rule, as a user gets before tuning).

A contender that fails (its compile or any call raises) gets a row with the error and no
time, and the others go on.

Each contender first generates once (its compile time, reported), then the contenders
generate in interleaved rounds (rotated order), and a contender's time is the median over
rounds of one `generate` call (CUDA synchronized; perf_counter), with its spread (IQR over
median). Tokens are compared with eager's (greedy decoding: they must be equal, or the
row says how many differ, and where they first part: a random-weight model in bf16 has
near-ties between its top logits, and an ulp of difference there picks the other token and
every later token with it. So the row gives the first differing step and eager's own margin
there (eager's logit of eager's token minus eager's logit of the contender's token; 0 is an
exact tie). One JSON line per (model, contender) in OUT.jsonl, and OUT.md
is the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.models import gpt2, llama  # noqa: E402
from planner.errors import first_line  # noqa: E402
from planner.runtime.backend import fusion_planner_backend  # noqa: E402

MODELS = {"gpt2": gpt2, "llama": llama}
CONTENDERS = ("eager", "compile", "reduce-overhead", "reduce-overhead+static", "planner")


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _build(name: str, quick: bool, batch: int, prompt: int, device: str, dtype: Any) -> Any:
    mod = MODELS[name]
    model, (ids,) = mod.tiny(batch, prompt) if quick else mod.factory(batch, prompt)
    return model.to(device=device, dtype=dtype).eval(), ids.to(device)


def _contender(kind: str, model: Any, db: str) -> Any:
    eager_forward = model.forward
    if kind == "compile":
        model.forward = torch.compile(eager_forward, dynamic=True)
    elif kind == "reduce-overhead":
        model.forward = torch.compile(eager_forward, mode="reduce-overhead", dynamic=True)
    elif kind == "reduce-overhead+static":  # the library's recipe: static shapes, one graph
        model.forward = torch.compile(eager_forward, mode="reduce-overhead", fullgraph=True)
    elif kind == "planner":
        backend = fusion_planner_backend(db)
        model.forward = torch.compile(eager_forward, backend=backend, dynamic=True)
        return backend
    return None


def _divergence(ref: Any, out: Any, ids_len: int) -> tuple[int, int | None, float | None]:
    """Tokens of `out` that differ from `ref` (both `generate` results with scores), the first
    differing new-token step, and ref's own logit margin there: ref's score of its token minus
    ref's score of out's token, for the first sequence of the batch that differs there."""
    a, b = ref.sequences[:, ids_len:], out.sequences[:, ids_len:]
    n = min(a.shape[1], b.shape[1])
    diff = a[:, :n] != b[:, :n]
    count = int(diff.sum()) + abs(a.shape[1] - b.shape[1]) * a.shape[0]
    if not bool(diff.any()):
        return count, None, None
    step = int(diff.any(dim=0).nonzero()[0])
    row = int(diff[:, step].nonzero()[0])
    scores = ref.scores[step][row].float()
    return count, step, float(scores[a[row, step]] - scores[b[row, step]])


def _say(text: str) -> None:
    """A progress line on stderr (the rows go to stdout once a model is done)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _reason(e: BaseException) -> str:
    """The first line of an exception, with its type, for a failed contender's row."""
    return f"{type(e).__name__}: {first_line(e)}"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    cuda = torch.cuda.is_available() and not args.quick
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    rows: list[dict[str, Any]] = []
    # the planner's (empty) cache lives as long as its backend is timed
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += _run_model(args, name, cuda, device, dtype, str(Path(tmp) / f"{name}.sqlite"))
    return rows


def _run_model(
    args: argparse.Namespace, name: str, cuda: bool, device: str, dtype: Any, db: str
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    torch._dynamo.reset()
    # five compiled contenders of one `forward` (prefill and decode graphs each): keep dynamo
    # from giving up on recompiles and running the later contenders eagerly unannounced
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    generators, backends, compile_s, tokens = {}, {}, {}, {}
    failed: dict[str, str] = {}
    for kind in CONTENDERS:
        torch.manual_seed(0)
        m, ids = _build(name, args.quick, args.batch, args.prompt, device, dtype)
        backends[kind] = _contender(kind, m, db)
        extra = {"cache_implementation": "static"} if kind.endswith("+static") else {}

        def gen(m: Any = m, ids: Any = ids, extra: dict[str, Any] = extra, **more: Any) -> Any:
            return m.generate(
                ids,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=0,
                **extra,
                **more,
            )

        _sync(cuda)
        _say(f"{name}: {kind}: first generate (compiles)")
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tokens[kind] = gen(output_scores=True, return_dict_in_generate=True)
            _sync(cuda)
        except Exception as e:  # a contender that cannot generate is reported, not timed
            failed[kind] = _reason(e)
            _say(f"{name}: {kind}: failed after {time.perf_counter() - t0:.1f} s: {failed[kind]}")
            continue
        compile_s[kind] = time.perf_counter() - t0
        _say(f"{name}: {kind}: first generate took {compile_s[kind]:.1f} s")
        if kind == "planner" and not backends[kind].stats.graphs:
            failed[kind] = "the backend was never called (dynamo ran forward eagerly)"
            continue
        generators[kind] = gen
    times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    order = [k for k in CONTENDERS if k in generators]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(args.warmup + args.rounds):
            _say(f"{name}: round {r + 1} of {args.warmup + args.rounds}")
            for k in order[r % len(order) :] + order[: r % len(order)]:
                if k in failed:
                    continue
                _sync(cuda)
                t0 = time.perf_counter()
                try:
                    generators[k]()
                    _sync(cuda)
                except Exception as e:
                    failed[k] = _reason(e)
                    continue
                if r >= args.warmup:
                    times[k].append(time.perf_counter() - t0)
    for k in CONTENDERS:
        if k in failed:
            row = {"model": name, "contender": k, "error": failed[k]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        xs = sorted(times[k])
        med = statistics.median(xs)
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [med, med, med]
        differ, first, margin = (
            _divergence(tokens["eager"], tokens[k], ids_len=args.prompt)
            if "eager" in tokens
            else (None, None, None)
        )
        row = {
            "model": name,
            "contender": k,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "dtype": str(dtype).replace("torch.", ""),
            "torch": torch.__version__,
            "batch": args.batch,
            "prompt": args.prompt,
            "new_tokens": args.new_tokens,
            "median_s": med,
            "spread": (q[2] - q[0]) / med if med else None,
            "rounds": len(xs),
            "first_call_s": compile_s[k],
            "tokens_differ": differ,
            "first_differ_step": first,
            "eager_margin_there": margin,
        }
        be = backends.get(k)
        if be is not None:
            # every field the backend counts; its reason lists cut to their first five
            row["runtime_stats"] = {
                k: v[:5] if isinstance(v, list) else v for k, v in asdict(be.stats).items()
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _differ_cell(r: dict[str, Any]) -> str:
    if r["tokens_differ"] is None:
        return "— (eager failed)"
    if not r["tokens_differ"]:
        return "0"
    return (
        f"{r['tokens_differ']} (step {r['first_differ_step']}; "
        f"margin {r['eager_margin_there']:.3g})"
    )


def render(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# `generate` through the backend",
        "",
        f"Generated by `{command}` (benchmarks/generate.py); do not edit by hand.",
        "",
        "ms per `generate` call (median over interleaved rounds, ±spread = IQR/median); "
        "vs eager: lower is faster; first call includes compiles.",
        "",
        "| model | contender | ms | spread | vs eager | first call s | tokens differ "
        "(first at step; eager's margin there) |",
        "|---|---|---|---|---|---|---|",
    ]
    eager = {r["model"]: r.get("median_s") for r in rows if r["contender"] == "eager"}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['contender']} | failed: {r['error']} | | | | |")
            continue
        ratio = r["median_s"] / eager[r["model"]] if eager.get(r["model"]) else float("nan")
        lines.append(
            f"| {r['model']} | {r['contender']} | {r['median_s'] * 1e3:,.1f} | "
            f"{(r['spread'] or 0) * 100:.0f}% | {ratio:.2f}x | {r['first_call_s']:.1f} | "
            f"{_differ_cell(r)} |"
        )
    for r in rows:
        st = r.get("runtime_stats")
        if not st:
            continue
        line = (
            f"- {r['model']}, {r['contender']}: {st['graphs']} graph(s), {st['realized']} "
            f"realization(s), {st['default']} new shape(s) on the default plan"
        )
        line += f", {st.get('static', 0)} static specialization(s)"
        if st.get("over_budget"):
            line += f", {st['over_budget']} bucket(s) past the compile budget ran dynamo's graph"
        line += "".join(f"; realized per shape: {x}" for x in st.get("per_shape", [])[:2])
        line += "".join(f"; fell back: {x}" for x in st.get("fallbacks", [])[:2])
        line += "".join(f"; plan did not fit: {x}" for x in st.get("unfitted", [])[:2])
        failed = st.get("static_failed", [])
        if failed:
            line += f"; {len(failed)} static specialization(s) not made, first: {failed[0]}"

        lines += ["", line] if not lines[-1].startswith("- ") else [line]
    timed = [r for r in rows if "error" not in r]
    if timed:
        r = timed[0]
        lines += [
            "",
            f"{r['device']}, {r['dtype']}, torch {r['torch']}: batch {r['batch']}, prompt "
            f"{r['prompt']} tokens, {r['new_tokens']} new tokens, greedy.",
        ]
    return "\n".join(lines) + "\n"


def render_jsonl(path: Path) -> str:
    """The report of a committed JSON-lines file (the command its rows recorded)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    command = next((r["command"] for r in rows if r.get("command")), "benchmarks/generate.py")
    return render(rows, command)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="OUT.jsonl and OUT.md are written")
    p.add_argument("--quick", action="store_true", help="tiny float32 models on the CPU")
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds (compiles, static plans)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    command = "python benchmarks/generate.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    rows = [{**r, "command": command} for r in run(args)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.with_suffix(".md").write_text(render(rows, command))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
