"""Which reference a realized plan of each real model is checked against on this device,
and the attention ops its program holds (a probe: prints, writes nothing).

    python benchmarks/probes/reference_diag.py [cuda|cpu] [tiny]
"""

import sys

import torch

from planner.fusion.fuse_rules import default_partition
from planner.realize.realizer import realize
from planner.runtime.graph import capture_for_serving
from zoo.modelspec import resolve

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
tiny = len(sys.argv) > 2 and sys.argv[2] == "tiny"
for name in ("gpt2", "llama", "bert", "t5"):
    spec = f"benchmarks/models/{name}.py:{'tiny' if tiny else 'factory'}"
    shape = {"B": 2, "S": 32} if tiny else {"B": 1, "S": 128}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    m, inputs = resolve(spec, shape).build(dtype=dtype, device=device)
    cap = capture_for_serving(m, inputs)
    rp = realize(cap, default_partition(cap.graph))
    ops = sorted(
        {
            str(n.target)
            for n in cap.program.graph.nodes
            if n.op == "call_function" and "attention" in str(n.target)
        }
    )
    print(f"{name}: {rp.reference}; attention ops {ops}", flush=True)
