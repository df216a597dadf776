"""Collectives as IR ops: which transfer an OpNode is, how many bytes, over how many
ranks, by which algorithm.

Capture reads torch.distributed functional collectives (`_c10d_functional.all_reduce`,
`all_gather_into_tensor`, `reduce_scatter_tensor`, `all_to_all_single`, `broadcast`) and
point-to-point transfers (`isend`, `irecv`, `batch_p2p_ops`; torch releases that have
them) as `Category.COLLECTIVE` nodes (planner.ir.taxonomy) and records the group's size
as the attribute `group_size`; `wait_tensor` is the point where the result is first
needed and moves nothing. A point-to-point node is one `SEND_RECV` collective whose
`messages` say what goes to or comes from which peer; a batch is priced with both
directions of the link at once (comm_cost.send_recv_time_s). The algorithm is a planning decision, not something the graph says: it is
the attribute `algorithm` where a plan set one (`fixed`), else the kind's default below,
and `price` charges the cheapest algorithm of the kind unless one is fixed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch.distributed as dist

from planner.distributed.comm_cost import (
    Algorithm,
    AlgorithmChoice,
    CollectiveKind,
    cheapest_algorithm,
    collective_time_s,
    hierarchical_all_reduce_s,
    send_recv_time_s,
)
from planner.distributed.links import AlphaBeta, LinkSpec
from planner.errors import FusionPlannerError
from planner.ir.graph import Category, OpGraph, OpNode
from planner.ir.taxonomy import packet_of

# functional-collective op -> kind
KIND_OF_OP: dict[str, CollectiveKind] = {
    "all_reduce": CollectiveKind.ALL_REDUCE,
    "all_gather_into_tensor": CollectiveKind.ALL_GATHER,
    "reduce_scatter_tensor": CollectiveKind.REDUCE_SCATTER,
    "all_to_all_single": CollectiveKind.ALL_TO_ALL,
    "broadcast": CollectiveKind.BROADCAST,
    "isend": CollectiveKind.SEND_RECV,
    "irecv": CollectiveKind.SEND_RECV,
    "batch_p2p_ops": CollectiveKind.SEND_RECV,
}
# point-to-point op (or a batch's op_list entry) -> the direction of its message
_DIRECTION = {"isend": "send", "irecv": "recv"}
# the algorithm a collective gets unless the plan chooses another (NCCL's and gloo's
# default for large messages)
DEFAULT_ALGORITHM: dict[CollectiveKind, Algorithm] = {
    CollectiveKind.ALL_REDUCE: Algorithm.RING,
    CollectiveKind.ALL_GATHER: Algorithm.RING,
    CollectiveKind.REDUCE_SCATTER: Algorithm.RING,
    CollectiveKind.ALL_TO_ALL: Algorithm.DIRECT,
    CollectiveKind.BROADCAST: Algorithm.TREE,
    CollectiveKind.SEND_RECV: Algorithm.DIRECT,
}


@dataclass(frozen=True)
class Message:
    """One point-to-point message of this rank: `direction` "send" or "recv", `peer` the
    other rank as the op names it (a global rank), `nbytes` the tensor sent or received."""

    direction: str
    peer: int
    nbytes: int


@dataclass(frozen=True)
class Collective:
    """One transfer: `nbytes` is the buffer the α-β formula takes (comm_cost: the input,
    or the gathered output of an all-gather; for send/recv every message's bytes,
    `messages` one entry per message)."""

    node: int  # OpNode index
    kind: CollectiveKind
    nbytes: int
    group_size: int | None  # None where capture could not resolve the group
    algorithm: Algorithm
    fixed: bool = False  # the plan set `algorithm`; else it is the kind's default
    messages: tuple[Message, ...] = ()  # send/recv only


def group_size_of(group_name: str) -> int | None:
    """The size of the process group torch registered under `group_name`, or None."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    with contextlib.suppress(Exception):  # a private torch helper: absent means unknown
        return int(dist.distributed_c10d._resolve_process_group(group_name).size())
    return None


def collective_of(graph: OpGraph, node: OpNode) -> Collective | None:
    """The transfer `node` makes, or None (not a collective, or a `wait_tensor`)."""
    op = packet_of(node.target)
    if node.category is not Category.COLLECTIVE or op not in KIND_OF_OP:
        return None
    kind = KIND_OF_OP[op]
    attrs = dict(node.attrs)
    size = attrs.get("group_size")
    messages = _messages(graph, node, op, attrs) if kind is CollectiveKind.SEND_RECV else ()
    if messages:
        nbytes = sum(m.nbytes for m in messages)
    elif kind is CollectiveKind.ALL_GATHER:
        nbytes = sum(graph.tensors[t].nbytes for t in node.outputs)
    else:
        nbytes = graph.tensors[node.inputs[0]].nbytes if node.inputs else 0
    algorithm = Algorithm(attrs.get("algorithm", DEFAULT_ALGORITHM[kind]))
    fixed = "algorithm" in attrs
    return Collective(
        node.index, kind, nbytes, int(size) if size else None, algorithm, fixed, messages
    )


def _messages(graph: OpGraph, node: OpNode, op: str, attrs: dict) -> tuple[Message, ...]:
    """The messages of a point-to-point node: `isend` sends its input to `dst`, `irecv`
    fills its input (the buffer) from `src`; `batch_p2p_ops` does one per entry of
    `op_list`, with the tensor of the same position (capture records their bytes as
    `tensor_bytes`: a tensor sent twice is one input of the node but two messages)."""
    if op == "batch_p2p_ops":
        ops, peers = attrs.get("op_list", ()), attrs.get("peer_list", ())
        sizes = attrs.get("tensor_bytes")
        if sizes is None:  # a graph not built by capture: the inputs in order
            sizes = [graph.tensors[t].nbytes for t in node.inputs]
        return tuple(
            Message(_DIRECTION.get(str(o), str(o)), int(p), int(n))
            for o, p, n in zip(ops, peers, sizes, strict=False)
        )
    peer = attrs.get("dst" if op == "isend" else "src", -1)
    nbytes = graph.tensors[node.inputs[0]].nbytes if node.inputs else 0
    return (Message(_DIRECTION[op], int(peer), nbytes),)


def collectives(graph: OpGraph) -> list[Collective]:
    return [c for n in graph.nodes if (c := collective_of(graph, n)) is not None]


def require_group_size(c: Collective, default: int | None) -> int:
    if c.group_size is not None:
        return c.group_size
    if default is not None:
        return default
    raise FusionPlannerError(
        f"collective node {c.node} ({c.kind.value}) has no known group size: capture it "
        "with its process group initialized, or give the size (e.g. --tp / --dp)"
    )


def price(
    c: Collective,
    p: int,
    link: LinkSpec | AlphaBeta,
    per_node: int | None = None,
    inter: LinkSpec | AlphaBeta | None = None,
) -> AlgorithmChoice:
    """The time of `c` over `p` ranks: by the algorithm the plan fixed, else by the
    cheapest one of its kind (comm_cost.cheapest_algorithm, with `per_node` ranks per
    node and `inter` between nodes where the group spans nodes). Point-to-point messages
    go direct (comm_cost.send_recv_time_s), on `inter` where the group spans nodes: the
    capture does not say on which node the peer is."""
    if c.messages:  # one way to send: every message direct, both directions at once
        spans = bool(per_node) and p > (per_node or 0) and inter is not None
        t = send_recv_time_s(
            [m.nbytes for m in c.messages if m.direction == "send"],
            [m.nbytes for m in c.messages if m.direction != "send"],
            p,
            inter if spans else link,  # type: ignore[arg-type]
        )
        return AlgorithmChoice(Algorithm.DIRECT, t, ((Algorithm.DIRECT, t),))
    if not c.fixed:
        return cheapest_algorithm(c.kind, c.nbytes, p, link, per_node, inter)
    if c.algorithm is Algorithm.HIERARCHICAL:
        if not per_node or inter is None or p % per_node:
            raise FusionPlannerError(
                f"collective node {c.node} is fixed to hierarchical but {p} ranks are not "
                "whole nodes of a known size (give --ranks-per-node)"
            )
        t = hierarchical_all_reduce_s(c.nbytes, per_node, p // per_node, link, inter)
    else:
        spans = bool(per_node) and p > (per_node or 0) and inter is not None
        t = collective_time_s(c.kind, c.algorithm, c.nbytes, p, inter if spans else link)  # type: ignore[arg-type]
    return AlgorithmChoice(c.algorithm, t, ((c.algorithm, t),))
