"""The roofline of a group as `planner.realize.realizer` runs it, not as an ideal fused kernel.

The analytical model (docs/formulas.md §9) charges a group its boundary bytes only: everything
inside stays on chip. That holds for what Inductor generates itself (pointwise and
reduction chains), for SDPA (the score matrix never leaves the chip) and for one GEMM on
concatenated weights. It does not hold around a GEMM or a convolution: Inductor calls the
vendor library for those (cuBLAS, cuDNN, oneDNN) and fuses what follows into a *separate*
kernel that reads the GEMM's output back from memory, bias and, on CUDA in half
precision, a following GELU excepted (the GEMM's own epilogue: planner.realize.kernels).
On the H100 that made the planner prefer {O-projection GEMM, residual add} over
{residual add, LayerNorm}, and the first is one kernel more and a pass over memory worse
once realized.

`RealizedRoofline` splits a group into the kernels its realization launches (the label of
planner.fusion.realization, the one a Plan records and realize runs): each
library call (a GEMM or convolution, with its bias and eligible GELU epilogue; an SDPA
call; one concatenated GEMM), and each connected piece of what is left, which Inductor
fuses. The group's cost is the roofline sum over those kernels, so values crossing from a
library call to its epilogue are charged where they are really written and read. A group
whose realization keeps everything in one kernel costs what the analytical model says.
"""

from __future__ import annotations

from collections.abc import Iterable

from learned_cost.analytical import AnalyticalModel
from planner.cost import GroupCost
from planner.fusion.realization import realization_of, split_label
from planner.fusion.recognize import find_attention, find_sibling_gemms
from planner.ir.graph import Category, OpGraph

VERSION = "realized-roofline-1"
HALF = frozenset({"bfloat16", "float16"})


class RealizedRoofline(AnalyticalModel):
    """Roofline per kernel of a group's realization (see the module doc)."""

    name = "realized-roofline"
    version = VERSION

    def __repr__(self) -> str:
        return f"RealizedRoofline({self.spec.name})"

    def kernels(
        self, graph: OpGraph, nodes: Iterable[int], label: str | None = None
    ) -> list[frozenset[int]]:
        """The node sets of the kernels the group's realization launches: the rule's, or
        `label`'s (planner.fusion.realization.LABELS). With a compile mode ("+autotune")
        each GEMM kernel also takes the elementwise ops that only read its result and the
        group's inputs: the epilogue a GEMM template fuses."""
        members = frozenset(nodes)
        realization, mode = split_label(label or realization_of(graph, members))
        if realization == "eager":
            work = [i for i in members if graph.nodes[i].category is not Category.VIEW]
            return [frozenset((i,)) for i in work] if len(work) > 1 else [members]
        units: list[set[int]] = []
        if realization == "sdpa":
            units += [set(m.core) for m in find_attention(graph, members)]
        if realization == "concat_gemm":
            units += [set(s.nodes) for s in find_sibling_gemms(graph, members)]
        taken = set().union(*units) if units else set()
        for i in sorted(members - taken):
            if graph.nodes[i].category is Category.COMPUTE:
                unit = {i}
                gelu = self._gelu_epilogue(graph, i, members)
                if gelu is not None:
                    unit.add(gelu)
                units.append(unit)
                taken |= unit
        if not units:
            return [members]
        if mode:
            for unit in units:
                taken |= _epilogue(graph, unit, members - taken)
        rest = members - taken
        return [frozenset(u) for u in units] + _components(graph, rest)

    def _gelu_epilogue(self, graph: OpGraph, i: int, members: frozenset[int]) -> int | None:
        """The GELU the realizer folds into GEMM `i`'s cuBLASLt epilogue, if any."""
        n = graph.nodes[i]
        if self.spec.kind != "gpu" or n.op != "linear" or len(n.inputs) != 3:
            return None
        out = n.outputs[0]
        if graph.tensors[out].dtype not in HALF or out in graph.outputs:
            return None
        users = graph.consumers[out]
        if len(users) == 1 and users[0] in members and graph.nodes[users[0]].op == "gelu":
            return users[0]
        return None

    def group_cost(self, graph: OpGraph, nodes: Iterable[int]) -> GroupCost:
        return self.group_cost_as(graph, nodes, None)

    def group_cost_as(self, graph: OpGraph, nodes: Iterable[int], label: str | None) -> GroupCost:
        """The group's cost when it runs as `label` (None: the rule's label)."""
        return self.group_cost_recomputing(graph, nodes, (), label)

    def group_cost_recomputing(
        self,
        graph: OpGraph,
        nodes: Iterable[int],
        copies: Iterable[int],
        label: str | None = None,
        unread: Iterable[int] = (),
    ) -> GroupCost:
        """The group `nodes` run as `label` that also recomputes `copies`
        (planner.fusion.recompute). A copy sits in the kernel the split puts it in; its
        result is written only when another kernel of the group reads it (a prologue
        Inductor computes before a library GEMM, say)."""
        members, copied, skip = frozenset(nodes), frozenset(copies), frozenset(unread)
        everything = members | copied
        label = label or realization_of(graph, everything)
        parts = self.kernels(graph, everything, label)
        base = super()
        if len(parts) <= 1:
            return base.group_cost_recomputing(graph, members, copied, None, skip)
        costs = []
        for p in parts:
            kept = frozenset(c for c in p & copied if _only_read_in(graph, c, p, everything))
            costs.append(base.group_cost_recomputing(graph, p - kept, kept, None, skip))
        whole = base.group_cost_recomputing(graph, members, copied, None, skip)
        return GroupCost(
            latency_s=sum(c.latency_s for c in costs),
            t_compute_s=sum(c.t_compute_s for c in costs),
            t_memory_s=sum(c.t_memory_s for c in costs),
            t_launch_s=sum(c.t_launch_s for c in costs),
            flops=whole.flops,
            bytes_in=whole.bytes_in,
            bytes_out=whole.bytes_out,
        )


def _only_read_in(graph: OpGraph, op: int, kernel: frozenset[int], group: frozenset[int]) -> bool:
    """Whether no other kernel of the group reads op's result."""
    return all(u in kernel or u not in group for u in graph.consumers[graph.nodes[op].outputs[0]])


def _epilogue(graph: OpGraph, unit: set[int], free: frozenset[int] | set[int]) -> set[int]:
    """Grow `unit` (in place) by the pointwise ops of `free` whose inputs come from the unit
    or from outside `free`; returns what was added."""
    added: set[int] = set()
    grew = True
    while grew:
        grew = False
        for i in sorted(free - unit):
            n = graph.nodes[i]
            if n.category not in (Category.POINTWISE, Category.VIEW):
                continue
            srcs = {graph.tensors[t].producer for t in n.inputs}
            if srcs & unit and not (srcs - unit) & set(free):
                unit.add(i)
                added.add(i)
                grew = True
    return added


def _components(graph: OpGraph, nodes: set[int]) -> list[frozenset[int]]:
    """Connected pieces of `nodes` (through tensors both ends of which are in `nodes`);
    pieces of views only are left to the kernel that reads them."""
    left, out = set(nodes), []
    while left:
        start = left.pop()
        piece, todo = {start}, [start]
        while todo:
            n = graph.nodes[todo.pop()]
            near = [graph.tensors[t].producer for t in n.inputs]
            near += [c for t in n.outputs for c in graph.consumers[t]]
            for j in near:
                if j is not None and j in left:
                    left.discard(j)
                    piece.add(j)
                    todo.append(j)
        if any(graph.nodes[j].category is not Category.VIEW for j in piece):
            out.append(frozenset(piece))
    return out
