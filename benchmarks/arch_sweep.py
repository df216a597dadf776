"""`transformers` architectures outside the real-model suite, each taken through the user's
path on this machine's CPU (fp32): `fusion-plan tune`, then the model served by
`torch.compile(model, backend=fusion_planner_backend(cache), dynamic=True)`.

    PYTHONPATH=. python benchmarks/arch_sweep.py                   # every cell
    PYTHONPATH=. python benchmarks/arch_sweep.py --cells bloom,opt # some (fnmatch patterns)
    PYTHONPATH=. python benchmarks/arch_sweep.py --quick           # QUICK's cells
    python benchmarks/arch_sweep.py --render                       # the table from the rows
    PYTHONPATH=. python benchmarks/arch_sweep.py --device cuda --out benchmarks/results/arch_sweep_h200

On a GPU (`--device cuda`) `tune` tunes in bf16 (its default there) and the model is served
in bf16; the gradient check runs in fp32 on the same device.

The models are the factories of `benchmarks/arch_sweep_models.py` (tiny configs, nothing
downloaded). Per cell, each step in its own process, as a user would run it:

1. `fusion-plan tune --model benchmarks/arch_sweep_models.py:<cell> --shape ... --dynamic
   ... --strategy priority --top-k 1 --budget-seconds 5 --threads 1 --no-compile-baseline`
   into a fresh SQLite cache over one power-of-two bucket (text: S 9..16; images: IMG
   33..64, or B 3..4 for models with position embeddings for one image size; audio: N
   257..512 samples). Recorded:
   exit status, the last line it printed on stderr, whether it printed a traceback.
2. served (`--serve`): the model built once, compiled with the planner backend on that
   cache; at the tuned (representative) shape and one other shape of the bucket its output
   leaves are compared with eager's by the project's accuracy rule
   (`planner.realize.check.compare_outputs`, eager run in fp64 as the reference). Then in
   grad mode (eval mode, parameters and floating inputs requiring grad) a fresh compile's
   parameter and input gradients of a fixed weighted sum of the outputs are compared with
   eager's; a graph the backend declines with a warning (docs/runtime.md, "Gradients") and
   whose gradients then agree counts as correct. Recorded: the backend's stats (plan hits,
   graph-level fallbacks), warnings, tracebacks.

A traceback printed by either step fails the cell: bad input and faults must give a clear
message or a safe fallback. Rows go to `benchmarks/results/arch_sweep_cpu.jsonl` (a cell
run again replaces its row); `arch_sweep_cpu.md` is rendered from all rows after each run.
Progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = "benchmarks/arch_sweep_models.py"
OUT = ROOT / "benchmarks" / "results" / "arch_sweep_cpu"
TUNE_TIMEOUT_S = 300
SERVE_TIMEOUT_S = 300

TEXT = ("B=2", "S=9..16", {"S": 16}, {"S": 11})
IMAGE = ("B=2", "IMG=33..64", {"IMG": 64}, {"IMG": 48})
FIXED_IMAGE = ("IMG=32", "B=3..4", {"B": 4}, {"B": 3})
AUDIO = ("B=2", "N=257..512", {"N": 512}, {"N": 300})
# cell -> (fixed shape, dynamic range, tuned shape, other shape of the bucket)
CELLS = {
    "opt": TEXT,
    "longformer": TEXT,
    "bloom": TEXT,
    "falcon": TEXT,
    "qwen2": TEXT,
    "phi": TEXT,
    "gemma": TEXT,
    "gemma2": TEXT,
    "gptj": TEXT,
    "gpt_neo": TEXT,
    "codegen": TEXT,
    "stablelm": TEXT,
    "mistral": TEXT,
    "gpt_neox": TEXT,
    "gpt_bigcode": TEXT,
    "mixtral": TEXT,
    "qwen2_moe": TEXT,
    "mamba": TEXT,
    "roberta": TEXT,
    "distilbert": TEXT,
    "albert": TEXT,
    "electra": TEXT,
    "deberta_v2": TEXT,
    "mobilebert": TEXT,
    "clip_text": TEXT,
    "bart": TEXT,
    "whisper": TEXT,
    "t5": TEXT,
    "deit": FIXED_IMAGE,
    "beit": FIXED_IMAGE,
    "clip_vision": FIXED_IMAGE,
    "dinov2": FIXED_IMAGE,
    "segformer": IMAGE,
    "resnet": IMAGE,
    "mobilevit": FIXED_IMAGE,
    "convnext": IMAGE,
    "swin": IMAGE,
    "wav2vec2": AUDIO,
}
QUICK = ("bloom", "distilbert", "bart", "resnet")


def log(msg: str) -> None:
    print(f"[arch_sweep {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _shape_params(fixed: str, shape: dict[str, int]) -> dict[str, int]:
    k, _, v = fixed.partition("=")
    return {k: int(v), **shape}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _python(args: list[str], timeout_s: int) -> tuple[int, str, str, float]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "default"}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, str(e.stdout or ""), f"{e.stderr or ''}\ntimed out after {timeout_s} s"
    return rc, out, err, time.perf_counter() - t0


# --- one cell ---------------------------------------------------------------------------


def run_cell(name: str, device: str = "cpu") -> dict:
    fixed, dynamic, _, _ = CELLS[name]
    row: dict = {"cell": name, "shape": fixed, "dynamic": dynamic, "device": device}
    with tempfile.TemporaryDirectory(prefix="arch_sweep_") as tmp:
        cache = str(Path(tmp) / "plans.sqlite")
        cmd = ["-m", "cli.main", "tune", "--model", f"{MODELS}:{name}", "--shape", fixed]
        cmd += ["--dynamic", dynamic, "--strategy", "priority", "--top-k", "1", "--cache", cache]
        cmd += ["--budget-seconds", "5", "--threads", "1", "--no-compile-baseline", "-q"]
        log(f"{name}: tune {fixed} {dynamic}")
        rc, out, err, secs = _python(cmd, TUNE_TIMEOUT_S)
        row.update(
            tune_rc=rc,
            tune_error=(_last_line(err) or _last_line(out)) if rc else "",
            tune_traceback="Traceback (most recent call last)" in out + err,
            tune_s=round(secs, 1),
        )
        log(f"{name}: tune rc={rc} in {secs:.0f} s {row['tune_error']}")
        serve = [__file__, "--serve", name, "--cache", cache, "--device", device]
        rc, out, err, secs = _python(serve, SERVE_TIMEOUT_S)
        result = next((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), None)
        if result is None:
            result = {"served_ok": False, "served": f"serve rc={rc}: {_last_line(err)}"}
            result["grad_ok"] = False
        row.update(result)
        row["serve_traceback"] = "Traceback (most recent call last)" in err
        row["serve_s"] = round(secs, 1)
        log(f"{name}: served {row['served_ok']} grads {row['grad_ok']} in {secs:.0f} s")
    row["ok"] = (
        row["tune_rc"] == 0
        and not row["tune_traceback"]
        and not row["serve_traceback"]
        and row["served_ok"]
        and row["grad_ok"]
    )
    return row


# --- serving (its own process) ----------------------------------------------------------


def _call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _leaves(out) -> list:
    import torch

    from planner.ir.pytrees import Structure

    _, leaves = Structure.of(out)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _check_served(compiled, model, inputs) -> str:
    """'' when the served call agrees with eager by the project's rule, else why not."""
    import torch

    from planner.realize.check import compare_outputs, model_dtype
    from planner.realize.reference import run_module_in_high_precision

    class Call(torch.nn.Module):
        """The model called with `inputs` rebuilt from positional tensors."""

        def __init__(self, m, keys):
            super().__init__()
            self.m, self.keys = m, keys

        def forward(self, *args):
            return self.m(**dict(zip(self.keys, args))) if self.keys else self.m(*args)

    keys = list(inputs) if isinstance(inputs, dict) else None
    args = tuple(inputs.values()) if keys else tuple(inputs)
    with torch.no_grad():
        want = _call(model, inputs)
        got = _call(compiled, inputs)
    dtype = model_dtype(model, args)
    high = run_module_in_high_precision(Call(model, keys), args, dtype)
    mismatch = compare_outputs(want, got, dtype, high=high.values)
    return "" if mismatch is None else str(mismatch)


def _grads(model, inputs, fn, seed: int = 1):
    """Gradients of a fixed weighted sum of `fn`'s floating outputs w.r.t. the model's
    parameters and the floating inputs."""
    import torch

    leaves_in = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    floats = [x for x in leaves_in if x.is_floating_point()]
    for x in floats:
        x.grad = None
        x.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out = [x for x in _leaves(_call(fn, inputs)) if x.is_floating_point() and x.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    loss = sum((x * torch.randn(x.shape, generator=gen).to(x)).sum() for x in out)
    if not out:
        return None
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({f"input{i}": x.grad.clone() for i, x in enumerate(floats)})
    for x in floats:
        x.requires_grad_(False)
    return grads


def _compare_grads(got, want) -> str:
    import torch

    if want is None:
        return "no output carries a gradient in eager"
    if got is None:
        return "no served output carries a gradient"
    missing = sorted(set(want) - set(got))
    if missing:
        return f"{len(missing)} gradients missing, e.g. {missing[0]}"
    # Each tensor to 1e-4 of its own largest gradient, and none held tighter than 1e-7 of
    # the largest gradient of the model: a gradient that is zero in exact arithmetic (a
    # key projection's bias under softmax) is rounding noise in both, at any scale.
    floor = 1e-7 * max((w.abs().max().item() for w in want.values()), default=0.0)
    for k, w in want.items():
        g = got[k]
        scale = w.abs().max().item() or 1.0
        if not torch.allclose(g, w, rtol=1e-3, atol=max(1e-4 * scale, floor)):
            return f"gradient of {k} differs: max abs {(g - w).abs().max().item():.3g}"
    return ""


def _moved(inputs, device: str, dtype):
    """`inputs` (a tuple or a dict of tensors) on `device`, floating ones in `dtype`."""

    def move(x):
        return x.to(device, dtype) if x.is_floating_point() else x.to(device)

    if isinstance(inputs, dict):
        return {k: move(v) for k, v in inputs.items()}
    return tuple(move(x) for x in inputs)


def serve(name: str, cache_url: str, device: str = "cpu") -> dict:
    """The served checks of one cell. On CUDA the model is served in bf16, as `tune` tuned
    it there; its gradients are checked in fp32 (on the same device, plans looked up for
    fp32), where the fp32 tolerance of `_compare_grads` holds."""
    import torch

    import benchmarks.arch_sweep_models as M
    from planner.runtime.backend import fusion_planner_backend

    torch.set_num_threads(1)
    fixed, _, tuned, other = CELLS[name]
    factory = getattr(M, name)
    torch.manual_seed(0)
    model, _ = factory(**_shape_params(fixed, tuned))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model.to(device, dtype)
    shapes = [tuned, other]
    inputs = []
    for s in shapes:
        torch.manual_seed(1)
        inputs.append(_moved(factory(**_shape_params(fixed, s))[1], device, dtype))
    res: dict = {}
    backend = fusion_planner_backend(cache_url)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    problems = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s, inp in zip(shapes, inputs):
            try:
                why = _check_served(compiled, model, inp)
            except Exception as e:
                why = f"raised {type(e).__name__}: {str(e)[:200]}"
            if why:
                problems.append(f"{s}: {why}")
    st = backend.stats
    res["served_ok"] = not problems
    res["served"] = "; ".join(problems)
    res["hits"] = {"exact": st.exact, "bucket": st.bucket, "default": st.default}
    res["realized"] = st.realized
    res["fallbacks"] = [f[:200] for f in st.fallbacks + st.unfitted]
    res["warnings"] = sorted(
        {
            str(w.message)[:200]
            for w in caught
            if "planner" in str(w.category).lower() or "fusion" in str(w.message).lower()
        }
    )

    torch._dynamo.reset()
    if dtype != torch.float32:
        model = model.float()
        inputs = [_moved(x, device, torch.float32) for x in inputs]
    gbackend = fusion_planner_backend(cache_url)
    gcompiled = torch.compile(model, backend=gbackend, dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            want = _grads(model, inputs[0], model)
            got = _grads(model, inputs[0], gcompiled)
            why = _compare_grads(got, want)
        except Exception as e:
            why = f"raised {type(e).__name__}: {str(e)[:200]}"
    gs = gbackend.stats
    res["grad_ok"] = not why
    res["grad"] = why
    res["grad_mode"] = "declined" if gs.declined else ("served" if gs.grad_graphs else "-")
    res["grad_warnings"] = sorted(
        {str(w.message)[:200] for w in caught if "fusion-planner" in str(w.message)}
    )
    return res


# --- the table --------------------------------------------------------------------------


def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render(rows: list[dict], name: str = OUT.name) -> str:
    head = (
        "| cell | tune ok | served ok | grads ok | plans hit (exact/bucket/default) | "
        "grad mode | tune s | serve s | what went wrong |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        tune_ok = r["tune_rc"] == 0 and not r["tune_traceback"]
        h = r.get("hits", {})
        hits = "/".join(str(h.get(k, "-")) for k in ("exact", "bucket", "default"))
        notes = []
        if r["tune_rc"]:
            notes.append(f"tune rc {r['tune_rc']}: {r['tune_error']}")
        if r["tune_traceback"]:
            notes.append("tune printed a traceback")
        if r.get("serve_traceback"):
            notes.append("serving printed a traceback")
        for key in ("served", "grad"):
            if r.get(key):
                notes.append(f"{key}: {r[key]}")
        if r.get("fallbacks"):
            notes.append(f"fallbacks: {r['fallbacks'][0]}")
        for w in r.get("warnings", [])[:2] + r.get("grad_warnings", [])[:1]:
            notes.append(f"warned: {w}")
        why = "; ".join(notes).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {r['cell']} | {_mark(tune_ok)} | {_mark(r['served_ok'])} | "
            f"{_mark(r['grad_ok'])} | {hits} | {r.get('grad_mode', '-')} | {r['tune_s']} | "
            f"{r.get('serve_s', '-')} | {why} |"
        )
    ok = sum(r["ok"] for r in rows)
    where = sorted({r.get("device", "cpu") for r in rows}) or ["cpu"]
    how = "; ".join(
        "CPU, fp32" if d == "cpu" else f"{d}, served in bf16 as tuned, gradients in fp32"
        for d in where
    )
    top = (
        f"# Architecture sweep ({how})\n\n"
        f"Generated by `benchmarks/arch_sweep.py` from `{name}.jsonl`; do not edit.\n"
        f"{ok} of {len(rows)} cells pass every check.\n\n"
    )
    return top + head + "\n".join(lines) + "\n"


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = {}
    for ln in path.read_text().splitlines():
        if ln.strip():
            r = json.loads(ln)
            rows[r["cell"]] = r
    order = list(CELLS)
    return sorted(rows.values(), key=lambda r: order.index(r["cell"]) if r["cell"] in order else 99)


def write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.with_suffix(".md").write_text(render(rows, out.name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", help="comma-separated fnmatch patterns of cell names")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--render", action="store_true", help="only render the table from jsonl")
    ap.add_argument("--out", type=Path, default=OUT, help="output path without suffix")
    ap.add_argument("--serve", metavar="CELL", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to tune and serve (cuda: bf16, as `tune` defaults to on a GPU)",
    )
    ap.add_argument(
        "--time-limit-s", type=float, help="start no cell once this many seconds have passed"
    )
    args = ap.parse_args(argv)
    if args.serve:
        print(json.dumps(serve(args.serve, args.cache, args.device)), flush=True)
        return 0
    rows = read_rows(args.out.with_suffix(".jsonl"))
    if not args.render:
        names = list(QUICK) if args.quick else list(CELLS)
        if args.cells:
            pats = args.cells.split(",")
            names = [n for n in CELLS if any(fnmatch.fnmatch(n, p) for p in pats)]
        t0 = time.monotonic()
        for name in names:
            if args.time_limit_s is not None and time.monotonic() - t0 > args.time_limit_s:
                log(f"time limit reached: {name} and later cells not run")
                break
            row = run_cell(name, args.device)
            rows = [r for r in rows if r["cell"] != name] + [row]
            rows.sort(key=lambda r: list(CELLS).index(r["cell"]) if r["cell"] in CELLS else 99)
            write(rows, args.out)
    write(rows, args.out)
    sys.stdout.write(render(rows, args.out.name))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
