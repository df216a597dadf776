"""The rule-based default partition: TVM FuseOps-like fusion into post-dominators.

No cost model, deterministic, fast (a 1000-node graph in well under a second), and legal
by construction: every merge goes through planner.fusion.legality. The runtime
(planner.runtime.backend) runs it as the safe default plan on a plan-cache miss; the `greedy`
search strategy wraps it.

The algorithm is TVM's FuseOps (relay/transforms/fuse_ops.cc, GraphPartitioner):
1. the immediate post-dominator of every node over the DAG (a node whose result leaves
   the graph is post-dominated by a virtual sink), found with LCA queries on the
   post-dominator tree, nodes visited in reverse topological order;
2. in phases, each node tries to fuse into its post-dominator: the node, the post-dominator
   and every node on a path between them become one group, if the rule of `FUSE_RULES` for
   the node's kind accepts the kinds on the path and the kind of the sink's group, and
   legality accepts the merged group.

Views (kind FREE) count as elementwise on paths: they move nothing. Unlike TVM, a
reduction may take its elementwise consumers (phase 2), as Inductor does when it
realizes the group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.fusion.legality import FusionState, ancestors
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.fusion.resources import ResourceLimits
from planner.hardware import DeviceSpec
from planner.ir.graph import OpGraph

SINK = -1  # the virtual node after every graph output


@dataclass(frozen=True)
class FuseRule:
    phase: int
    source: tuple[Kind, ...]  # kinds of the node that fuses into its post-dominator
    path_ok: Callable[[Kind], bool]  # every node strictly between them
    sink_ok: Callable[[Kind], bool]  # the kind of the post-dominator's group (its max kind)
    why: str


def _le(k: Kind) -> Callable[[Kind], bool]:
    return lambda x: x <= k


# fmt: off
FUSE_RULES: tuple[FuseRule, ...] = (
    # TVM phase 0, kOutEWiseFusable: the anchor takes an elementwise epilogue up to its
    # post-dominator (test_zoo_plans::test_gemm_bias_gelu_is_an_epilogue).
    FuseRule(0, (Kind.ANCHOR,), _le(Kind.BROADCAST), _le(Kind.BROADCAST),
             "GEMM/conv + elementwise epilogue"),
    # TVM phase 0, <= kBroadcast: elementwise ops fuse into a consumer that is elementwise,
    # injective, a reduction, or already an anchor's epilogue (test_zoo_plans::
    # test_pointwise_chain_is_one_group).
    FuseRule(0, (Kind.FREE, Kind.ELEMWISE, Kind.BROADCAST), _le(Kind.INJECTIVE),
             lambda k: k <= Kind.REDUCE or k is Kind.ANCHOR,
             "elementwise producers fuse into their consumer's loop"),
    # TVM phase 1, kInjective: deferred so anchors finish fusing first; all-injective paths.
    FuseRule(1, (Kind.INJECTIVE,), _le(Kind.INJECTIVE), _le(Kind.INJECTIVE),
             "copies / concatenations fuse with injective consumers"),
    # Not in TVM: a reduction takes its elementwise consumers, as Inductor's reduction
    # kernels do (test_zoo_plans::test_llama_rmsnorm_is_one_group).
    FuseRule(2, (Kind.REDUCE,), _le(Kind.BROADCAST), _le(Kind.BROADCAST),
             "reduction + elementwise epilogue (Inductor-style)"),
)
# fmt: on
PHASES = sorted({r.phase for r in FUSE_RULES})


def post_dominators(graph: OpGraph) -> list[int]:
    """Immediate post-dominator of every node (SINK when its result leaves the graph)."""
    n = len(graph.nodes)
    outputs = set(graph.outputs)
    ipdom = [SINK] * n
    depth = [0] * n  # depth in the post-dominator tree; SINK has depth 0

    def lca(a: int, b: int) -> int:
        while a != b:
            if a == SINK or b == SINK:
                return SINK
            if depth[a] >= depth[b]:
                a = ipdom[a]
            else:
                b = ipdom[b]
        return a

    for i in reversed(range(n)):
        node = graph.nodes[i]
        if not graph.succ[i] or any(t in outputs for t in node.outputs):
            ipdom[i] = SINK
        else:
            it = iter(graph.succ[i])
            d = next(it)
            for s in it:
                d = lca(d, s)
            ipdom[i] = d
        depth[i] = 1 + (depth[ipdom[i]] if ipdom[i] != SINK else 0)
    return ipdom


def default_partition(graph: OpGraph, spec: DeviceSpec | ResourceLimits | None = None) -> Partition:
    """The TVM FuseOps-like partition of `graph` (legal under `spec`'s resource limits)."""
    if not graph.nodes:
        return Partition(graph, ())
    ks = kinds(graph)
    ipdom = post_dominators(graph)
    anc = ancestors(graph)
    state = FusionState(graph, spec)

    def group_kind(gid: int) -> Kind:
        return max(ks[i] for i in bits(state.mask[gid]))

    for phase in PHASES:
        rules = [r for r in FUSE_RULES if r.phase == phase]
        for i in range(len(graph.nodes)):
            dom = ipdom[i]
            if dom == SINK or state.group_of[i] == state.group_of[dom]:
                continue
            rule = next((r for r in rules if ks[i] in r.source), None)
            if rule is None:
                continue
            between = graph.reach[i] & anc[dom]
            if not all(rule.path_ok(ks[j]) for j in bits(between)):
                continue
            if not rule.sink_ok(group_kind(state.group_of[dom])):
                continue
            gids = {state.group_of[i], state.group_of[dom]}
            gids.update(state.group_of[j] for j in bits(between))
            if not state.merge_reasons(gids):
                state.merge(*gids)
    return state.partition()
