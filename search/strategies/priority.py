"""`priority`: XLA-priority-fusion-like: always apply the legal merge that helps most.

1. Known fused kernels first (as XLA rewrites attention into a fused custom call before
   its fusion passes): attention and sibling-GEMM matches, settled by the score of
   docs/formulas.md §7 (planner.fusion.patterns.resolve), are applied where legal and where they
   lower the modelled cost. Pairwise merges alone could never build an attention group:
   every intermediate step (GEMM + softmax, softmax + GEMM) is illegal.
2. Every other view joins its producer's group (views are free, and a view left alone
   between two groups would hide that they are neighbours).
3. Then, repeatedly, the legal merge of two groups with the largest modelled benefit
   score(a) + score(b) - score(a | b) (score = C + T_in, planner/objective.py), among
   producer-consumer pairs (vertical) and pairs that read a common tensor (horizontal),
   until no merge helps or the budget runs out. Last, groups of views only join a
   neighbour where that costs nothing.

Candidates sit in a heap with lazy invalidation (a merged group gets a new version), so
a 1000-node graph plans in well under a second
(benchmarks/results/planning_time.md). Deterministic: ties go to the lower node ids.
"""

from __future__ import annotations

import heapq

from planner.fusion.legality import FusionState, free_mask, group_reasons
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition
from planner.fusion.patterns import match_all, resolve
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.strategy import Clock, Strategy, register


@register
class PriorityStrategy(Strategy):
    name = "priority"

    def __init__(self, patterns: bool = True, horizontal: bool = True):
        self.patterns = patterns
        self.horizontal = horizontal

    def search(
        self, graph: OpGraph, objective: Objective, clock: Clock, seed: int
    ) -> tuple[Partition, bool, str]:
        state = FusionState(graph, objective.limits)
        run = _Run(graph, objective, clock, state, self.horizontal)
        applied = run.apply_patterns() if self.patterns else 0  # on singletons: see step 1
        attach_views(state)
        run.refresh()
        merges, complete = run.merge_loop()
        absorb_free_groups(state, objective)
        notes = f"{applied} fused-kernel patterns, {merges} merges"
        if not complete:
            notes += "; budget ran out before no merge helped"
        return state.partition(), complete, notes


def attach_views(state: FusionState) -> None:
    """Put every view in its producer's group (where legal): views are free, and a view
    between two groups would otherwise hide that they are neighbours."""
    g = state.graph
    for n in g.nodes:
        if kinds(g)[n.index] is Kind.FREE and g.pred[n.index]:
            gids = {state.group_of[n.index], state.group_of[g.pred[n.index][0]]}
            if len(gids) == 2 and not state.merge_reasons(gids):
                state.merge(*gids)


def absorb_free_groups(state: FusionState, objective: Objective) -> None:
    """Merge each group of views only into a neighbouring group, where legal and where the
    modelled cost does not rise: the cost stays the same, the plan gets tidier."""
    g = state.graph
    free = free_mask(g)
    for gid in sorted(state.mask):
        if gid not in state.mask or state.mask[gid] & ~free:
            continue
        for other in sorted(state.neighbors(gid)):
            pair = (gid, other)
            if state.merge_reasons(pair):
                continue
            m = state.mask[gid] | state.mask[other]
            before = objective.group_score(g, state.mask[gid]) + objective.group_score(
                g, state.mask[other]
            )
            if objective.group_score(g, m) <= before * (1 + 1e-12):
                state.merge(*pair)
                break


class _Run:
    """One priority-fusion run over a FusionState."""

    def __init__(
        self,
        graph: OpGraph,
        objective: Objective,
        clock: Clock,
        state: FusionState,
        horizontal: bool,
    ):
        self.g, self.obj, self.clock, self.state = graph, objective, clock, state
        self.horizontal = horizontal
        self.version: dict[int, int] = dict.fromkeys(state.mask, 0)
        self.readers: dict[int, set[int]] = {}  # storage root -> groups reading it
        for gid, f in state.facts.items():
            for r in f.input_roots:
                self.readers.setdefault(r, set()).add(gid)
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.out_of_budget = False
        self.next_version = 1

    def refresh(self) -> None:
        """Re-read group ids and input readers after merges made outside `_merge`."""
        self.version = dict.fromkeys(self.state.mask, 0)
        self.readers = {}
        for gid, f in self.state.facts.items():
            for r in f.input_roots:
                self.readers.setdefault(r, set()).add(gid)

    def score(self, gid: int) -> float:
        return self.obj.group_score(self.g, self.state.mask[gid])

    def apply_patterns(self) -> int:
        matches = [m for m in match_all(self.g) if m.realization != "inductor"]
        if not matches or self.clock.exhausted(2 * len(matches)):
            return 0
        lim = self.obj.limits
        try:
            chosen = resolve(
                matches, self.obj.cost_model, is_legal=lambda ns: not group_reasons(self.g, ns, lim)
            )
        except Exception:  # a cost model that fails here fails the patterns only
            return 0
        applied = 0
        for m in chosen:
            gids = {self.state.group_of[i] for i in m.nodes}
            if len(gids) < 2 or self.state.merge_reasons(gids):
                continue
            if self.clock.exhausted(len(gids) + 1):
                break
            before = sum(self.score(gid) for gid in gids)
            union = 0
            for gid in gids:
                union |= self.state.mask[gid]
            if self.obj.group_score(self.g, union) < before:
                self._merge(gids)
                applied += 1
        return applied

    def candidates(self, gid: int) -> set[int]:
        out = set(self.state.neighbors(gid))
        if self.horizontal:
            for r in self.state.facts[gid].input_roots:
                out |= self.readers.get(r, set())
        out.discard(gid)
        return out

    def push(self, a: int, b: int) -> None:
        if self.clock.exhausted(3):  # scores of a, b and a | b
            self.out_of_budget = True
            return
        a, b = min(a, b), max(a, b)
        if self.state.merge_reasons((a, b)):
            return
        s = self.state
        gain = self.score(a) + self.score(b) - self.obj.group_score(self.g, s.mask[a] | s.mask[b])
        if gain > 0:
            heapq.heappush(self.heap, (-gain, a, b, self.version[a], self.version[b]))

    def merge_loop(self) -> tuple[int, bool]:
        for a in sorted(self.state.mask):
            for b in sorted(self.candidates(a)):
                if a < b:
                    self.push(a, b)
        merges = 0
        while self.heap:
            _, a, b, va, vb = heapq.heappop(self.heap)
            if self.version.get(a) != va or self.version.get(b) != vb:
                continue  # one of them has merged since
            if self.state.merge_reasons((a, b)):
                continue  # another merge closed a cycle through them
            new = self._merge((a, b))
            merges += 1
            for c in sorted(self.candidates(new)):
                self.push(new, c)
        return merges, not self.out_of_budget

    def _merge(self, gids: set[int] | tuple[int, ...]) -> int:
        for gid in gids:
            for r in self.state.facts[gid].input_roots:
                self.readers[r].discard(gid)
            self.version.pop(gid, None)
        new = self.state.merge(*gids)
        self.version[new] = self.next_version
        self.next_version += 1
        for r in self.state.facts[new].input_roots:
            self.readers.setdefault(r, set()).add(new)
        return new
