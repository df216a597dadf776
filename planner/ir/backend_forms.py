"""Op outputs whose shape depends on the backend that traced them, recorded in one form.

Inference batch norm returns its saved statistics (mean and inverse standard deviation)
as per-channel vectors in the computation dtype (float32 for half and bfloat16 inputs) on
CUDA and on the meta device, and as empty tensors in the input dtype on the CPU. Nothing
reads them in inference. Capture records them in the per-channel form whatever device
traced the model (`canonical_values`), so a graph, its key and its byte counts do not
depend on the machine that captured it.

Captures made on a CPU before that rule recorded the empty form, and profile rows collected
there carry the keys of that form. `former_keys(graph)` gives those keys for a graph
captured today, with nothing else changed, so a stored row can be matched to today's
graph by an exact key (docs/capture.md, "Batch norm's statistics").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from planner.ir.graph import OpGraph, OpNode

_ALWAYS_INFERENCE = ("_native_batch_norm_legit_no_training", "_batch_norm_no_update")
_INFERENCE_IF_NOT_TRAINING = ("native_batch_norm", "_native_batch_norm_legit")
_STATISTICS = (1, 2)  # output positions of the saved mean and inverse std
_HALF = (torch.float16, torch.bfloat16)


def is_inference_batch_norm(op: str, attrs: dict[str, Any]) -> bool:
    """Whether an op (its overload packet) is a batch norm that only normalizes."""
    if op in _ALWAYS_INFERENCE:
        return True
    return op in _INFERENCE_IF_NOT_TRAINING and attrs.get("training") is False


def canonical_values(
    op: str, attrs: dict[str, Any], vals: Sequence[Any], first_input: torch.Tensor | None
) -> list[Any]:
    """`vals` (an op's traced outputs) with backend-dependent outputs in the per-channel form.

    Only inference batch norm's statistics are rewritten, and only where the backend gave
    the empty form; the others come back as they are."""
    out = list(vals)
    if not is_inference_batch_norm(op, attrs) or first_input is None or first_input.dim() < 2:
        return out
    channels = int(first_input.shape[1])
    dtype = torch.float32 if first_input.dtype in _HALF else first_input.dtype
    for j in _STATISTICS:
        v = out[j] if j < len(out) else None
        if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == 0:
            out[j] = torch.empty((channels,), dtype=dtype, device="meta")
    return out


def former_keys(graph: OpGraph) -> tuple[str, ...]:
    """Keys `graph` had under earlier captures that differ from today's only in
    backend-dependent outputs: the CPU's empty batch-norm statistics in the input dtype.
    Empty when the graph has no such output."""
    tensors = list(graph.tensors)
    changed = False
    for n in graph.nodes:
        if not _statistics_of(n):
            continue
        dtype = graph.tensors[n.inputs[0]].dtype
        for j in _STATISTICS:
            tid = n.outputs[j]
            tensors[tid] = replace(tensors[tid], shape=(0,), dtype=dtype)
            changed = True
    if not changed:
        return ()
    old = OpGraph.build(graph.nodes, tensors, graph.outputs, name=graph.name, meta=dict(graph.meta))
    return (old.key,) if old.key != graph.key else ()


def _statistics_of(n: OpNode) -> bool:
    return (
        is_inference_batch_norm(n.op, dict(n.attrs))
        and bool(n.inputs)
        and len(n.outputs) > max(_STATISTICS)
    )
