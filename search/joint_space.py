"""The joint search space: partition, merge moves and each group's realization, together.

A point of the space (a `Variant`) is a partition and one realization label per group
(planner.fusion.realization.LABELS), so it is a whole Plan: realize runs the labels as
they are recorded. Every point is legal by construction:

- **partition**: the contested-decision encoding (search/encoding.py): yes/no decisions
  that forbid a merge of priority's merge process (which splits a group of priority's
  plan) or skip a fused-kernel pattern (attention -> SDPA; sibling GEMMs on one input ->
  one GEMM: the horizontal, concatenated-weights choice), decoded by the process itself;
- **split moves**: a group of priority's plan holding a GEMM or convolution and an
  epilogue is split in two, the GEMM with what it reads inside the group, then the rest
  (the library call and a separately fused epilogue as two groups); both halves are
  convex by construction (nothing in the rest feeds the first half) and the result is
  kept only when it passes planner.fusion.legality;
- **merge moves**: forced merges of two neighbouring groups of priority's plan that the
  process would not make (no modelled gain), each kept only when the merged partition
  passes planner.fusion.legality; this reaches partitions that are not local optima of the
  merge process;
- **recompute**: per cheap op (elementwise or broadcast, bounded FLOPs) whose result
  another group reads, whether that group recomputes it with its cheap ancestors from
  their inputs instead of reading it (planner.fusion.recompute: legal by construction;
  an op no group then reads from its home is not run there and never written); up to
  `MAX_RECOMPUTE` decisions, asked after the partition's;
- **realization per group**: `choices_for` (planner.fusion.realization) offers a GEMM or
  convolution group Inductor's default, its max-autotune GEMM templates with the
  epilogue fused, the ops compiled separately instead of a fused-kernel rewrite, and eager;
  a group without such an op has one label (the rule's). These are conditional
  parameters: a group's decision exists only in the points whose partition holds it (its
  name is derived from the group's nodes).

A point is built by asking one question at a time (`JointSpace.sample(ask)`, `ask(name,
choices)` returning one of `choices`), so Optuna's define-by-run trials, a policy and the
warm start (`default_ask`: the first choice of each, which is priority's plan with the
rule's labels) walk the same space. Each question's first choice is the neutral one.

Predicted cost (`predict`): the objective's total for the partition, with each group
re-priced with its copies, dead ops and unwritten results when the point recomputes
(`recompute.group_cost`: the cost model's `group_cost_recomputing`), and otherwise each
group whose label is not the rule's re-priced as that label runs (`label_cost`: the cost
model's `group_cost_as` where it has one, learned_cost.realized; else eager as one
kernel per op and any compiled label at the model's group cost).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.cost import CostModel
from planner.fusion import recompute
from planner.fusion.legality import check
from planner.fusion.opkinds import Kind, kinds
from planner.fusion.partition import Partition, bits
from planner.fusion.realization import choices_for, realization_of, split_label
from planner.fusion.recompute import Copies, as_copies, check_copies
from planner.ir.graph import OpGraph
from planner.objective import Evaluation, Objective
from search.encoding import Encoding, build_encoding
from search.strategy import Clock

Ask = Callable[[str, Sequence[Any]], Any]
MAX_MERGE_MOVES = 8
MAX_RECOMPUTE = 8  # recompute decisions per point


def default_ask(name: str, choices: Sequence[Any]) -> Any:
    """The neutral answer to every question: priority's plan with the rule's labels."""
    return choices[0]


@dataclass(frozen=True)
class Variant:
    """A point of the space: a partition, one label per group (aligned with
    `partition.groups`) and the ops each group recomputes (planner.fusion.recompute)."""

    partition: Partition
    labels: tuple[str, ...]
    copies: Copies = ()

    @property
    def key(self) -> tuple[Partition, tuple[str, ...], Copies]:
        return self.partition, self.labels, self.copies

    def non_default(self) -> int:
        """Groups whose label is not the realization rule's, plus groups that recompute."""
        g, copies = self.partition.graph, dict(self.copies)
        rule = (realization_of(g, m | copies.get(m, 0)) for m in self.partition.masks)
        return sum(lab != r for lab, r in zip(self.labels, rule)) + len(self.copies)

    def autotuned(self) -> int:
        """Groups compiled with a compile mode (each costs an autotuning compile)."""
        return sum(bool(split_label(lab)[1]) for lab in self.labels)


def group_name(mask: int) -> str:
    """A stable parameter name for a group's realization decision."""
    lo = (mask & -mask).bit_length() - 1
    digest = zlib.crc32(mask.to_bytes((mask.bit_length() + 7) // 8 or 1, "little"))
    return f"r{lo}_{mask.bit_count()}_{digest:08x}"


def label_cost(cost_model: CostModel, graph: OpGraph, mask: int, label: str) -> float:
    """Seconds the group `mask` costs when it runs as `label` (see the module doc)."""
    nodes = frozenset(bits(mask))
    priced = getattr(cost_model, "group_cost_as", None)
    if priced is not None:
        return priced(graph, nodes, label).latency_s
    if split_label(label)[0] == "eager":
        ks = kinds(graph)
        work = [i for i in nodes if ks[i] is not Kind.FREE]
        if len(work) > 1:
            return sum(cost_model.group_cost(graph, frozenset((i,))).latency_s for i in work)
    return cost_model.group_cost(graph, nodes).latency_s


class JointSpace:
    """The space over one graph (see the module doc). Raises search.merge_env.OutOfBudget
    when the clock runs out while priority's run is traced."""

    def __init__(
        self,
        graph: OpGraph,
        objective: Objective,
        clock: Clock | None = None,
        *,
        max_free: int = 48,
        max_merge_moves: int = MAX_MERGE_MOVES,
        max_recompute: int = MAX_RECOMPUTE,
    ):
        self.graph, self.objective, self.clock = graph, objective, clock
        self.memo: dict[int, float] = {}
        self.encoding: Encoding = build_encoding(
            graph, objective, clock=clock, memo=self.memo, max_free=max_free
        )
        self.priority = self.encoding.decode(
            objective, self.encoding.default(), clock, self.memo
        ).partition
        self.split_moves = self._split_moves(max_merge_moves)
        self.merge_moves = self._merge_moves(max_merge_moves)
        self._label_costs: dict[tuple[int, str], float] = {}
        self._recompute_costs: dict[tuple[int, int, frozenset[int], str], float] = {}
        self.max_recompute = max_recompute

    def _head(self, mask: int, anchor: int) -> int:
        """The anchor and its ancestors inside the group `mask` (a bitmask)."""
        head, todo = 1 << anchor, [anchor]
        while todo:
            for t in self.graph.nodes[todo.pop()].inputs:
                p = self.graph.tensors[t].producer
                if p is not None and mask >> p & 1 and not head >> p & 1:
                    head |= 1 << p
                    todo.append(p)
        return head

    def _split(self, part: Partition, anchor: int) -> Partition | None:
        """`part` with the group of `anchor` split into its head and the rest, or None."""
        gi = part.group_of[anchor]
        mask = part.masks[gi]
        head = self._head(mask, anchor)
        rest = mask & ~head
        ks = kinds(self.graph)
        if not any(ks[i] is not Kind.FREE for i in bits(rest)):
            return None
        masks = [m for i, m in enumerate(part.masks) if i != gi] + [head, rest]
        try:
            out = Partition(self.graph, masks)
        except Exception:  # not a partition the graph accepts: no move
            return None
        return out if check(out, self.objective.limits).ok else None

    def _split_moves(self, limit: int) -> tuple[int, ...]:
        """One anchor per group of priority's plan whose split is legal (see the module doc)."""
        ks, out = kinds(self.graph), []
        for mask in self.priority.masks:
            for a in bits(mask):
                if ks[a] is Kind.ANCHOR and self._split(self.priority, a) is not None:
                    out.append(a)
                    break
        return tuple(out[:limit])

    def _merge_moves(self, limit: int) -> tuple[tuple[int, int], ...]:
        """Pairs (a node of each side) of neighbouring groups of priority's plan whose
        merge is legal, the smallest modelled loss first."""
        part, out = self.priority, []
        for a, b in sorted(set(part.group_edges)):
            if self.clock is not None and self.clock.exhausted(1):
                break
            merged = _merged(part, a, b)
            if merged is None or not check(merged, self.objective.limits).ok:
                continue
            ma, mb = part.masks[a], part.masks[b]
            loss = self.objective.group_score(self.graph, ma | mb) - self.memo_score(ma)
            loss -= self.memo_score(mb)
            if math.isfinite(loss):
                lo_a, lo_b = (ma & -ma).bit_length() - 1, (mb & -mb).bit_length() - 1
                out.append((loss, lo_a, lo_b))
        out.sort()
        return tuple((a, b) for _, a, b in out[:limit])

    def memo_score(self, mask: int) -> float:
        got = self.memo.get(mask)
        if got is None:
            got = self.memo[mask] = self.objective.group_score(self.graph, mask)
        return got

    @property
    def n_partition_decisions(self) -> int:
        return len(self.encoding.decisions) + len(self.split_moves) + len(self.merge_moves)

    def sample(self, ask: Ask = default_ask) -> Variant:
        """The point the answers of `ask` choose (see the module doc)."""
        genome = {d.name: bool(ask(d.name, (True, False))) for d in self.encoding.decisions}
        part = self.encoding.decode(self.objective, genome, self.clock, self.memo).partition
        for k, a in enumerate(self.split_moves):
            if ask(f"s{k}", (False, True)):
                split = self._split(part, a)
                part = split if split is not None else part
        for k, (a, b) in enumerate(self.merge_moves):
            if ask(f"m{k}", (False, True)):
                go = part.group_of
                merged = _merged(part, go[a], go[b]) if go[a] != go[b] else None
                if merged is not None and check(merged, self.objective.limits).ok:
                    part = merged
        copies: Copies = ()
        for node, gm, cm in recompute.candidates(part, self.max_recompute):
            if ask(f"c{node}_{group_name(gm)}", (False, True)):
                more = as_copies((*copies, (gm, cm)))
                copies = more if check_copies(part, more) is None else copies
        by_group = dict(copies)
        labels = []
        for mask in part.masks:
            whole = mask | by_group.get(mask, 0)
            choices = choices_for(self.graph, whole)
            labels.append(choices[0] if len(choices) == 1 else ask(group_name(whole), choices))
        return Variant(part, tuple(labels), copies)

    def predict(self, v: Variant) -> tuple[float, Evaluation]:
        """Modelled seconds of `v` (inf when infeasible) and its partition's evaluation."""
        ev = self.objective.evaluate(v.partition)
        if not ev.feasible:
            return math.inf, ev
        total = ev.total_s
        if v.copies:
            for (live, cm, unread), label, cost in zip(
                recompute.effective(v.partition, v.copies), v.labels, ev.group_costs
            ):
                key = (live, cm, unread, label)
                got = self._recompute_costs.get(key)
                if got is None:
                    try:
                        got = recompute.group_cost(
                            self.objective.cost_model, self.graph, live, cm, label, unread
                        ).latency_s
                    except Exception:  # a failing candidate is infinitely expensive
                        got = math.inf
                    self._recompute_costs[key] = got
                total += got - cost.latency_s
            return total, ev
        for mask, label, cost in zip(v.partition.masks, v.labels, ev.group_costs):
            if label == realization_of(self.graph, mask):
                continue
            key = (mask, label)
            got = self._label_costs.get(key)
            if got is None:
                try:
                    got = label_cost(self.objective.cost_model, self.graph, mask, label)
                except Exception:  # a failing candidate is infinitely expensive
                    got = math.inf
                self._label_costs[key] = got
            total += got - cost.latency_s
        return total, ev


def _merged(part: Partition, a: int, b: int) -> Partition | None:
    masks = [m for i, m in enumerate(part.masks) if i not in (a, b)]
    masks.append(part.masks[a] | part.masks[b])
    try:
        return Partition(part.graph, masks)
    except Exception:  # not a partition the graph accepts (e.g. a cycle): no move
        return None


__all__ = ["JointSpace", "Variant", "default_ask", "group_name", "label_cost"]
