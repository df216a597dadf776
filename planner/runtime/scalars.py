"""Python floats of the user's model as constants of dynamo's graph, not per-call inputs.

With `dynamic=True`, dynamo passes the model's Python floats (a LayerNorm's `eps`, an
attention's scale, a dropout's `p`) into its graph as 0-d tensor inputs: every call then
wraps each float in a tensor (`torch.as_tensor`), checks it in a guard and reads it back
with `.item()` inside the graph. A 4-layer Hugging Face GPT-2 has 25 such floats, tens of
microseconds of host time per call. Inductor avoids this: AOT autograd's scalar pass names
the floats it cannot turn into tensor math, and dynamo restarts its analysis with them
specialized (a constant guard, checked in C++). `float_restart` does the same for a graph
this backend receives: it names the floats whose only use is `.item()` (those dynamo's
restart can specialize) and returns the exception that makes dynamo trace again with them
as constants. A model whose float changes later recompiles, as it does under Inductor.

Both rely on dynamo internals (`TensorifyState`, `TensorifyScalarRestartAnalysis`); where
they are missing, nothing is specialized and the graph is served as it came.
"""

from __future__ import annotations

import logging

import torch.fx as fx

log = logging.getLogger(__name__)


def _float_symbol(node: fx.Node) -> str | None:
    """The symbol of a placeholder dynamo made from a Python float, when every use of it
    is `.item()` (the ones dynamo's restart turns into constants); else None."""
    if node.op != "placeholder":
        return None
    value = node.meta.get("example_value")
    memo = getattr(value, "item_memo", None)
    if memo is None:
        return None
    expr = getattr(getattr(memo, "node", None), "_expr", None)
    name = getattr(expr, "name", None)
    if not isinstance(name, str) or not name.startswith("zf"):
        return None
    if not node.users or not all(u.target == "item" for u in node.users):
        return None
    return name


def float_restart(gm: fx.GraphModule) -> Exception | None:
    """Mark the graph's float inputs for specialization and return the exception that
    makes dynamo trace the frame again with them as constants (what Inductor raises for
    the same purpose); None when no float is newly marked, or when this torch has
    neither piece (the graph is then served as it came)."""
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState
    except ImportError:
        return None
    names = [n for n in (_float_symbol(node) for node in gm.graph.nodes) if n is not None]
    new = [n for n in names if not TensorifyState.should_specialize(n)]
    if not new:
        return None
    for n in new:
        TensorifyState.specialize(n)
    log.info("specializing %d float input(s) of dynamo's graph: %s", len(new), new)
    return TensorifyScalarRestartAnalysis()
