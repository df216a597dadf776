"""Fake measurement rows for the learned-cost unit tests (fakes are fine inside one layer).

Groups and descriptors are real (zoo graphs captured on the meta device); only the
"measured" latency is made up: analytical x a known, feature-dependent factor x noise, so a
test can check that a model recovers a correction it could not have been told.
"""

from __future__ import annotations

import json
import math
import random
from functools import cache
from typing import Any

import torch

from learned_cost.features import analytical_parts
from planner.features import group_descriptor
from planner.hardware import get_spec
from planner.ir.capture import capture
from planner.ir.graph import OpGraph
from zoo import modelspec

# (model, shape) pairs: small shapes so capture stays fast.
GRAPHS = (
    ("zoo:transformer-block", "B=2,S=64,D=128,H=4"),
    ("zoo:transformer-block", "B=4,S=128,D=256,H=4"),
    ("zoo:gpt2-block", "B=2,S=64,D=128,H=4"),
    ("zoo:llama-block", "B=1,S=64,D=128,H=4,MAXS=128"),
    ("zoo:mlp", "B=32,D=256,HID=512,L=2"),
    ("zoo:pointwise-chain", "N=65536,STEPS=6"),
    ("zoo:resnet-bottleneck", "B=2,C=64,HW=16"),
)


@cache
def graph(model: str, shape: str, dtype: str = "float32") -> OpGraph:
    m, i = modelspec.resolve(model, shape).build(dtype=modelspec.parse_dtype(dtype), device="meta")
    return capture(m, i)


def true_log_factor(desc: dict[str, Any]) -> float:
    """The made-up correction a model should learn: small groups and transcendentals are slow."""
    small = 1.0 if desc["log2_max_out_numel"] < 15 else 0.0
    trans = 0.6 if any(o in desc["ops"] for o in ("gelu", "softmax", "sigmoid", "silu")) else 0.0
    return 0.4 + 0.9 * small + trans + 0.15 * math.log1p(desc["n_work_ops"])


def fake_rows(
    n_per_graph: int = 30,
    device: str = "h100",
    dtype: str = "float32",
    seed: int = 0,
    noise: float = 0.05,
    with_plans: bool = True,
    graphs: tuple[tuple[str, str], ...] = GRAPHS,
) -> list[dict[str, Any]]:
    """Dataset-v1-shaped rows: group rows (random contiguous node ranges) and plan rows."""
    rng = random.Random(seed)
    spec = get_spec(device)
    rows: list[dict[str, Any]] = []
    for model, shape in graphs:
        g = graph(model, shape, dtype)
        family = model.removeprefix("zoo:")
        base = {
            "model": model,
            "family": family,
            "shape": shape,
            "graph_key": g.key,
            "structure_key": g.structure_key,
            "dtype": dtype,
            "device": device,
            "device_fingerprint": f"fake-{device}",
            "torch_version": torch.__version__.split("+")[0],
            "ok": True,
            "error": "",
            "realization": "inductor",
            "strategy": "",
        }

        def measured(nodes: list[int], g: OpGraph = g) -> tuple[dict[str, Any], float, float]:
            desc = group_descriptor(g, nodes)
            an = analytical_parts(desc, spec, dtype).latency_s
            m = an * math.exp(true_log_factor(desc) + rng.gauss(0.0, noise))
            return desc, an, m

        for _ in range(n_per_graph):
            k = rng.randint(1, min(6, len(g.nodes)))
            start = rng.randint(0, len(g.nodes) - k)
            nodes = list(range(start, start + k))
            desc, an, m = measured(nodes)
            if an <= 0:
                continue
            row = {**base, "kind": "group", "nodes": json.dumps(nodes), "n_groups": 1}
            row.update({f"desc_{k}": v for k, v in desc.items()})
            row.update(
                key=f"{g.key}-{nodes}-{dtype}",
                analytical_s=an,
                measured_median_s=m,
            )
            rows.append(row)
        if not with_plans:
            continue
        n = len(g.nodes)
        for p in range(3):  # singletons, chunks of 3, chunks of 6
            size = (1, 3, 6)[p]
            groups = [list(range(s, min(s + size, n))) for s in range(0, n, size)]
            total = sum(measured(gr)[2] for gr in groups)
            rows.append(
                {
                    **base,
                    "kind": "plan",
                    "nodes": json.dumps(groups),
                    "n_groups": len(groups),
                    "strategy": f"chunks{size}",
                    "key": f"{g.key}-plan{size}-{dtype}",
                    "measured_median_s": total,
                }
            )
    return rows
