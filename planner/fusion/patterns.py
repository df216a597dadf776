"""Fusion patterns (docs/formulas.md §6-7): the library, the matcher entry point, conflicts.

The pattern language (Op, Seq, Par, Rep, Alt, Where, Found) is in planner/fusion/pattern_lang.py
and re-exported here. `match_all` runs every library pattern from every node and keeps the
maximal convex matches; `resolve` settles overlaps by score = benefit / cost * priority
(docs/formulas.md §7). A match's `realization` is the realization rule's label for its
nodes (planner.fusion.realization): "sdpa" for attention, "concat_gemm" for sibling GEMMs on one
input, else "inductor". Legality accepts an attention group even though it holds two GEMMs.

Attention ::= (Q || K || V) -> MatMul -> Softmax -> MatMul is two library
entries because it is realized as two kernels (docs/formulas.md §14: [QKV fused] -> [attention
fused]): `sibling_gemms` (one GEMM on concatenated weights) and `attention` (one flash
kernel). Both take their matches from planner.fusion.recognize, the recognizer the rewrites use,
so the library matches exactly what realization can turn into those kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from planner.cost import CostModel
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import is_convex, mask_of
from planner.fusion.pattern_lang import Alt, Ctx, Found, Op, Par, Path, Pattern, Rep, Seq, Where
from planner.fusion.realization import realization_of
from planner.fusion.recognize import find_attention, find_sibling_gemms
from planner.fusion.resources import ResourceLimits, anchor_smem, node_regs
from planner.ir.graph import Category, OpGraph

# ---- the library ---------------------------------------------------------------------------
EW = Op(kinds=(Kind.ELEMWISE, Kind.BROADCAST))
GEMM = Op(ops=("linear", "addmm", "mm", "matmul", "bmm", "baddbmm"), role="gemm")


def _attention_paths(g: OpGraph) -> list[Path]:
    """planner.fusion.recognize's attention matches: the core ops, roles qk/scale/mask/softmax/pv."""
    out = []
    for m in find_attention(g):
        roles = [("qk", m.qk)]
        roles += [("scale", m.scale_node)] if m.scale_node is not None else []
        roles += [("mask", m.mask_node)] if m.mask_node is not None else []
        roles += [("softmax", m.softmax), ("pv", m.pv)]
        out.append(Path(frozenset(m.core), (m.pv,), tuple(roles)))
    return out


def _sibling_paths(g: OpGraph) -> list[Path]:
    """planner.fusion.recognize's sibling GEMM sets, each GEMM in role "gemm"."""
    return [
        Path(frozenset(s.nodes), s.nodes, tuple(("gemm", i) for i in s.nodes))
        for s in find_sibling_gemms(g)
    ]


ATTENTION = Found(_attention_paths)
SIBLING_GEMMS = Found(_sibling_paths)


def _is_conv(g: OpGraph, i: int) -> bool:
    return "conv" in g.nodes[i].op


def _is_bn(g: OpGraph, i: int) -> bool:
    return "batch_norm" in g.nodes[i].op and kinds(g)[i] is Kind.ELEMWISE


@dataclass(frozen=True)
class PatternDef:
    name: str
    pattern: Pattern
    priority: float  # priority(m) of docs/formulas.md §7, before path criticality
    why: str
    extend: Callable[[OpGraph, frozenset[int]], frozenset[int]] | None = None


def _with_constant_producers(g: OpGraph, nodes: frozenset[int]) -> frozenset[int]:
    """Add the producers of attention masks that depend on no input (ones -> tril -> not)."""
    const = _constant_nodes(g)
    out, stack = set(nodes), [p for n in nodes for p in g.pred[n]]
    while stack:
        p = stack.pop()
        if p in const and p not in out and kinds(g)[p] <= Kind.BROADCAST:
            out.add(p)
            stack.extend(g.pred[p])
    return frozenset(out)


def _constant_nodes(g: OpGraph) -> set[int]:
    """Nodes whose every input is state or another constant node (never a user input)."""
    const: set[int] = set()
    for n in g.nodes:
        ok = True
        for t in n.inputs:
            info = g.tensors[t]
            if info.kind == "input" or (info.producer is not None and info.producer not in const):
                ok = False
                break
        if ok:
            const.add(n.index)
    return const


# fmt: off
LIBRARY: tuple[PatternDef, ...] = (
    PatternDef("attention", ATTENTION, 4.0,
               "QK^T -> scale/mask -> softmax -> PV is one flash-attention kernel; the score "
               "matrix never reaches memory (test_patterns::test_attention_on_zoo)",
               _with_constant_producers),
    PatternDef("sibling_gemms", SIBLING_GEMMS, 2.0,
               "GEMMs on one input (Q||K||V, gate||up) are one GEMM on concatenated weights "
               "reading the input once (test_patterns::test_sibling_gemms_qkv)"),
    PatternDef("conv_bn_act", Seq(Op(where=_is_conv, role="conv"), Op(where=_is_bn), Rep(EW, 1, 4)),
               3.0, "Conv -> BN -> Act (CBA): BN folds into the conv epilogue "
               "(test_patterns::test_conv_bn_act)"),
    PatternDef("gemm_epilogue", Seq(GEMM, Rep(EW, 1, 6)), 2.5,
               "bias / activation / residual applied while the GEMM tile is in registers "
               "(test_patterns::test_gemm_epilogue)"),
    PatternDef("norm_act",
               Alt(Seq(Op(kinds=(Kind.REDUCE,), categories=(Category.NORM,), role="norm"),
                       Rep(EW, 1, 4)),
                   Seq(Rep(EW, 1, 4), Op(kinds=(Kind.REDUCE,), categories=(Category.NORM,),
                                         role="norm"))),
               1.5, "a norm with its elementwise neighbours: one pass over the row "
               "(test_patterns::test_norm_act)"),
    PatternDef("rms_norm", Seq(Op(ops=("pow", "square")), Op(ops=("mean",), role="norm"),
                               Rep(EW, 1, 8)),
               1.5, "a hand-written RMSNorm (pow, mean, rsqrt, mul) is one row "
               "kernel (test_patterns::test_rms_norm_llama)"),
    PatternDef("ew_chain", Rep(EW, 2), 1.0,
               "EW+: a chain of elementwise ops reads and writes memory once "
               "(test_patterns::test_pointwise_chain_is_one_match)"),
)
# fmt: on


@dataclass(frozen=True)
class Match:
    """One occurrence of a library pattern."""

    pattern: str
    nodes: frozenset[int]
    priority: float
    roles: tuple[tuple[str, int], ...] = ()
    graph: OpGraph | None = field(default=None, compare=False, repr=False)

    @property
    def mask(self) -> int:
        return mask_of(self.nodes)

    @property
    def realization(self) -> str:
        """How the match runs as one group: the realization rule's label for its nodes."""
        if self.graph is None:
            raise ValueError("a Match without its graph has no realization; use match_all()")
        return realization_of(self.graph, self.nodes)

    def role(self, name: str) -> list[int]:
        return [n for r, n in self.roles if r == name]


_MATCH_CACHE: dict[str, tuple[Match, ...]] = {}


def match_all(graph: OpGraph, library: tuple[PatternDef, ...] = LIBRARY) -> list[Match]:
    """Every maximal match of every library pattern in `graph` (overlaps included)."""
    cache_key = graph.key if library is LIBRARY else ""
    if cache_key and cache_key in _MATCH_CACHE:
        return list(_MATCH_CACHE[cache_key])
    ctx = Ctx(graph)
    found: list[Match] = []
    for d in library:
        ms: dict[frozenset[int], Path] = {}
        for n in graph.nodes:
            if ctx.kinds[n.index] is Kind.FREE:
                continue
            for p in d.pattern.paths(ctx, n.index):
                nodes = d.extend(graph, p.nodes) if d.extend else p.nodes
                work = sum(1 for i in nodes if ctx.kinds[i] is not Kind.FREE)
                if work >= 2 and nodes not in ms and is_convex(graph, mask_of(nodes)):
                    ms[nodes] = p  # a non-convex match could never be one group
        masks = {nodes: mask_of(nodes) for nodes in ms}
        for nodes, p in ms.items():
            m = masks[nodes]
            if any(o != m and m & ~o == 0 for o in masks.values()):
                continue  # contained in a larger match of the same pattern
            found.append(Match(d.name, nodes, d.priority, p.roles, graph))
    found.sort(key=lambda m: (min(m.nodes), m.pattern, sorted(m.nodes)))
    if cache_key:
        if len(_MATCH_CACHE) > 64:
            _MATCH_CACHE.clear()
        _MATCH_CACHE[cache_key] = tuple(found)
    return found


def fused_kernel_matches(graph: OpGraph) -> list[Match]:
    """Matches realized by a known multi-GEMM kernel (attention): legality's exception."""
    return [m for m in match_all(graph) if m.pattern == "attention"]


# ---- conflict resolution (docs/formulas.md §7) -------------------------------------------------
COMPILE_OPS_UNIT = 32  # ops per unit of "compile complexity" in cost(m)


@dataclass(frozen=True)
class Scored:
    match: Match
    benefit_s: float  # sum of singleton costs - cost of the fused group
    cost: float  # 1 + register/shared-memory pressure + compile complexity
    priority: float  # pattern priority x path criticality
    score: float


def score(matches: Iterable[Match], cost_model: CostModel) -> list[Scored]:
    """score(m) = benefit(m) / cost(m) * priority(m) for each match.

    benefit: modelled latency saved by running the match as one group instead of one
    kernel per op (memory traffic and launches saved, via `cost_model`); cost: register
    and shared-memory pressure (planner/fusion/resources.py, as a fraction of the caps) plus
    compile complexity (ops / COMPILE_OPS_UNIT); priority: the pattern's priority times
    its path criticality (longest singleton-latency path through the match over the
    graph's longest path, in (0, 1]).
    """
    out: list[Scored] = []
    crit_cache: dict[str, tuple[list[float], list[float], float]] = {}
    limits = ResourceLimits.for_spec(None)
    for m in matches:
        g = m.graph
        if g is None:
            raise ValueError("a Match without its graph cannot be scored; use match_all()")
        if g.key not in crit_cache:
            crit_cache[g.key] = _longest_paths(g, cost_model)
        down, up, longest = crit_cache[g.key]
        single = sum(cost_model.group_cost(g, frozenset((i,))).latency_s for i in m.nodes)
        fused = cost_model.group_cost(g, m.nodes).latency_s
        regs = sum(node_regs(g, i) for i in m.nodes)
        smem = max((anchor_smem(g, i) for i in m.nodes), default=0)
        work = sum(1 for i in m.nodes if kinds(g)[i] is not Kind.FREE)
        cost = 1.0 + regs / (limits.regs_per_thread or 255) + smem / limits.smem_bytes
        cost += work / COMPILE_OPS_UNIT
        through = max(down[i] + up[i] for i in m.nodes)
        crit = through / longest if longest > 0 else 1.0
        benefit = single - fused
        prio = m.priority * crit
        out.append(Scored(m, benefit, cost, prio, benefit / cost * prio))
    return out


def resolve(
    matches: Iterable[Match],
    cost_model: CostModel,
    *,
    is_legal: Callable[[frozenset[int]], bool] | None = None,
) -> list[Match]:
    """A non-overlapping subset of `matches`, best score first (greedy, docs/formulas.md §7).

    Matches that would not pay (benefit <= 0) or that `is_legal` rejects are dropped.
    """
    taken = 0
    chosen: list[Match] = []
    ranked = sorted(score(matches, cost_model), key=lambda s: (-s.score, sorted(s.match.nodes)))
    for s in ranked:
        m = s.match
        if s.benefit_s <= 0 or m.mask & taken:
            continue
        if is_legal is not None and not is_legal(m.nodes):
            continue
        chosen.append(m)
        taken |= m.mask
    return chosen


def _longest_paths(g: OpGraph, cost_model: CostModel) -> tuple[list[float], list[float], float]:
    """Per node: longest singleton-latency path ending at it (incl.) and starting after it."""
    lat = [cost_model.group_cost(g, frozenset((i,))).latency_s for i in range(len(g.nodes))]
    down = [0.0] * len(g.nodes)
    for i in range(len(g.nodes)):
        down[i] = lat[i] + max((down[p] for p in g.pred[i]), default=0.0)
    up = [0.0] * len(g.nodes)
    for i in reversed(range(len(g.nodes))):
        up[i] = max((lat[s] + up[s] for s in g.succ[i]), default=0.0)
    return down, up, max(down, default=0.0)


__all__ = [
    "LIBRARY",
    "Alt",
    "Found",
    "Match",
    "Op",
    "Par",
    "Path",
    "Pattern",
    "PatternDef",
    "Rep",
    "Scored",
    "Seq",
    "Where",
    "fused_kernel_matches",
    "match_all",
    "resolve",
    "score",
]
