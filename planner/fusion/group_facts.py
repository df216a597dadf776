"""What legality needs to know about a group of nodes, computed once and merged in O(1).

`GroupFacts` summarizes a set of nodes (anchors, reductions and their iteration spaces,
reach of its members, input storage, resource estimate) so that the facts of a merged
group are the `combine` of its parts: search loops judge a merge without walking the
graph. Also here: the graph-level tables the rules use (ancestors, views, the fused-kernel
regions of attention matches), each cached per graph key.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import bits
from planner.fusion.patterns import fused_kernel_matches
from planner.fusion.resources import anchor_smem, attention_smem, node_regs
from planner.ir.graph import OpGraph


@dataclass(frozen=True)
class GroupFacts:
    """What the group rules need to know about a set of nodes; `combine` merges two."""

    mask: int
    n_work: int  # members that are not views
    anchors: int  # mask of GEMM/conv/attention nodes
    opaque: int  # mask of never-fused nodes
    reduces: int  # mask of reductions / norms / softmax
    red_spaces: frozenset[int]  # input numel of each reduction: its iteration space
    work_reach: int  # OR of reach over non-anchor work members (prologue test)
    anchor_reach: int  # OR of reach over anchors (siblings must not reach each other)
    anchor_inputs: frozenset[int] | None  # input roots every anchor reads (None: no anchor)
    input_roots: frozenset[int]  # storage roots read by any member
    regs: int  # summed register estimate (planner/fusion/resources.py)
    smem: int  # largest anchor tile

    def combine(self, other: GroupFacts) -> GroupFacts:
        if self.anchor_inputs is None:
            ai = other.anchor_inputs
        elif other.anchor_inputs is None:
            ai = self.anchor_inputs
        else:
            ai = self.anchor_inputs & other.anchor_inputs
        return GroupFacts(
            self.mask | other.mask,
            self.n_work + other.n_work,
            self.anchors | other.anchors,
            self.opaque | other.opaque,
            self.reduces | other.reduces,
            self.red_spaces | other.red_spaces,
            self.work_reach | other.work_reach,
            self.anchor_reach | other.anchor_reach,
            ai,
            self.input_roots | other.input_roots,
            self.regs + other.regs,
            max(self.smem, other.smem),
        )


def node_facts(graph: OpGraph, i: int) -> GroupFacts:
    k = kinds(graph)[i]
    n = graph.nodes[i]
    roots = frozenset(graph.root(t) for t in n.inputs)
    bit = 1 << i
    anchor = k is Kind.ANCHOR
    work = k is not Kind.FREE
    space = graph.tensors[n.inputs[0]].numel if n.inputs else 0
    return GroupFacts(
        mask=bit,
        n_work=int(work),
        anchors=bit if anchor else 0,
        opaque=bit if k is Kind.OPAQUE else 0,
        reduces=bit if k is Kind.REDUCE else 0,
        red_spaces=frozenset((space,)) if k is Kind.REDUCE else frozenset(),
        work_reach=graph.reach[i] if work and not anchor else 0,
        anchor_reach=graph.reach[i] if anchor else 0,
        anchor_inputs=roots if anchor else None,
        input_roots=roots,
        regs=node_regs(graph, i),
        smem=anchor_smem(graph, i),
    )


def facts_of(graph: OpGraph, mask: int) -> GroupFacts:
    it = bits(mask)
    f = node_facts(graph, next(it))
    for i in it:
        f = f.combine(node_facts(graph, i))
    return f


# ---- the fused-kernel exception (attention) ------------------------------------------------
@dataclass(frozen=True)
class FusedRegion:
    """A pattern match realized by one known kernel holding several GEMMs."""

    work: int  # mask of the match's non-view nodes
    anchors: int
    smem: int  # that kernel's tile estimate
    pattern: str


_REGIONS: dict[str, tuple[FusedRegion, ...]] = {}
_FREE: dict[str, int] = {}


def fused_regions(graph: OpGraph) -> tuple[FusedRegion, ...]:
    """The graph's fused-kernel regions (attention matches), cached per graph key."""
    got = _REGIONS.get(graph.key)
    if got is not None:
        return got
    ks = kinds(graph)
    out = []
    for m in fused_kernel_matches(graph):
        work = sum(1 << i for i in m.nodes if ks[i] is not Kind.FREE)
        anchors = sum(1 << i for i in m.nodes if ks[i] is Kind.ANCHOR)
        qk = m.role("qk")
        head, item = 64, 2
        if qk and graph.nodes[qk[0]].inputs:
            t = graph.tensors[graph.nodes[qk[0]].inputs[0]]
            head, item = (t.shape[-1] if t.shape else 1), t.itemsize
        out.append(FusedRegion(work, anchors, attention_smem(head, item), m.pattern))
    if len(_REGIONS) > 256:
        _REGIONS.clear()
    _REGIONS[graph.key] = got = tuple(out)
    return got


def free_mask(graph: OpGraph) -> int:
    """Mask of the graph's view nodes (kind FREE)."""
    got = _FREE.get(graph.key)
    if got is None:
        got = sum(1 << i for i, k in enumerate(kinds(graph)) if k is Kind.FREE)
        if len(_FREE) > 256:
            _FREE.clear()
        _FREE[graph.key] = got
    return got


def fused_region_of(graph: OpGraph, facts: GroupFacts) -> FusedRegion | None:
    """The known multi-GEMM kernel this group is (a part of, holding all its GEMMs), if any."""
    if facts.anchors & (facts.anchors - 1) == 0:
        return None  # fewer than two anchors: the ordinary rules apply
    work = facts.mask & ~free_mask(graph)
    for r in fused_regions(graph):
        if work & ~r.work == 0 and facts.anchors == r.anchors:
            return r
    return None


def siblings_ok(f: GroupFacts) -> bool:
    """Horizontal fusion of anchors: a shared input and no path between any two of them."""
    return bool(f.anchor_inputs) and not f.anchor_reach & f.anchors


def never_legal_grown(graph: OpGraph, f: GroupFacts, regs_cap: int | None) -> bool:
    """The monotone part of legality: no group holding `f`'s ops can ever be legal,
    whatever else joins it. Opaque ops, the register cap, reductions over different
    spaces, chained anchors and a reduction or prologue in an anchor group only get worse
    as a group grows, unless the group may still become a known fused kernel (attention).
    Exact search prunes its enumeration with it; the Optuna encoding drops such links."""
    if f.n_work < 2:
        return False
    if f.opaque or (regs_cap is not None and f.regs > regs_cap) or len(f.red_spaces) > 1:
        return True
    if not f.anchors:
        return False
    multi = f.anchors & (f.anchors - 1)
    bad = (multi and not siblings_ok(f)) or f.reduces or f.work_reach & f.anchors
    if not bad:
        return False
    work = f.mask & ~free_mask(graph)
    return not any(
        work & ~r.work == 0 and f.anchors & ~r.anchors == 0 for r in fused_regions(graph)
    )


_ANC: dict[str, tuple[int, ...]] = {}


def ancestors(graph: OpGraph) -> tuple[int, ...]:
    """anc[i]: bitmask of the nodes with a path to node i (the mirror of graph.reach)."""
    got = _ANC.get(graph.key)
    if got is None:
        anc = [0] * len(graph.nodes)
        for i in range(len(graph.nodes)):
            m = 0
            for p in graph.pred[i]:
                m |= (1 << p) | anc[p]
            anc[i] = m
        if len(_ANC) > 256:
            _ANC.clear()
        _ANC[graph.key] = got = tuple(anc)
    return got


def convex_masks(graph: OpGraph, mask: int) -> tuple[int, int]:
    """(descendants, ancestors) of the group: it is convex iff they meet only inside it."""
    anc = ancestors(graph)
    down = up = 0
    for i in bits(mask):
        down |= graph.reach[i]
        up |= anc[i]
    return down, up


def is_connected(graph: OpGraph, mask: int) -> bool:
    """Members linked by producer-consumer edges or shared input storage (one component)."""
    members = list(bits(mask))
    readers: dict[int, list[int]] = {}
    for i in members:
        for t in graph.nodes[i].inputs:
            readers.setdefault(graph.root(t), []).append(i)
    seen = {members[0]}
    stack = [members[0]]
    while stack:
        i = stack.pop()
        nbrs = [*graph.succ[i], *graph.pred[i]]
        for t in graph.nodes[i].inputs:
            nbrs.extend(readers[graph.root(t)])
        for j in nbrs:
            if mask >> j & 1 and j not in seen:
                seen.add(j)
                stack.append(j)
    return len(seen) == len(members)
