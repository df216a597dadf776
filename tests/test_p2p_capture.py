"""Point-to-point transfers in the IR: functional isend / irecv / batch_p2p_ops captured
as send/recv collectives with their messages (bytes, peer, group size), priced by the α-β
formula, scheduled on the communication stream; a pipeline stage on 2 gloo ranks."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import zoo
from cli.main import main
from planner.distributed import parallel_models as pm
from planner.distributed.collectives import Message, collectives, price
from planner.distributed.comm_cost import Algorithm, CollectiveKind, collective_time_s
from planner.distributed.links import LINKS, AlphaBeta
from planner.distributed.overlap import COMM, COMPUTE, plan_tasks, schedule
from planner.errors import ModelSpecError
from planner.ir.capture import capture, export_model
from planner.ir.graph import Category
from profiling.commbench import run_ranks

needs_p2p = pytest.mark.skipif(
    not pm.has_functional_p2p(),
    reason=f"torch {torch.__version__} has no functional point-to-point ops (_c10d_functional.isend)",
)
B, S, D, H = 2, 8, 16, 2
ACT = B * S * D * 4  # one fp32 activation


class _Exchange(torch.nn.Module):
    """One batch: send `x` to rank 1 twice (two tags) and to rank 0, receive a smaller
    tensor from rank 1; then a lone isend of the sum to rank 1."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        ops = ["isend", "isend", "isend", "irecv"]
        out = fc.batch_p2p_ops_inplace(ops, [1, 1, 0, 1], [0, 1, 0, 2], [x, x, x, buf], self.group)
        got = fc.wait_tensor(out[3])
        y = x.sum() + got.sum()
        fc.wait_tensor(fc.isend_inplace(y.reshape(1), 1, 3, self.group))
        return y


@needs_p2p
def test_p2p_ops_are_send_recv_collectives_with_their_messages() -> None:
    g = capture(_Exchange(pm.capture_group(2)), (torch.randn(B, S, D), torch.empty(3, D)))
    batch, lone = collectives(g)
    assert batch.kind is lone.kind is CollectiveKind.SEND_RECV
    assert batch.group_size == lone.group_size == 2 and batch.algorithm is Algorithm.DIRECT
    # x is one input of the batch node but three messages
    sends = [Message("send", 1, ACT), Message("send", 1, ACT), Message("send", 0, ACT)]
    assert batch.messages == (*sends, Message("recv", 1, 3 * D * 4))
    assert batch.nbytes == 3 * ACT + 3 * D * 4
    assert lone.messages == (Message("send", 1, 4),) and lone.nbytes == 4
    # every other communication node is a wait, which moves nothing
    others = [n for n in g.nodes if n.category is Category.COLLECTIVE]
    assert {n.op for n in others if n.index not in (batch.node, lone.node)} == {"wait_tensor"}


@needs_p2p
def test_send_recv_is_priced_by_the_alpha_beta_formula() -> None:
    g = capture(_Exchange(pm.capture_group(2)), (torch.randn(B, S, D), torch.empty(3, D)))
    batch, lone = collectives(g)
    link = AlphaBeta(alpha_s=5e-6, beta_s_per_byte=1e-9)
    # one message: α + S·β
    assert price(lone, 2, link).seconds == pytest.approx(5e-6 + 4 * 1e-9)
    # a batch: the three sends queue on the outgoing direction (3α + 3·ACT·β), the receive
    # runs at once on the incoming one (α + 3·D·4·β): the longer of the two
    t = price(batch, 2, link)
    assert t.algorithm is Algorithm.DIRECT
    assert t.seconds == pytest.approx(max(3 * 5e-6 + 3 * ACT * 1e-9, 5e-6 + 3 * D * 4 * 1e-9))
    # a one-rank group moves nothing
    assert price(lone, 1, link).seconds == 0.0


@needs_p2p
def test_a_pipeline_stage_receives_computes_and_sends_on_the_critical_path() -> None:
    m, x = zoo.get("pp-block").build({"B": B, "S": S, "D": D, "H": H, "PP": 2, "STAGE": 2})
    recv_only = collectives(capture(m, x))
    assert [(c.kind, c.messages) for c in recv_only] == [
        (CollectiveKind.SEND_RECV, (Message("recv", 0, ACT),))
    ]
    first, x0 = zoo.get("pp-block").build({"B": B, "S": S, "D": D, "H": H, "PP": 2, "STAGE": 1})
    g = capture(first, x0)
    (send,) = collectives(g)
    assert send.messages == (Message("send", 1, ACT),)
    singletons = [frozenset((n.index,)) for n in g.nodes]
    tasks = plan_tasks(g, singletons, lambda grp: 1.0, lambda c: 10.0)
    # the send needs the block's output: nothing overlaps it, it is all exposed, and the
    # program ends with the waits on it (which nothing reads)
    tl = schedule(tasks)
    assert [t.stream for t in tasks].count(COMM) == 1
    assert tl.t_comm_s == 10.0 and tl.exposed_comm_s == pytest.approx(10.0)
    waits = [i for i, t in enumerate(tasks) if t.name.startswith("wait_tensor")]
    assert waits and all(tasks[i].stream == COMPUTE for i in waits)
    assert tasks[-1].name.startswith("wait_tensor") and tl.end_s[-1] == tl.makespan_s


@pytest.mark.skipif(pm.has_functional_p2p(), reason="this torch has the functional p2p ops")
def test_without_functional_p2p_a_pipeline_stage_says_what_is_missing() -> None:
    with pytest.raises(ModelSpecError, match="functional point-to-point ops"):
        zoo.get("pp-block").build({"B": B, "S": S, "D": D, "H": H, "PP": 2, "STAGE": 2})


def pipeline_on_ranks(rank: int, world: int) -> list[list[float]]:
    """Per rank: its stage of a `world`-stage pipeline of transformer blocks, captured on
    the gloo group (its transfer: direction code 1 send / 2 recv, bytes, peer, group
    size), the captured program run against the blocks applied in one process (max
    error), and a captured batch exchange (send a (3 + rank, D) tensor of the rank's
    number, receive the peer's: its messages and the received values' error). Gathered to rank 0 as floats."""
    group = dist.group.WORLD
    torch.manual_seed(0)
    blocks = [zoo.TransformerBlock(D, H) for _ in range(world)]  # the same on every rank
    x = torch.randn(B, S, D)
    with torch.no_grad():
        outs = [x]
        for b in blocks:
            outs.append(b(outs[-1]))
    stage = pm.PipelineStage(blocks[rank], rank, world, group)
    buf = x.clone() if rank == 0 else torch.empty_like(x)
    captured = export_model(stage, (buf,))
    (c,) = collectives(captured.graph)
    (msg,) = c.messages
    with torch.no_grad():
        (got,) = captured.program.module()(buf)
    err = float((got - outs[rank + 1]).abs().max())
    row = [1.0 if msg.direction == "send" else 2.0, msg.nbytes, msg.peer, c.group_size or 0, err]

    peer = 1 - rank
    mine, theirs = torch.full((3 + rank, D), float(rank)), torch.empty(3 + peer, D)

    class Swap(torch.nn.Module):
        def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
            out = fc.batch_p2p_ops_inplace(
                ["isend", "irecv"], [peer, peer], [7, 7], [x, buf], group
            )
            fc.wait_tensor(out[0])
            return fc.wait_tensor(out[1])

    swap = export_model(Swap(), (mine, theirs))
    (b,) = collectives(swap.graph)
    (received,) = swap.program.module()(mine, theirs)
    row += [
        v for m in b.messages for v in (1.0 if m.direction == "send" else 2.0, m.nbytes, m.peer)
    ]
    row.append(float((received - peer).abs().max()) if received.shape == (3 + peer, D) else -1.0)
    rows = [torch.zeros(len(row), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(rows, torch.tensor(row, dtype=torch.float64), group=group)
    return [r.tolist() for r in rows]


@needs_p2p
def test_pipeline_stages_capture_their_transfers_and_run_on_gloo() -> None:
    rows = run_ranks(2, "tests.test_p2p_capture:pipeline_on_ranks", timeout_s=60)
    (send, nb0, peer0, p0, err0, *swap0), (recv, nb1, peer1, p1, err1, *swap1) = rows
    # stage 0 sends its block's output to rank 1; stage 1 receives it from rank 0
    assert (send, nb0, peer0, p0) == (1, ACT, 1, 2) and (recv, nb1, peer1, p1) == (2, ACT, 0, 2)
    # stage 0's program gives block 0's output; stage 1's the two blocks' on the data it got
    assert err0 < 1e-5 and err1 < 1e-5, rows
    # the batch: rank r sends its (3 + r, D) and receives the peer's
    assert swap0 == [1, 3 * D * 4, 1, 2, 4 * D * 4, 1, 0.0]
    assert swap1 == [1, 4 * D * 4, 0, 2, 3 * D * 4, 0, 0.0]


@needs_p2p
def test_analyze_prints_a_stage_transfer_priced_on_the_link(capsys) -> None:
    shape = f"B={B},S={S},D={D},H={H},STAGE=1"
    argv = ["analyze", "--model", "zoo:pp-block", "--shape", shape, "--pp", "2", "--device",
            "h100", "--dtype", "fp32", "--interconnect", "pcie4"]  # fmt: skip
    assert main([*argv, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["distributed"]
    (c,) = out["collectives"]
    want = collective_time_s("send_recv", "direct", ACT, 2, LINKS["pcie4"])
    assert (c["kind"], c["bytes"], c["ranks"]) == ("send_recv", ACT, 2)
    assert c["messages"] == [{"direction": "send", "peer": 1, "nbytes": ACT}]
    assert c["time_s"] == pytest.approx(want)
    # the send needs the block's output: all of it is exposed
    assert out["forward"]["t_comm_s"] == pytest.approx(want)
    assert out["forward"]["exposed_comm_s"] == pytest.approx(want)
    assert out["pipeline"]["stages"] == 2
    # the pipeline step repeats the stage program: stage 0 sends its activation, the last none
    first, last = out["pipeline"]["stage_costs"]
    assert (first["send_bytes"], last["send_bytes"]) == (ACT, 0)
    assert first["forward_s"] == last["forward_s"] > 0
    assert main(argv) == 0
    assert f"send {ACT} to rank 1" in capsys.readouterr().out
    # --pp and the shape's PP must agree
    assert main([*argv[:-6], "--pp", "3", "--shape", f"{shape},PP=2"]) != 0
    assert "disagree" in capsys.readouterr().err
