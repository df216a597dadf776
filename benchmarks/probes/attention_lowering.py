"""Where a model's attention goes on its way to kernels: the captured ops, the groups of
the plan the backend realizes, and what each attention group runs as.

    PYTHONPATH=. python benchmarks/probes/attention_lowering.py --model vit --shape B=1,IMG=224

Prints, for `export_model`'s capture and for the graph the `torch.compile` backend
realizes (`--cache`'s plan, else the default plan of an empty cache), the
attention-related ops (any op whose name holds attention, softmax, bmm or matmul) and,
per realized group holding one, its realization, its note and its ops; the attention
calls eager and each realized plan dispatch, with their masks and the kernel the
dispatcher picks for them (`eager_dispatched`, `plan_dispatched`); what the planner's
attention operator passes on to the library call (`plan_sdpa_calls`: shapes, strides,
the dispatcher's choice); and the device kernels of one call under torch.profiler whose
names hold gemm/sdpa/softmax/attention/fmha/flash/nvjet. JSON lines to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.models import BY_NAME  # noqa: E402
from planner.ir.capture import export_model  # noqa: E402
from planner.runtime.backend import fusion_planner_backend  # noqa: E402
from zoo.modelspec import parse_dtype, resolve  # noqa: E402

WORDS = ("attention", "softmax", "bmm", "matmul")
BACKENDS = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
KERNEL_WORDS = ("gemm", "sdpa", "softmax", "attention", "fmha", "flash", "nvjet")


class _Ops(TorchDispatchMode):
    """Counts the attention-related aten ops dispatched while active."""

    def __init__(self):
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if any(w in name for w in (*WORDS, "mm", "fusion_planner")):
            extra = ""
            if func is torch.ops.aten.scaled_dot_product_attention.default:
                mask = args[3] if len(args) > 3 else kwargs.get("attn_mask") if kwargs else None
                if isinstance(mask, torch.Tensor):
                    extra += f" mask={mask.dtype}{tuple(mask.shape)}"
                try:  # the kernel the dispatcher picks for these very tensors
                    choice = torch._fused_sdp_choice(*args, **(kwargs or {}))
                    extra += f" choice={BACKENDS.get(int(choice), choice)}"
                except Exception as e:
                    extra += f" choice=? ({type(e).__name__})"
            self.seen[name + extra] += 1
        return func(*args, **(kwargs or {}))


def _describe(args: tuple, kwargs: dict) -> dict:
    """Shapes, dtypes and strides of an attention call's tensors, its other arguments, and
    the kernel the dispatcher picks for them."""
    out: dict = {"kwargs": {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            out[f"arg{i}"] = [list(a.shape), str(a.dtype), list(a.stride()), a.storage_offset()]
        else:
            out[f"arg{i}"] = repr(a)
    try:
        out["choice"] = BACKENDS.get(int(torch._fused_sdp_choice(*args, **kwargs)), "?")
    except Exception as e:
        out["choice"] = f"? ({type(e).__name__}: {e})"[:200]
    return out


def _attention_ops(ops: list[str]) -> dict[str, int]:
    return dict(Counter(o for o in ops if any(w in o for w in WORDS)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit", help="a suite model name (benchmarks/models)")
    p.add_argument("--shape", default="B=1,IMG=224")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out", default=None, help="JSON lines file to append to")
    p.add_argument("--tiny", action="store_true", help="the CPU tests' config")
    p.add_argument("--cache", default=None, help="a plan cache `fusion-plan tune` filled")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    spec = resolve(BY_NAME[args.model].spec(tiny=args.tiny), shape)
    module, inputs = spec.build(dtype=parse_dtype(args.dtype), device=device, seed=0)
    row: dict = {
        "model": args.model,
        "shape": shape,
        "device": str(device),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        row["gpu"] = torch.cuda.get_device_name(device)
    with torch.inference_mode():
        c = export_model(module, inputs)
    row["export_ops"] = _attention_ops([n.op for n in c.graph.nodes])
    realized: list = []
    with tempfile.TemporaryDirectory() as tmp:
        db = args.cache or str(Path(tmp) / "empty.sqlite")
        backend = fusion_planner_backend(db, device=device)
        base = backend.realizer

        def recording(captured, plan, **options):
            rp = base(captured, plan, **options)
            realized.append(rp)
            return rp

        backend.realizer = recording
        torch._dynamo.reset()
        fn = torch.compile(module, backend=backend)
        with torch.inference_mode():
            for _ in range(3):
                fn(*inputs)
        groups = []
        for rp in realized:
            ops = [n.op for n in rp.captured.graph.nodes]
            row.setdefault("backend_ops", []).append(_attention_ops(ops))
            for g, report in enumerate(rp.groups):
                members = [ops[i] for i in rp.partition.groups[g]]
                if any(any(w in o for w in WORDS) for o in members):
                    groups.append(
                        {
                            "group": g,
                            "realization": rp.realizations[g],
                            "note": report.note,
                            "ops": members,
                            "module_ops": sorted(
                                {
                                    str(n.target)
                                    for n in rp.modules[g].graph.nodes
                                    if n.op == "call_function"
                                }
                            ),
                        }
                    )
        row["attention_groups"] = groups
        # which attention kernels run, seen at the dispatcher: eager's call, and each realized
        # plan run once without its CUDA graphs (Inductor's wrapper code dispatches too)
        with torch.inference_mode():
            with _Ops() as ops:
                module(*inputs)
            row["eager_dispatched"] = dict(ops.seen)
            row["plan_dispatched"] = []
            sdpa = torch.nn.functional.scaled_dot_product_attention
            calls: list = []

            def recording_sdpa(*a, **k):  # what the planner's attention operator passes on
                calls.append(_describe(a, k))
                return sdpa(*a, **k)

            for rp in realized:
                graph, shapes = rp._graph, rp._shape_graphs
                rp._graph = rp._shape_graphs = None
                torch.nn.functional.scaled_dot_product_attention = recording_sdpa
                try:
                    with _Ops() as ops:
                        rp(*rp.captured.example_inputs)
                    row["plan_dispatched"].append(dict(ops.seen))
                    row.setdefault("plan_sdpa_calls", []).append(calls[:4])
                except Exception as e:  # the probe reports, it does not fail
                    row["plan_dispatched"].append({"error": f"{type(e).__name__}: {e}"[:300]})
                finally:
                    rp._graph, rp._shape_graphs = graph, shapes
                    torch.nn.functional.scaled_dot_product_attention = sdpa
        if device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn(*inputs)
                torch.cuda.synchronize()
            kernels = Counter()
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and any(
                    w in e.name.lower() for w in KERNEL_WORDS
                ):
                    kernels[e.name[:140]] += 1
            row["kernels"] = dict(kernels)
    print(json.dumps(row, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
