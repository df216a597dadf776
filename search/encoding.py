"""The partition encoding Optuna searches: a few yes/no decisions, decoded to a legal plan.

Why this encoding (docs/search.md has the measurements). A partition is not a good
search space for a sampler: a group label per node is symmetric (relabellings), and a
fuse bit per edge is mostly illegal and has one bit per edge (TPE degrades past ~100
booleans). So a genome here *steers* the priority merge process (search/merge_env.py)
instead of spelling out a partition:

- a **merge decision** allows (True) or forbids (False) merging across a set of links
  (pairs of base units: ops with their views). Forbidden links are never merged across;
  everything else proceeds as priority does, largest modelled gain first;
- a **pattern decision** says whether a fused-kernel match (attention -> SDPA, sibling
  GEMMs -> one GEMM) is applied up front, as priority does with every match it resolves.

Decoding is the repair step: whatever the bits, the result is legal (every merge passes
legality) and a local optimum of the restricted process (no allowed merge still helps).
All-True decodes to exactly `priority`'s partition, so the heuristic is the seed trial.

Which decisions are exposed (`mode`):
- "contested" (default): only the merges of priority's own run that ruled out another
  gainful merge (the merged group could no longer take it: a cycle, a second anchor, a
  register cap), ranked by how much they ruled out relative to what they gained, and the
  pattern decisions; at most `max_free` of them. A merge that ruled nothing out has no
  alternative to explore, and a link priority never merged across stays allowed.
- "all": one decision per link plus the patterns: the plain edge encoding, kept to
  measure against (it loses at equal budgets past a few dozen links, docs/search.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from planner.errors import FusionPlannerError
from planner.fusion.group_facts import never_legal_grown
from planner.fusion.legality import group_reasons
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.fusion.patterns import Match, match_all, resolve
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.merge_env import MergeEnv, OutOfBudget
from search.strategy import Clock

Link = tuple[int, int]  # (base unit, base unit), lower first
MODES = ("contested", "all")


@dataclass(frozen=True)
class Decision:
    """One yes/no choice of the genome; `name` is the Optuna parameter name."""

    name: str
    kind: str  # "merge" (links allowed or not) | "pattern" (a match applied or not)
    links: tuple[Link, ...] = ()
    nodes: tuple[int, ...] = ()
    stake: float = 0.0  # merge: blocked gain / gain in priority's run; pattern: 1


@dataclass(frozen=True)
class Decoded:
    partition: Partition
    total_s: float  # sum of group scores as the merge process tracked them
    complete: bool  # False when the budget ran out mid-decode (the partition is still legal)
    merges: int
    stopped: bool = False  # `on_merge` asked to stop (a pruned trial)


@dataclass(frozen=True)
class Encoding:
    """Decisions over one graph; `decode` turns any assignment into a legal partition."""

    graph: OpGraph
    mode: str
    decisions: tuple[Decision, ...]
    links: frozenset[Link]  # every link merges may cross (dead ones left out)
    n_links_total: int  # before `max_free` and mode selection: what the plain encoding has
    expected_merges: int  # merges in priority's run (pruning checkpoints)
    patterns: tuple[Decision, ...] = field(default=(), repr=False)  # every pattern, exposed or not

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.decisions)

    def default(self) -> dict[str, bool]:
        """All True: decodes to priority's partition."""
        return dict.fromkeys(self.names, True)

    def decode(
        self,
        objective: Objective,
        genome: Mapping[str, bool],
        clock: Clock | None = None,
        memo: dict[int, float] | None = None,
        on_merge: Callable[[int, float], bool] | None = None,
    ) -> Decoded:
        """The legal partition the genome steers priority's merge process to.

        Missing names count as True. On `OutOfBudget` the partition reached so far is
        returned with complete=False (legal: every step of the process is); when
        `on_merge(merges, total_s)` returns True the decode stops with stopped=True.
        """
        vetoed: set[Link] = set()
        for d in self.decisions:
            if d.kind == "merge" and not genome.get(d.name, True):
                vetoed.update(d.links)
        allowed: dict[int, set[int]] = {}
        for u, v in self.links - vetoed:
            allowed.setdefault(u, set()).add(v)
            allowed.setdefault(v, set()).add(u)
        frozen = {u: frozenset(vs) for u, vs in allowed.items()}
        try:  # the first scores (every op alone) may already exhaust the budget
            env = MergeEnv(self.graph, objective, clock, memo=memo, allowed=frozen)
        except OutOfBudget:
            return Decoded(Partition.singletons(self.graph), math.inf, False, 0)
        complete, stopped = True, False
        applied = 0  # a match overlapping one already applied is an alternative to it
        try:
            for d in self.patterns:
                if genome.get(d.name, True):
                    m = sum(1 << i for i in d.nodes)
                    if not m & applied and env.apply_group(d.nodes):
                        applied |= m
            stopped = not env.run_greedy(on_merge)
            part = env.partition() if stopped else env.finish()
        except OutOfBudget:
            complete, part = False, env.partition()
        return Decoded(part, env.total_s, complete, env.n_merges, stopped)

    def encode(self, partition: Partition) -> dict[str, bool]:
        """The genome closest to `partition`: a merge decision is True when the partition
        merges across one of its links, a pattern decision when it holds the whole match.
        Decoding it need not give `partition` back (decoding only takes gainful merges)."""
        go = partition.group_of
        ks = kinds(self.graph)
        out: dict[str, bool] = {}
        for d in self.decisions:
            if d.kind == "merge":
                out[d.name] = any(go[u] == go[v] for u, v in d.links)
            else:
                work = [i for i in d.nodes if ks[i] is not Kind.FREE]
                out[d.name] = len({go[i] for i in work}) == 1
        return out


def build_encoding(
    graph: OpGraph,
    objective: Objective,
    *,
    mode: str = "contested",
    max_free: int = 64,
    clock: Clock | None = None,
    memo: dict[int, float] | None = None,
) -> Encoding:
    """The decisions for `graph` (see the module docstring). Raises OutOfBudget when the
    clock runs out while priority's run is traced."""
    if mode not in MODES:
        raise FusionPlannerError(f"unknown encoding mode {mode!r}; expected one of {MODES}")
    if max_free < 0:
        raise FusionPlannerError(f"max_free must be >= 0, got {max_free}")
    env = MergeEnv(graph, objective, clock, memo=memo, trace=True)
    links = _live_links(graph, env)
    patterns = pattern_matches(graph, objective, clock)
    pat_decisions = [
        Decision(
            f"p{k}_{m.pattern}_{min(m.nodes)}", "pattern", nodes=tuple(sorted(m.nodes)), stake=1
        )
        for k, m in enumerate(patterns)
    ]
    applied = 0
    for m in patterns:
        if not m.mask & applied and env.apply_group(m.nodes):
            applied |= m.mask
    env.run_greedy()
    if mode == "all":
        merge_decisions = [
            Decision(f"l{u}_{v}", "merge", links=((u, v),)) for u, v in sorted(links)
        ]
    else:
        merge_decisions = _contested(env, links)
    chosen = (pat_decisions + merge_decisions)[:max_free]
    return Encoding(
        graph=graph,
        mode=mode,
        decisions=tuple(chosen),
        links=frozenset(links),
        n_links_total=len(links),
        expected_merges=env.n_merges,
        patterns=tuple(pat_decisions),
    )


def _contested(env: MergeEnv, links: set[Link]) -> list[Decision]:
    """Priority's merges that ruled out another gainful merge, most contested first."""
    assert env.records is not None
    base = env.base
    out = []
    for r in env.records:
        if r.blocked_gain_s <= 0:
            continue
        ua = {base[i] for i in bits(r.a_mask)}
        ub = {base[i] for i in bits(r.b_mask)}
        between = tuple(
            sorted(
                (min(u, v), max(u, v))
                for u, v in itertools.product(ua, ub)
                if (min(u, v), max(u, v)) in links
            )
        )
        if not between:
            continue
        stake = r.blocked_gain_s / r.gain_s if r.gain_s > 0 else 0.0
        name = f"m{min(ua)}_{min(ub)}"
        out.append(Decision(name, "merge", links=between, stake=stake))
    out.sort(key=lambda d: (-d.stake, d.name))
    return out


def _live_links(graph: OpGraph, env: MergeEnv) -> set[Link]:
    """Pairs of base units linked by an edge or a shared input, minus the dead ones (no
    group holding both can ever be legal, whatever else joins it)."""
    base = env.base
    st = env.base_state
    out: set[Link] = set()
    for s, d in graph.edges:
        u, v = base[s], base[d]
        if u != v:
            out.add((min(u, v), max(u, v)))
    readers: dict[int, set[int]] = {}
    for gid, f in st.facts.items():
        for r in f.input_roots:
            readers.setdefault(r, set()).add(gid)
    for group in readers.values():
        for u, v in itertools.combinations(sorted(group), 2):
            out.add((u, v))
    return {(u, v) for u, v in out if not _dead(env, u, v)}


def _dead(env: MergeEnv, u: int, v: int) -> bool:
    """No legal group can ever hold both u and v (planner.fusion.group_facts.never_legal_grown)."""
    st = env.base_state
    f = st.facts[u].combine(st.facts[v])
    return never_legal_grown(env.graph, f, st.limits.regs_per_thread)


def pattern_matches(
    graph: OpGraph, objective: Objective, clock: Clock | None, *, chosen_only: bool = False
) -> list[Match]:
    """Fused-kernel matches, in the order priority would apply them (its resolved ones
    first), then the overlapping alternatives it dropped (unless `chosen_only`)."""
    matches = [m for m in match_all(graph) if m.realization != "inductor"]
    if not matches:
        return []
    if clock is not None and clock.exhausted(2 * len(matches)):
        raise OutOfBudget
    lim = objective.limits
    try:
        chosen = resolve(
            matches, objective.cost_model, is_legal=lambda ns: not group_reasons(graph, ns, lim)
        )
    except Exception:  # a cost model that fails here fails the patterns only
        return []
    if chosen_only:
        return chosen
    return chosen + [m for m in matches if m not in chosen]
