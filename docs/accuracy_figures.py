"""The two measured tables of docs/accuracy.md, computed (CPU, seeded, seconds).

    PYTHONPATH=. python docs/accuracy_figures.py        # print both tables

The models, the "fused numerics" compiler and the wrong kernels are tests/test_accuracy.py's
(a LLaMA-style decoder and GPT-2 from `transformers` configs, bf16, seeded weights and
token ids). benchmarks/generated.py puts the tables into docs/accuracy.md and
tests/test_generated.py checks them.
"""

from __future__ import annotations

import re
import warnings

import torch

from planner.realize.check import (
    FLOOR_ULPS,
    LOW_PRECISION_MULTIPLIER,
    compare_outputs,
    fresh_inputs,
)
from planner.realize.realizer import realize
from tests.test_accuracy import (
    chunks,
    eager,
    first,
    fused_numerics,
    gpt2_bf16,
    llama_bf16,
    wrong_at,
)

DRAWS = 3


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


def draws_table() -> str:
    """A correct bf16 LLaMA plan on fresh token ids: its RMS error and eager's against the
    fp64 reference, the bound the reference rule allows, and the fixed bf16 table's verdict."""
    module, inputs, c = llama_bf16()
    r = realize(c, chunks(c.graph), realizations="inductor", compiler=fused_numerics)
    gen = torch.Generator().manual_seed(1)
    lines = [
        "| | plan rms err | eager rms err | allowed | previous fixed rule "
        "(bf16: rtol = atol = 0.05) |",
        "|---|---|---|---|---|",
    ]
    for i in range(DRAWS):
        ids = fresh_inputs(inputs, gen)
        want, got = eager(module, ids), r(*ids)
        (high,) = r.high_reference(ids).values
        plan_err, eager_err = _rms(got.double() - high), _rms(want.double() - high)
        floor = FLOOR_ULPS * torch.finfo(torch.bfloat16).eps * _rms(high)
        allowed = LOW_PRECISION_MULTIPLIER * eager_err + floor
        old = compare_outputs([want], [got], torch.bfloat16)
        verdict = (
            "accepted"
            if old is None
            else f"rejected: max abs err {old.max_abs_err:.3f}, {old.bad_fraction:.2%} of elements"
        )
        lines.append(f"| draw {i} | {plan_err:.4f} | {eager_err:.4f} | {allowed:.4f} | {verdict} |")
    return "\n".join(lines) + "\n"


WRONG = (
    (
        "attention scale doubled (LLaMA)",
        "llama",
        "aten.scaled_dot_product_attention.default",
        "scale",
    ),
    (
        "attention keys and values swapped (LLaMA)",
        "llama",
        "aten.scaled_dot_product_attention.default",
        "swap",
    ),
    (
        "bias dropped from `addmm` (GPT-2, biases at std 0.05)",
        "gpt2",
        "aten.addmm.default",
        "drop_bias",
    ),
)


def wrong_kernels_table() -> str:
    """One wrong group per plan: the RMS error the group check measured and its bound,
    from the reason its fallback carries."""
    lines = ["| wrong kernel (one group) | group rms err | allowed |", "|---|---|---|"]
    for title, model, target, how in WRONG:
        _module, _inputs, c = llama_bf16(layers=2) if model == "llama" else gpt2_bf16()
        name = first(c.graph, target)
        p = chunks(c.graph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = realize(c, p, realizations="inductor", compiler=wrong_at(name, how))
        reason = r.fallbacks[p.group_of[c.graph.node_by_name(name).index]]
        m = re.search(r"rms err (\S+) vs .*= (\S+?)\)?$", reason)
        if m is None:
            raise ValueError(f"unexpected fallback reason: {reason!r}")
        lines.append(f"| {title} | {float(m.group(1)):.3g} | {float(m.group(2)):.2g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(draws_table())
    print(wrong_kernels_table())
