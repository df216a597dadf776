"""α-β cost of collectives per algorithm, and the pipeline bubble.

Every flat (one-link) algorithm costs T = a(p)·α + b(p)·S·β for S bytes over p ranks,
α the latency of one message and β = 1/B the seconds per byte of one rank's link in one
direction. `coefficients` is the table of (a, b); `collective_time_s` evaluates it, and
`link_from_collective` inverts it (a measured whole-collective fit T = α_c + S·β_c gives
the link's α = α_c/a, β = β_c/b), so a fit measured at one p predicts another.

`cheapest_algorithm` prices every algorithm an implementation offers for a collective
(`CANDIDATES`; hierarchical all-reduce where the group spans nodes) and returns the
cheapest: what plans and `analyze` charge for a collective whose algorithm the plan has
not fixed. `send_recv_time_s` prices one rank's batch of point-to-point messages.

S is the size of one rank's buffer: the input of all-reduce, reduce-scatter, all-to-all,
broadcast and send; the *output* (gathered) buffer of all-gather. Derivations are in
docs/distributed.md; the reduction arithmetic (γ term) is left out: at link speeds below
memory bandwidth it is hidden in the copy, and a measured fit absorbs it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.distributed.links import AlphaBeta, LinkSpec
from planner.errors import FusionPlannerError


class CollectiveKind(enum.StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"


class Algorithm(enum.StrEnum):
    RING = "ring"  # p-1 (or 2(p-1)) neighbour steps, each S/p bytes: bandwidth-optimal
    TREE = "tree"  # binomial tree (reduce then broadcast): log2 p steps of the whole S
    HALVING_DOUBLING = "halving_doubling"  # Rabenseifner: log2 p steps, ring's volume
    DIRECT = "direct"  # pairwise exchange (all-to-all) or one message (send/recv)
    HIERARCHICAL = "hierarchical"  # intra-node reduce-scatter, inter-node ring, all-gather


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def coefficients(kind: CollectiveKind, algorithm: Algorithm, p: int) -> tuple[float, float]:
    """(a, b) with T = a·α + b·S·β for `kind` by `algorithm` over `p` ranks."""
    if p < 1:
        raise FusionPlannerError(f"a collective needs a group of at least 1 rank, got {p}")
    kind, algorithm = CollectiveKind(kind), Algorithm(algorithm)
    if p == 1:
        return 0.0, 0.0
    frac = (p - 1) / p
    table: dict[tuple[CollectiveKind, Algorithm], tuple[float, float]] = {
        # reduce-scatter then all-gather, each p-1 steps of S/p bytes
        (CollectiveKind.ALL_REDUCE, Algorithm.RING): (2 * (p - 1), 2 * frac),
        # binomial reduce to a root, then binomial broadcast: 2 log2 p steps of S bytes
        (CollectiveKind.ALL_REDUCE, Algorithm.TREE): (2 * _log2(p), 2 * _log2(p)),
        # recursive halving reduce-scatter + recursive doubling all-gather
        (CollectiveKind.ALL_REDUCE, Algorithm.HALVING_DOUBLING): (2 * _log2(p), 2 * frac),
        (CollectiveKind.ALL_GATHER, Algorithm.RING): (p - 1, frac),
        (CollectiveKind.ALL_GATHER, Algorithm.HALVING_DOUBLING): (_log2(p), frac),
        (CollectiveKind.REDUCE_SCATTER, Algorithm.RING): (p - 1, frac),
        (CollectiveKind.REDUCE_SCATTER, Algorithm.HALVING_DOUBLING): (_log2(p), frac),
        # each rank sends S/p to each of the p-1 others, one message each
        (CollectiveKind.ALL_TO_ALL, Algorithm.DIRECT): (p - 1, frac),
        (CollectiveKind.BROADCAST, Algorithm.TREE): (_log2(p), _log2(p)),
        # scatter then ring all-gather (van de Geijn)
        (CollectiveKind.BROADCAST, Algorithm.RING): (_log2(p) + p - 1, 2 * frac),
        (CollectiveKind.SEND_RECV, Algorithm.DIRECT): (1, 1),
    }
    if (kind, algorithm) not in table:
        known = sorted(a.value for k, a in table if k is kind)
        raise FusionPlannerError(
            f"no flat α-β formula for {kind.value} by {algorithm.value}; known: {known}"
            + (
                " (hierarchical: use hierarchical_all_reduce_s)"
                if algorithm.value == "hierarchical"
                else ""
            )
        )
    return table[(kind, algorithm)]


def collective_time_s(
    kind: CollectiveKind | str,
    algorithm: Algorithm | str,
    nbytes: float,
    p: int,
    link: LinkSpec | AlphaBeta,
) -> float:
    """Seconds for one collective of `nbytes` (see the module docstring for which buffer)
    over `p` ranks on one kind of link."""
    kind = CollectiveKind(kind)
    a, b = coefficients(kind, Algorithm(algorithm), p)
    ab = link.alpha_beta(nbytes, kind.value) if isinstance(link, LinkSpec) else link
    return a * ab.alpha_s + b * nbytes * ab.beta_s_per_byte


def hierarchical_all_reduce_s(
    nbytes: float,
    per_node: int,
    nodes: int,
    intra: LinkSpec | AlphaBeta,
    inter: LinkSpec | AlphaBeta,
) -> float:
    """All-reduce over `nodes` x `per_node` ranks: ring reduce-scatter inside each node,
    ring all-reduce of the S/per_node shard across nodes (one rank per node and shard),
    ring all-gather inside each node."""
    rs = collective_time_s(CollectiveKind.REDUCE_SCATTER, Algorithm.RING, nbytes, per_node, intra)
    shard = nbytes / per_node
    ar = collective_time_s(CollectiveKind.ALL_REDUCE, Algorithm.RING, shard, nodes, inter)
    ag = collective_time_s(CollectiveKind.ALL_GATHER, Algorithm.RING, nbytes, per_node, intra)
    return rs + ar + ag


def send_recv_time_s(
    sent_bytes: Sequence[float],
    received_bytes: Sequence[float],
    p: int,
    link: LinkSpec | AlphaBeta,
) -> float:
    """Seconds for one rank's batch of point-to-point messages over a group of `p` ranks:
    each message is one α + S·β (`SEND_RECV` by `DIRECT`); messages in one direction
    queue on the rank's link, the two directions run at once (β is one direction's), so
    the batch takes the longer of its sends and its receives. One message alone is the
    table's α + S·β."""

    def one_way(sizes: Sequence[float]) -> float:
        return sum(
            collective_time_s(CollectiveKind.SEND_RECV, Algorithm.DIRECT, n, p, link) for n in sizes
        )

    return max(one_way(sent_bytes), one_way(received_bytes))


# The algorithms an implementation offers per collective (NCCL: ring and tree for
# all-reduce and broadcast; ring alone for all-gather and reduce-scatter; all-to-all and
# send/recv one way): the candidates `cheapest_algorithm` chooses from. Halving-doubling
# (gloo, MPI) is priced by `coefficients` but not offered by default: with power-of-two
# groups it dominates both ring and tree in the α-β model.
CANDIDATES: dict[CollectiveKind, tuple[Algorithm, ...]] = {
    CollectiveKind.ALL_REDUCE: (Algorithm.RING, Algorithm.TREE),
    CollectiveKind.ALL_GATHER: (Algorithm.RING,),
    CollectiveKind.REDUCE_SCATTER: (Algorithm.RING,),
    CollectiveKind.ALL_TO_ALL: (Algorithm.DIRECT,),
    CollectiveKind.BROADCAST: (Algorithm.RING, Algorithm.TREE),
    CollectiveKind.SEND_RECV: (Algorithm.DIRECT,),
}


@dataclass(frozen=True)
class AlgorithmChoice:
    """The cheapest algorithm for one collective and every candidate's time, in
    candidate order."""

    algorithm: Algorithm
    seconds: float
    candidates: tuple[tuple[Algorithm, float], ...]

    def row(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm.value,
            "time_s": self.seconds,
            "candidates": {a.value: t for a, t in self.candidates},
        }


def cheapest_algorithm(
    kind: CollectiveKind | str,
    nbytes: float,
    p: int,
    link: LinkSpec | AlphaBeta,
    per_node: int | None = None,
    inter: LinkSpec | AlphaBeta | None = None,
) -> AlgorithmChoice:
    """The algorithm of `kind` with the least α-β time for `nbytes` over `p` ranks (ties:
    the earlier candidate, ring before tree). With `per_node` ranks per node and a group
    that spans nodes, a flat algorithm is priced on the `inter` link (its steps cross
    nodes, and the slowest link paces them), and an all-reduce may also run
    hierarchically (`hierarchical_all_reduce_s`: `link` inside a node, `inter` across)."""
    kind = CollectiveKind(kind)
    spans = bool(per_node) and p > (per_node or 0)
    if spans:
        if inter is None:
            raise FusionPlannerError("a group spanning nodes needs the link between nodes")
        if p % per_node:  # type: ignore[operator]
            raise FusionPlannerError(f"{p} ranks do not fill nodes of {per_node} evenly")
    flat_link = inter if spans and inter is not None else link
    priced = [(a, collective_time_s(kind, a, nbytes, p, flat_link)) for a in CANDIDATES[kind]]
    if spans and kind is CollectiveKind.ALL_REDUCE and inter is not None:
        nodes = p // per_node  # type: ignore[operator]
        hier = hierarchical_all_reduce_s(nbytes, per_node, nodes, link, inter)  # type: ignore[arg-type]
        priced.append((Algorithm.HIERARCHICAL, hier))
    best = min(priced, key=lambda r: r[1])  # min keeps the first of equal times
    return AlgorithmChoice(best[0], best[1], tuple(priced))


def link_from_collective(
    kind: CollectiveKind | str, algorithm: Algorithm | str, p: int, fit: AlphaBeta
) -> AlphaBeta:
    """The link's (α, β) behind a whole-collective fit T = α_c + S·β_c measured at `p`."""
    a, b = coefficients(CollectiveKind(kind), Algorithm(algorithm), p)
    if a == 0 or b == 0:
        raise FusionPlannerError(f"a collective over {p} rank(s) moves nothing; cannot invert")
    return AlphaBeta(
        fit.alpha_s / a, fit.beta_s_per_byte / b, fit.lo_bytes, fit.hi_bytes, fit.bridge
    )


# ---- pipeline parallelism -------------------------------------------------------------
class Schedule(enum.StrEnum):
    GPIPE = "gpipe"  # all forwards, then all backwards: m micro-batches in flight
    ONE_F_ONE_B = "1f1b"  # PipeDream-flush: warm-up, steady 1F1B, drain: <= p in flight
    INTERLEAVED = "interleaved"  # 1F1B with v model chunks per stage (Megatron-LM)


def bubble_fraction(
    schedule: Schedule | str, stages: int, microbatches: int, chunks: int = 1
) -> float:
    """Idle fraction of a pipeline step: (p-1)/(v·m + p-1) for p stages, m micro-batches,
    v chunks per stage (v = 1 for GPipe and 1F1B, whose bubbles are equal; 1F1B differs
    in memory: `in_flight_microbatches`). The bubble time (p-1)·(t_f + t_b)/v is divided
    by the whole step, m·(t_f + t_b) + the bubble; Narayanan et al. 2021 (§2.2.2) divide
    it by the ideal m·(t_f + t_b) instead, giving (1/v)·(p-1)/m."""
    if stages < 1 or microbatches < 1 or chunks < 1:
        raise FusionPlannerError(
            f"a pipeline needs stages, micro-batches and chunks >= 1; got {stages}, "
            f"{microbatches}, {chunks}"
        )
    schedule = Schedule(schedule)
    v = chunks if schedule is Schedule.INTERLEAVED else 1
    return (stages - 1) / (v * microbatches + stages - 1)


def in_flight_microbatches(schedule: Schedule | str, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations the first stage holds at its peak (GPipe, 1F1B;
    the interleaved schedule's, in (micro-batch, chunk) pairs, come from
    `pipeline.interleaved_order`)."""
    if Schedule(schedule) is Schedule.GPIPE:
        return microbatches
    return min(stages, microbatches)
