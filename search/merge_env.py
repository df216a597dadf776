"""The merge process behind the searched and learned strategies: priority fusion, opened up.

`priority` (search/strategies/priority.py) starts from one group per op (views attached to
their producers), applies fused-kernel patterns, then repeatedly applies the legal merge of
two groups with the largest modelled benefit

    gain(a, b) = score(a) + score(b) - score(a | b)      (score = C + T_in, objective.py)

until no merge helps. The Optuna encoding (search/encoding.py) and the RL policy
(search/rl_policy.py) drive this same process and change one thing each: the encoding
forbids some merges (links vetoed by a genome) and chooses which patterns to apply; the
policy chooses which legal merge comes next. `MergeEnv` is the process as an object, so
both stay legal by construction (every merge passes `FusionState.merge_reasons`) and, with
nothing forbidden and the largest gain always taken, reproduce `priority` exactly.

Order, as in priority: fused-kernel patterns on single ops, then every view joins its
producer's group, then the merge loop, then view-only groups join a neighbour.

Candidates are pairs of groups that share an edge (vertical) or read a common tensor
(horizontal), legal when created and with a positive gain. Legality of an untouched pair
can only be lost later (a merge elsewhere may close a cycle through it, never open one),
so it is re-checked when the pair is taken (`best`) or when every candidate must be known
legal (`legal`, for a policy that needs the whole masked action set).

Scores are memoized per group mask (`memo`, shareable across the decodes of one search),
so a search revisiting the same groups does not spend its budget twice; every miss is one
`Objective.group_score` request and is refused with `OutOfBudget` once the clock says so.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from planner.fusion.legality import FusionState, free_mask
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.ir.graph import OpGraph
from planner.objective import Objective
from search.strategy import Clock

Pair = tuple[int, int]


class OutOfBudget(Exception):
    """Internal: the clock refused another scoring request; the state so far is legal."""


@dataclass(frozen=True)
class MergeRecord:
    """One merge as it happened: its sides, its gain, and the best merge it ruled out."""

    a_mask: int
    b_mask: int
    gain_s: float
    blocked_gain_s: float  # largest gain of a candidate of a or b that is gone after it


class MergeEnv:
    """A partition under construction by merges; see the module docstring.

    `allowed`, when given, maps each base unit (the lowest node of a group after views are
    attached) to the base units it may be merged with directly; two groups may merge when
    any of their base units are allowed to. None allows every link. Not thread-safe.
    """

    def __init__(
        self,
        graph: OpGraph,
        objective: Objective,
        clock: Clock | None = None,
        *,
        memo: dict[int, float] | None = None,
        allowed: Mapping[int, frozenset[int]] | None = None,
        horizontal: bool = True,
        trace: bool = False,
    ):
        self.graph, self.objective, self.clock = graph, objective, clock
        self.memo = memo if memo is not None else {}
        self.allowed = allowed
        self.horizontal = horizontal
        # Base units (each op with the views of its result) name the links a genome steers;
        # they come from attaching views to singletons, whatever patterns do later.
        attached = FusionState(graph, objective.limits)
        _attach_views(attached)
        self.base_state = attached  # read-only: the base units as groups
        self.base: tuple[int, ...] = tuple(attached.group_of)  # node -> base unit id
        self.state = FusionState(graph, objective.limits)  # singletons: patterns go first
        self.cands: dict[Pair, float] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.records: list[MergeRecord] | None = [] if trace else None
        self.n_merges = 0
        self.started = False
        self._rebuild()

    def _rebuild(self) -> None:
        """Group bookkeeping (base units, readers, running total) from the state."""
        st = self.state
        self.units: dict[int, set[int]] = {
            gid: {self.base[i] for i in bits(m)} for gid, m in st.mask.items()
        }
        self.readers: dict[int, set[int]] = {}
        for gid, f in st.facts.items():
            for r in f.input_roots:
                self.readers.setdefault(r, set()).add(gid)
        self.pairs_of: dict[int, set[Pair]] = {gid: set() for gid in st.mask}
        self.total_s = math.fsum(self.score(gid) for gid in sorted(st.mask))

    # ---- scores ------------------------------------------------------------------------
    def mask_score(self, mask: int) -> float:
        got = self.memo.get(mask)
        if got is None:
            if self.clock is not None and self.clock.exhausted(1):
                raise OutOfBudget
            got = self.objective.group_score(self.graph, mask)
            self.memo[mask] = got
        return got

    def score(self, gid: int) -> float:
        return self.mask_score(self.state.mask[gid])

    # ---- candidates --------------------------------------------------------------------
    def partners(self, gid: int) -> set[int]:
        """Groups that `gid` may merge with directly (before legality)."""
        st = self.state
        if self.allowed is None:
            out = set(st.neighbors(gid))
            if self.horizontal:
                for r in st.facts[gid].input_roots:
                    out |= self.readers.get(r, set())
        else:
            out = set()
            for u in self.units[gid]:
                for v in self.allowed.get(u, ()):
                    out.add(st.group_of[v])
        out.discard(gid)
        return out

    def consider(self, a: int, b: int) -> None:
        a, b = min(a, b), max(a, b)
        if (a, b) in self.cands or self.state.merge_reasons((a, b)):
            return
        st = self.state
        gain = self.score(a) + self.score(b) - self.mask_score(st.mask[a] | st.mask[b])
        if gain > 0:  # NaN (two failed scores) and -inf never pass
            self.cands[(a, b)] = gain
            self.pairs_of[a].add((a, b))
            self.pairs_of[b].add((a, b))
            heapq.heappush(self.heap, (-gain, a, b))

    def start(self) -> None:
        """Attach views to their producers (priority's step 2), then collect the first
        candidates. Call after any `apply_group` (patterns go first, on single ops)."""
        _attach_views(self.state)
        self._rebuild()
        self.started = True
        for a in sorted(self.state.mask):
            for b in sorted(self.partners(a)):
                if a < b:
                    self.consider(a, b)

    def _drop(self, pair: Pair) -> None:
        if self.cands.pop(pair, None) is not None:
            self.pairs_of[pair[0]].discard(pair)
            self.pairs_of[pair[1]].discard(pair)

    def best(self) -> Pair | None:
        """The legal candidate with the largest gain (ties: lower group ids), or None."""
        while self.heap:
            neg, a, b = self.heap[0]
            if self.cands.get((a, b)) != -neg:
                heapq.heappop(self.heap)  # merged away or replaced since it was pushed
                continue
            if self.state.creates_cycle((a, b)):
                heapq.heappop(self.heap)
                self._drop((a, b))
                continue
            return a, b
        return None

    def legal(self) -> list[Pair]:
        """Every candidate that is legal now, sorted: the action set of a policy."""
        for pair in sorted(self.cands):
            if self.state.creates_cycle(pair):
                self._drop(pair)
        return sorted(self.cands)

    # ---- moves -------------------------------------------------------------------------
    def group_gain(self, nodes: Iterable[int]) -> float | None:
        """The gain of merging every group holding `nodes` at once, or None when they are
        one group already, the merge is illegal, or it does not lower the modelled cost."""
        st = self.state
        gids = sorted({st.group_of[i] for i in nodes})
        if len(gids) < 2 or st.merge_reasons(gids):
            return None
        union = 0
        for g in gids:
            union |= st.mask[g]
        gain = math.fsum(self.score(g) for g in gids) - self.mask_score(union)
        return gain if gain > 0 else None

    def apply_group(self, nodes: Iterable[int]) -> bool:
        """Merge every group holding `nodes` at once (a fused-kernel pattern), if that is
        legal and lowers the modelled cost. Call before `start`."""
        assert not self.started, "patterns go first, as in priority"
        nodes = tuple(nodes)
        gain = self.group_gain(nodes)
        if gain is None:
            return False
        self._merge(sorted({self.state.group_of[i] for i in nodes}), gain)
        return True

    def merge(self, a: int, b: int) -> int:
        """Merge candidate pair (a, b) (legality is the caller's: take it from `best` or
        `legal`); returns the new group id."""
        a, b = min(a, b), max(a, b)
        gain = self.cands[(a, b)]
        if self.records is None:
            return self._merge([a, b], gain)
        masks = self.state.mask[a], self.state.mask[b]
        rivals = [(p, self.cands[p]) for p in self.pairs_of[a] | self.pairs_of[b]]
        new = self._merge([a, b], gain)
        blocked = 0.0
        for (x, y), g in rivals:
            other = y if x in (a, b) else x
            if other not in (a, b) and (min(new, other), max(new, other)) not in self.cands:
                blocked = max(blocked, g)  # the merged group can no longer take this merge
        self.records.append(MergeRecord(masks[0], masks[1], gain, blocked))
        return new

    def _merge(self, gids: list[int], gain: float) -> int:
        st = self.state
        for g in gids:
            for pair in list(self.pairs_of[g]):
                self._drop(pair)
            for r in st.facts[g].input_roots:
                self.readers[r].discard(g)
        new = st.merge(*gids)
        merged_units: set[int] = set()
        for g in gids:
            merged_units |= self.units.pop(g)
            if g != new:
                del self.pairs_of[g]
        self.units[new] = merged_units
        self.pairs_of[new] = set()
        for r in st.facts[new].input_roots:
            self.readers.setdefault(r, set()).add(new)
        self.total_s -= gain
        self.n_merges += 1
        if self.started:
            for c in sorted(self.partners(new)):
                self.consider(new, c)
        return new

    def run_greedy(self, on_merge: Callable[[int, float], bool] | None = None) -> bool:
        """Take the largest-gain legal merge until none is left (priority's loop).

        `on_merge(merges so far, total_s)` after each merge may return True to stop early
        (a pruned trial); returns whether the loop ran to the end."""
        if not self.started:
            self.start()
        while (pair := self.best()) is not None:
            self.merge(*pair)
            if on_merge is not None and on_merge(self.n_merges, self.total_s):
                return False
        return True

    def finish(self) -> Partition:
        """The partition, each group of views only merged into a neighbouring group where
        legal and where the modelled cost does not rise (priority's absorb_free_groups,
        through the memo and the clock)."""
        st = self.state
        free = free_mask(self.graph)
        self.started = False  # the loop is over: no new candidates to collect
        for gid in sorted(st.mask):
            if gid not in st.mask or st.mask[gid] & ~free:
                continue
            for other in sorted(st.neighbors(gid)):
                if st.merge_reasons((gid, other)):
                    continue
                before = self.score(gid) + self.score(other)
                if self.mask_score(st.mask[gid] | st.mask[other]) <= before * (1 + 1e-12):
                    gain = before - self.mask_score(st.mask[gid] | st.mask[other])
                    self._merge(sorted((gid, other)), gain)
                    break
        return st.partition()

    def partition(self) -> Partition:
        """The partition as it stands (legal at every step)."""
        return self.state.partition()


def _attach_views(state: FusionState) -> None:
    """Each view joins its producer's group where legal, as priority.attach_views does
    (views are free; a view between two groups would hide that they are neighbours)."""
    g = state.graph
    ks = kinds(g)
    for n in g.nodes:
        if ks[n.index] is Kind.FREE and g.pred[n.index]:
            gids = {state.group_of[n.index], state.group_of[g.pred[n.index][0]]}
            if len(gids) == 2 and not state.merge_reasons(gids):
                state.merge(*gids)
