"""planner.realize.graph over symbolic sizes: which sizes a group's subgraph takes as inputs.

Tiny synthetic modules exported over a range (planner.ir.capture_dynamic), cut into
groups, and where a test says so compiled by real Inductor (CPU C++ backend).
"""

from __future__ import annotations

import warnings

import torch

from planner.fusion.partition import Partition
from planner.ir.capture_dynamic import export_dynamic
from planner.realize.graph import group_graphs, take_apart
from planner.realize.realizer import RealizeWarning, realize


class _FoldsBatchIntoRows(torch.nn.Module):
    """Folds the batch into the rows of a LayerNorm by a size computed from the input's
    batch size (`B * 4`), after a transpose, as MobileViT unfolds its patches."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x):  # x: [B, 6, 4]
        y = torch.relu(x).transpose(1, 2)
        return self.norm(y.reshape(x.shape[0] * 4, 6))


def _fold_batch():
    """The module exported over B in 2..8, and a partition of relu alone and the rest."""
    torch.manual_seed(0)
    module = _FoldsBatchIntoRows().eval()
    captured = export_dynamic(module, (torch.randn(3, 6, 4),), {0: {0: (2, 8)}})
    targets = [op.target for op in captured.graph.nodes]
    relu = [i for i, t in enumerate(targets) if "relu" in t]
    rest = [i for i in range(len(targets)) if i not in relu]
    return module, captured, Partition.from_groups(captured.graph, [relu, rest])


def test_a_group_reading_a_size_expression_also_takes_its_symbols():
    """The rest group reads `4*s0` (the reshape's rows) and a tensor of size [s0, 4, 6]:
    s0 comes in as a size input of its own, beside the expression."""
    _, captured, part = _fold_batch()
    groups = group_graphs(take_apart(captured, part), part)
    rest = next(gg for gg in groups if any(isinstance(f, torch.SymInt) for f in gg.fakes))
    ints = [f.node.expr for f in rest.fakes if isinstance(f, torch.SymInt)]
    (expr,) = [e for e in ints if not e.is_Symbol]
    assert expr.free_symbols <= {e for e in ints if e.is_Symbol}, ints


def test_a_group_reading_a_size_expression_compiles_again_from_inductors_cache():
    """Inductor's FX graph cache guards a compiled group by its size inputs only: with s0
    bound by no size input, the stored guard named the exported program's input instead
    (`KeyError: 'x'` on the next lookup) and the group ran eagerly. Realized twice, the
    second compile looks the first one up."""
    module, captured, part = _fold_batch()
    with torch._inductor.config.patch(fx_graph_cache=True), warnings.catch_warnings():
        warnings.simplefilter("error", RealizeWarning)
        for _ in range(2):
            r = realize(captured, part)
    assert [g.compiled for g in r.groups] == [False, True], r.describe()
    for b in (2, 5, 8):
        x = torch.randn(b, 6, 4)
        with torch.no_grad():
            torch.testing.assert_close(r(x), module(x))
