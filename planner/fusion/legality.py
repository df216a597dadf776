"""Fusion legality: which groups may run as one unit, as a table of rules with reasons.

Every rule is an entry of `RULES` (name, scope, check, one-line why, motivating test).
Group rules look at one group; the partition rule looks at the graph of groups. A group
is legal when no group rule objects; a partition when every group is legal and its graph
of groups is acyclic (docs/formulas.md §3; docs/architecture.md "Legal group").

Views (Category.VIEW, kind FREE) move nothing and never break a rule by themselves: they
may join any group they are connected to.

Search inner loops use `FusionState`, a mutable partition that keeps per-group facts
(masks, anchors, reductions, resource usage) mergeable in O(1) and the graph of groups
with its reachability, so a merge is judged without walking the graph. `can_merge` on an
immutable `Partition` uses the same machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from planner.errors import LegalityError
from planner.fusion.group_facts import (
    FusedRegion,
    GroupFacts,
    ancestors,
    convex_masks,
    facts_of,
    free_mask,
    fused_region_of,
    fused_regions,
    is_connected,
    node_facts,
    siblings_ok,
)
from planner.fusion.partition import Partition, bits
from planner.fusion.resources import ResourceLimits, Usage
from planner.hardware import DeviceSpec
from planner.ir.graph import OpGraph


# ---- the rules -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupView:
    """What a group rule sees."""

    graph: OpGraph
    facts: GroupFacts
    limits: ResourceLimits
    region: FusedRegion | None

    @property
    def mask(self) -> int:
        return self.facts.mask

    def names(self, mask: int, limit: int = 4) -> str:
        ns = [self.graph.nodes[i].name for i in bits(mask)]
        return ", ".join(ns[:limit]) + (f" (+{len(ns) - limit})" if len(ns) > limit else "")


def _convex(v: GroupView) -> str | None:
    down, up = convex_masks(v.graph, v.mask)
    between = down & up & ~v.mask  # on a path that leaves the group and comes back
    if not between:
        return None
    via = (between & -between).bit_length() - 1
    return (
        f"not convex: a path leaves the group and re-enters it through "
        f"{v.graph.nodes[via].name}; add the nodes on that path or split the group"
    )


def _connected(v: GroupView) -> str | None:
    if v.mask & (v.mask - 1) == 0 or is_connected(v.graph, v.mask):
        return None
    return (
        "not connected: its parts share no edge and no input tensor, "
        "so fusing them saves nothing; make them separate groups"
    )


def _opaque_alone(v: GroupView) -> str | None:
    f = v.facts
    if f.opaque and f.n_work > 1:
        return (
            f"opaque/collective op {v.names(f.opaque)} shares a group with other ops; "
            "it must run alone (eager)"
        )
    return None


def _anchors(v: GroupView) -> str | None:
    f = v.facts
    if f.anchors & (f.anchors - 1) == 0 or v.region is not None:
        return None
    if siblings_ok(f):
        return None
    return (
        f"{bin(f.anchors).count('1')} compute anchors ({v.names(f.anchors)}) in one group: at "
        "most one, unless they are siblings on one input with no path between them, or the "
        "group is a known fused kernel (attention)"
    )


def _epilogue(v: GroupView) -> str | None:
    f = v.facts
    if not f.anchors or v.region is not None:
        return None
    if f.reduces:
        return (
            f"reduction {v.names(f.reduces)} in a GEMM/conv group: an anchor takes elementwise "
            "epilogues only; put the reduction in its own group"
        )
    if f.work_reach & f.anchors:
        return (
            f"prologue: a non-GEMM op feeds anchor {v.names(f.anchors)} inside the group; "
            "anchors take epilogues, not prologues; split the producer off"
        )
    epi = f.anchor_reach & f.mask  # members downstream of an anchor
    side = f.mask & ~free_mask(v.graph) & ~f.anchors & ~epi
    for s in bits(side):
        if not v.graph.reach[s] & epi:
            return (
                f"detached: {v.graph.nodes[s].name} neither consumes the anchor's result nor "
                "feeds its epilogue, so it would be a kernel of its own; split it off"
            )
    return None


def _reduction_space(v: GroupView) -> str | None:
    spaces = v.facts.red_spaces
    if len(spaces) <= 1 or v.region is not None:
        return None
    return (
        f"reductions over different iteration spaces ({', '.join(map(str, sorted(spaces)))} "
        "elements) cannot share one loop nest; split them"
    )


def _resources(v: GroupView) -> str | None:
    f = v.facts
    if f.n_work < 2:
        return None  # a single op runs as its own library kernel, which picks tiles that fit
    usage = Usage(f.regs, v.region.smem if v.region is not None else f.smem)
    if usage.fits(v.limits):
        return None
    return f"resource estimate too large: {usage.explain(v.limits)}"


def _acyclic(p: Partition) -> str | None:
    if p.is_acyclic():
        return None
    return (
        "the graph of groups has a cycle (each group can be convex and the groups still "
        "depend on each other both ways); merge or split the groups on the cycle"
    )


@dataclass(frozen=True)
class Rule:
    name: str
    scope: str  # "group" or "partition"
    check: Callable[..., str | None]
    why: str
    test: str


# fmt: off
RULES: tuple[Rule, ...] = (
    Rule("convex", "group", _convex,
         "a path that leaves and re-enters would need the group's output before its input",
         "test_legality::test_non_convex_group_is_rejected"),
    Rule("connected", "group", _connected,
         "unrelated ops share no bytes; fusing them only lengthens one kernel (formulas.md §3)",
         "test_legality::test_unrelated_nodes_are_not_one_group"),
    Rule("opaque_alone", "group", _opaque_alone,
         "unknown ops and collectives have no loop body to fuse into",
         "test_legality::test_opaque_op_stays_alone"),
    Rule("one_anchor", "group", _anchors,
         "one tensor-core kernel per group, except sibling GEMMs (one concatenated GEMM) and "
         "attention (one flash kernel)",
         "test_legality::test_two_chained_gemms_are_rejected"),
    Rule("epilogue_only", "group", _epilogue,
         "GEMM/conv kernels fuse elementwise epilogues; prologues and reductions need another pass",
         "test_legality::test_gemm_prologue_is_rejected"),
    Rule("reduction_space", "group", _reduction_space,
         "reductions fuse with elementwise producers/consumers and with reductions over the "
         "same rows only",
         "test_legality::test_reductions_of_different_spaces_are_rejected"),
    Rule("resources", "group", _resources,
         "registers and shared memory of the fused kernel must fit the device (formulas.md §3)",
         "test_legality::test_resource_limit_splits_long_chains"),
    Rule("acyclic", "partition", _acyclic,
         "groups run one after another: their dependency graph must have an order",
         "test_legality::test_two_convex_groups_can_form_a_cycle"),
)
# fmt: on
GROUP_RULES = tuple(r for r in RULES if r.scope == "group")


def _limits(spec: DeviceSpec | ResourceLimits | None) -> ResourceLimits:
    return spec if isinstance(spec, ResourceLimits) else ResourceLimits.for_spec(spec)


def group_reasons(
    graph: OpGraph, mask: int | Iterable[int], spec: DeviceSpec | ResourceLimits | None = None
) -> list[str]:
    """Why the group `mask` (bitmask or node indices) is illegal; empty when it is legal."""
    if not isinstance(mask, int):
        mask = sum(1 << i for i in set(mask))
    if mask <= 0:
        return ["empty group"]
    facts = facts_of(graph, mask)
    view = GroupView(graph, facts, _limits(spec), fused_region_of(graph, facts))
    return [f"{r.name}: {msg}" for r in GROUP_RULES if (msg := r.check(view))]


@dataclass(frozen=True)
class LegalityReport:
    """Result of `check`: ok, and the reasons per group index and for the partition."""

    ok: bool
    group_reasons: tuple[tuple[int, tuple[str, ...]], ...]
    partition_reasons: tuple[str, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        out = [f"group {g}: {r}" for g, rs in self.group_reasons for r in rs]
        return (*out, *self.partition_reasons)

    def raise_if_illegal(self) -> None:
        if not self.ok:
            raise LegalityError(
                "illegal partition: " + "; ".join(self.reasons[:5]), tuple(self.reasons)
            )


def check(partition: Partition, spec: DeviceSpec | ResourceLimits | None = None) -> LegalityReport:
    """Every rule of `RULES` on every group of `partition`, and the acyclic-group-graph rule."""
    lim = _limits(spec)
    per_group = []
    for g, m in enumerate(partition.masks):
        rs = group_reasons(partition.graph, m, lim)
        if rs:
            per_group.append((g, tuple(rs)))
    part = [
        f"{r.name}: {msg}" for r in RULES if r.scope == "partition" and (msg := r.check(partition))
    ]
    return LegalityReport(not per_group and not part, tuple(per_group), tuple(part))


def can_merge(
    partition: Partition, a: int, b: int, spec: DeviceSpec | ResourceLimits | None = None
) -> bool:
    """Whether merging groups a and b of a legal `partition` leaves it legal."""
    if a == b:
        return True
    state = _state_for(partition, _limits(spec))
    ga, gb = state.group_of[_low(partition.masks[a])], state.group_of[_low(partition.masks[b])]
    return not state.merge_reasons((ga, gb))


def _low(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


@lru_cache(maxsize=32)
def _state_for(partition: Partition, limits: ResourceLimits) -> FusionState:
    return FusionState(partition, limits)


# ---- the mutable state search loops use ----------------------------------------------------
class FusionState:
    """A partition under construction: groups by id, their facts, the group graph and its
    reachability. Not thread-safe; each search owns its own.

    Group ids are the lowest node index of the group at creation; a merge keeps the
    smallest id. `qreach[g]` is the mask of nodes in groups reachable from g in the graph
    of groups, maintained on every merge, so the cycle test of a merge is O(degree).
    Invariant: the partition is legal (start from a legal one; merge only what
    `merge_reasons` accepts).
    """

    def __init__(self, start: Partition | OpGraph, spec: DeviceSpec | ResourceLimits | None = None):
        p = start if isinstance(start, Partition) else Partition.singletons(start)
        self.graph = g = p.graph
        self.limits = _limits(spec)
        self.mask: dict[int, int] = {}
        self.facts: dict[int, GroupFacts] = {}
        self.group_of = [0] * len(g.nodes)
        for m in p.masks:
            gid = _low(m)
            self.mask[gid] = m
            self.facts[gid] = facts_of(g, m)
            for i in bits(m):
                self.group_of[i] = gid
        self.qsucc: dict[int, set[int]] = {gid: set() for gid in self.mask}
        self.qpred: dict[int, set[int]] = {gid: set() for gid in self.mask}
        for s, d in g.edges:
            a, b = self.group_of[s], self.group_of[d]
            if a != b:
                self.qsucc[a].add(b)
                self.qpred[b].add(a)
        order = p.topo_order()
        if order is None:
            raise LegalityError("FusionState needs an acyclic partition", ("acyclic",))
        self.qreach: dict[int, int] = {}
        for gi in reversed(order):
            gid = _low(p.masks[gi])
            r = 0
            for c in self.qsucc[gid]:
                r |= self.mask[c] | self.qreach[c]
            self.qreach[gid] = r

    def __len__(self) -> int:
        return len(self.mask)

    def groups(self) -> list[int]:
        return sorted(self.mask)

    def neighbors(self, gid: int) -> set[int]:
        return self.qsucc[gid] | self.qpred[gid]

    def creates_cycle(self, gids: Iterable[int]) -> bool:
        s = set(gids)
        union = 0
        for g in s:
            union |= self.mask[g]
        for g in s:
            for c in self.qsucc[g]:
                if c not in s and (self.mask[c] | self.qreach[c]) & union:
                    return True
        return False

    def merged_facts(self, gids: Iterable[int]) -> GroupFacts:
        it = iter(gids)
        f = self.facts[next(it)]
        for g in it:
            f = f.combine(self.facts[g])
        return f

    def merge_reasons(self, gids: Iterable[int]) -> list[str]:
        """Why merging the groups `gids` would be illegal (empty: legal)."""
        gs = sorted(set(gids))
        if len(gs) < 2:
            return []
        if not self._linked(gs):
            return ["connected: the groups share no edge and no input"]
        if self.creates_cycle(gs):
            return ["acyclic: merging them closes a cycle in the graph of groups"]
        facts = self.merged_facts(gs)
        view = GroupView(self.graph, facts, self.limits, fused_region_of(self.graph, facts))
        return [
            f"{r.name}: {msg}"
            for r in GROUP_RULES
            if r.name not in ("convex", "connected") and (msg := r.check(view))
        ]

    def can_merge(self, *gids: int) -> bool:
        return not self.merge_reasons(gids)

    def _linked(self, gs: list[int]) -> bool:
        """The groups form one component through edges or shared inputs."""
        seen, stack = {gs[0]}, [gs[0]]
        while stack:
            a = stack.pop()
            for b in gs:
                if b in seen:
                    continue
                if (
                    b in self.qsucc[a]
                    or b in self.qpred[a]
                    or self.facts[a].input_roots & self.facts[b].input_roots
                ):
                    seen.add(b)
                    stack.append(b)
        return len(seen) == len(gs)

    def merge(self, *gids: int) -> int:
        """Merge the groups (legality is the caller's business); returns the new id."""
        gs = sorted(set(gids))
        new = gs[0]
        if len(gs) < 2:
            return new
        union = 0
        for g in gs:
            union |= self.mask[g]
        facts = self.merged_facts(gs)
        succ = set().union(*(self.qsucc[g] for g in gs)) - set(gs)
        pred = set().union(*(self.qpred[g] for g in gs)) - set(gs)
        reach = 0
        for g in gs:
            reach |= self.qreach[g]
        reach &= ~union
        for g in gs:
            for c in self.qsucc.pop(g):
                self.qpred[c].discard(g)
            for c in self.qpred.pop(g):
                self.qsucc[c].discard(g)
            del self.mask[g], self.facts[g], self.qreach[g]
        self.mask[new], self.facts[new], self.qreach[new] = union, facts, reach
        self.qsucc[new], self.qpred[new] = succ, pred
        for c in succ:
            self.qpred[c].add(new)
        for c in pred:
            self.qsucc[c].add(new)
        for i in bits(union):
            self.group_of[i] = new
        # Every ancestor group now also reaches the whole merged group and beyond.
        add = union | reach
        stack, seen = list(pred), set(pred)
        while stack:
            a = stack.pop()
            self.qreach[a] |= add
            for p in self.qpred[a]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return new

    def partition(self) -> Partition:
        return Partition(self.graph, self.mask.values())


__all__ = [  # the group facts are re-exported: search loops import them from here
    "GROUP_RULES",
    "RULES",
    "FusedRegion",
    "FusionState",
    "GroupFacts",
    "GroupView",
    "LegalityReport",
    "Rule",
    "ancestors",
    "can_merge",
    "check",
    "facts_of",
    "free_mask",
    "fused_region_of",
    "fused_regions",
    "group_reasons",
    "is_connected",
    "node_facts",
    "siblings_ok",
]
