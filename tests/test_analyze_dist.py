"""`fusion-plan analyze --tp/--dp/--pp/--interconnect`: the distributed what-if."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from planner.distributed.comm_cost import (
    bubble_fraction,
    collective_time_s,
    hierarchical_all_reduce_s,
)
from planner.distributed.dp import DDP_BUCKET_BYTES
from planner.distributed.links import LINKS, get_link
from planner.plans.plan import Plan

SHAPE = "B=2,S=16,D=64,HID=256"


def _run(capsys, *argv: str) -> dict:
    assert main(["analyze", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_tp_what_if_prices_the_all_reduce_on_the_named_link(capsys) -> None:
    out = _run(
        capsys,
        "--model",
        "zoo:tp-mlp",
        "--shape",
        SHAPE,
        "--tp",
        "2",
        "--device",
        "h100",
        "--dtype",
        "fp32",
        "--interconnect",
        "pcie4",
    )
    fwd = out["distributed"]["forward"]
    want = collective_time_s("all_reduce", "ring", 2 * 16 * 64 * 4, 2, LINKS["pcie4"])
    assert fwd["t_comm_s"] == pytest.approx(want)
    # the all-reduce feeds the bias add: nothing hides it
    assert fwd["exposed_comm_s"] == pytest.approx(want)
    assert fwd["critical_path_s"] == pytest.approx(fwd["t_comp_s"] + want)


def _dp_argv(*extra: str) -> list[str]:
    """analyze's flags for the 2-way TP MLP over 4 data-parallel ranks on ib-hdr, and `extra`."""
    return [
        "--model",
        "zoo:tp-mlp",
        "--shape",
        SHAPE,
        "--tp",
        "2",
        "--dp",
        "4",
        "--device",
        "h100",
        "--dtype",
        "fp32",
        "--interconnect",
        "ib-hdr",
        *extra,
    ]


def test_dp_and_pp_what_if(capsys) -> None:
    out = _run(capsys, *_dp_argv("--pp", "4", "--microbatches", "2", "--bucket-mb", "0.0625"))
    step = out["distributed"]["train_step"]
    fwd = out["distributed"]["forward"]
    # backward is 2x forward compute; the step overlaps the gradient all-reduce with it
    assert step["t_comp_s"] == pytest.approx(3 * fwd["t_comp_s"] + fwd["t_comm_s"], rel=1e-6)
    assert step["t_comm_s"] > 0
    assert step["critical_path_s"] <= step["serial_sum_s"]
    assert out["distributed"]["pipeline"]["bubble_fraction"] == bubble_fraction("1f1b", 4, 2)


def test_tp_on_a_model_without_a_tp_variant_is_a_clear_error(capsys) -> None:
    code = main(["analyze", "--model", "zoo:mlp", "--shape", "B=2,D=16,HID=32", "--tp", "2"])
    assert code != 0
    assert "no tensor-parallel variant" in capsys.readouterr().err


def test_dp_across_nodes_takes_the_cheapest_of_flat_and_hierarchical(capsys) -> None:
    argv = [
        "--model",
        "zoo:tp-mlp",
        "--shape",
        SHAPE,
        "--tp",
        "2",
        "--dp",
        "16",
        "--device",
        "h100",
        "--dtype",
        "fp32",
        "--interconnect",
        "nvlink4",
        "--bucket-mb",
        "1024",
    ]
    flat = _run(capsys, *argv)["distributed"]
    hier = _run(capsys, *argv, "--ranks-per-node", "8")["distributed"]
    grads = 4 * (64 * 128 + 128 + 64 * 128 + 64)  # the rank's shard: fc1, fc1 bias, fc2, bias
    # the link table's figures, measured ones preferred (nvlink4's are committed)
    nvlink, ib = get_link("nvlink4"), get_link("ib-ndr")
    # across nodes a flat algorithm runs at the inter-node link's pace
    across = {
        "ring": collective_time_s("all_reduce", "ring", grads, 16, ib),
        "tree": collective_time_s("all_reduce", "tree", grads, 16, ib),
        "hierarchical": hierarchical_all_reduce_s(grads, 8, 2, nvlink, ib),
    }
    (bucket,) = hier["gradient_buckets"]["buckets"]  # one bucket holds every gradient
    assert bucket["bytes"] == grads
    assert bucket["candidates"] == pytest.approx(across)
    assert bucket["algorithm"] == min(across, key=across.__getitem__)
    assert hier["train_step"]["t_comm_s"] == pytest.approx(min(across.values()))
    inside = {a: collective_time_s("all_reduce", a, grads, 16, nvlink) for a in ("ring", "tree")}
    assert flat["train_step"]["t_comm_s"] == pytest.approx(min(inside.values()))
    assert flat["gradient_buckets"]["buckets"][0]["algorithm"] == min(inside, key=inside.get)


def test_plan_reports_the_chosen_partition_over_two_streams(capsys) -> None:
    assert (
        main(
            [
                "plan",
                "--model",
                "zoo:tp-mlp",
                "--shape",
                SHAPE,
                "--device",
                "h100",
                "--dtype",
                "fp32",
                "--interconnect",
                "pcie4",
                "--format",
                "json",
            ]
        )
        == 0
    )
    streams = json.loads(capsys.readouterr().out)["streams"]
    want = collective_time_s("all_reduce", "ring", 2 * 16 * 64 * 4, 2, LINKS["pcie4"])
    assert streams["t_comm_s"] == pytest.approx(want)
    assert streams["critical_path_s"] == pytest.approx(
        streams["t_comp_s"] + streams["exposed_comm_s"]
    )


@pytest.mark.slow  # about 10 s; tests/test_tp_plan_record.py runs `plan` on the same block
# and checks its chosen decision in the default run
def test_plan_prices_the_tensor_parallel_decisions_of_a_captured_block(capsys) -> None:
    args = ["plan", "--model", "zoo:tp-block", "--shape", "B=2,S=16,D=64,H=4", "--device"]
    assert main([*args, "h100", "--interconnect", "nvlink4", "--format", "json"]) == 0
    tp = json.loads(capsys.readouterr().out)["tensor_parallel"]
    assert len(tp["sites"]) == 2 and tp["ranks"] == 2 and tp["link"] == "nvlink4"
    table = {row["decision"]: row for row in tp["table"]}
    assert len(table) == 6
    assert table[tp["chosen"]]["total_s"] == min(r["total_s"] for r in table.values())
    # chunking splits each all-reduce: k messages, each paying the latency again
    assert table["k=2"]["t_comm_s"] > table["k=1"]["t_comm_s"]
    assert main([*args, "h100"]) == 0
    assert "<- chosen" in capsys.readouterr().out


def test_dp_bucket_size_is_searched_unless_given(capsys) -> None:
    out = _run(capsys, *_dp_argv())["distributed"]
    gb, step = out["gradient_buckets"], out["train_step"]
    table = {r["bucket_bytes"]: r["predicted_s"] for r in gb["table"]}
    assert step["bucket_bytes"] == gb["searched_bytes"] == gb["used_bytes"]
    assert gb["searched_predicted_s"] == min(table.values())
    assert step["critical_path_s"] == pytest.approx(gb["searched_predicted_s"])
    assert table[DDP_BUCKET_BYTES] == gb["ddp_default_predicted_s"]
    assert gb["searched_predicted_s"] <= gb["ddp_default_predicted_s"]
    fixed = _run(capsys, *_dp_argv("--bucket-mb", "0.0625"))["distributed"]
    assert fixed["train_step"]["bucket_bytes"] == 65536 == fixed["gradient_buckets"]["used_bytes"]
    assert fixed["gradient_buckets"]["searched_bytes"] == gb["searched_bytes"]  # still shown
    assert fixed["gradient_buckets"]["override_predicted_s"] == pytest.approx(
        fixed["train_step"]["critical_path_s"]
    )
    assert main(["analyze", *_dp_argv()]) == 0
    text = capsys.readouterr().out
    assert "searched" in text and "DDP default" in text


# zoo:mlp with one hidden layer: gradients 4 KiB (fc2 bias), 16 MiB, 16 KiB, 16 MiB in
# DDP's ready order, 32 MiB in all: more than DDP's 25 MiB bucket holds
SYNC = "D=1024,HID=4096,L=1,DP=2"
SYNC_GRADS = (4 * 1024, 4 * 4096 * 1024, 4 * 4096, 4 * 1024 * 4096)


def _sync_all_reduce(nbytes: int) -> float:
    link = get_link("ib-hdr")
    return min(collective_time_s("all_reduce", a, nbytes, 2, link) for a in ("ring", "tree"))


def test_gradient_sync_graph_gets_its_bucket_size(capsys) -> None:
    argv = ["--model", "zoo:dp-grad-sync", "--shape", SYNC, "--device", "h100", "--dtype", "fp32"]
    gb = _run(capsys, *argv, "--interconnect", "ib-hdr")["distributed"]["gradient_buckets"]
    ar = _sync_all_reduce
    # no backward in the graph: every gradient is ready at once and the all-reduces run
    # back to back; DDP's 1 MiB first bucket closes once the first 16 MiB weight joins
    # the 4 KiB bias, the 25 MiB bucket takes the rest (16 KiB + 16 MiB stay under it);
    # one bucket holding everything (a cap over 32 MiB + 16 KiB) saves one latency
    total = sum(SYNC_GRADS)
    assert gb["ddp_default_predicted_s"] == pytest.approx(
        ar(SYNC_GRADS[0] + SYNC_GRADS[1]) + ar(SYNC_GRADS[2] + SYNC_GRADS[3])
    )
    assert gb["searched_predicted_s"] == pytest.approx(ar(total))
    assert gb["searched_bytes"] > total - SYNC_GRADS[3]
    assert gb["searched_predicted_s"] < gb["ddp_default_predicted_s"]
    assert [b["bytes"] for b in gb["buckets"]] == [total]


def test_plan_records_the_gradient_bucket_decision(capsys, tmp_path) -> None:
    path = tmp_path / "plan.json"
    argv = [
        "plan",
        "--model",
        "zoo:dp-grad-sync",
        "--shape",
        SYNC,
        "--device",
        "h100",
        "--dtype",
        "fp32",
    ]
    assert (
        main([*argv, "--interconnect", "ib-hdr", "--save-plan", str(path), "--format", "json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    saved = Plan.from_json(json.loads(path.read_text()))
    dp = saved.data_parallel
    assert dp is not None and dp.ranks == 2 and dp.link == "ib-hdr"
    assert dp.bucket_bytes == out["data_parallel"]["searched_bytes"]
    total = sum(SYNC_GRADS)
    assert dp.predicted_s == pytest.approx(_sync_all_reduce(total))
    assert dp.ddp_default_predicted_s == out["data_parallel"]["ddp_default_predicted_s"]
    assert out["plan"]["data_parallel"]["bucket_bytes"] == dp.bucket_bytes
    assert dp.step_model == "two-stream"  # GPU ranks on a datasheet link: NCCL
    assert out["data_parallel"]["step_model"]["name"] == "two-stream"


MLP = ["--model", "zoo:mlp", "--shape", "B=8,D=64,HID=256", "--dtype", "fp32", "--dp", "2"]


@pytest.mark.parametrize(
    ("device", "flag", "model"),
    [
        ("cpu", (), "serial"),  # CPU ranks: gloo on the backward's cores
        ("h100", (), "two-stream"),  # GPU ranks: NCCL on its own stream
        ("h100", ("--dp-step-model", "serial"), "serial"),
        ("cpu", ("--dp-step-model", "two-stream"), "two-stream"),
    ],
)
def test_the_dp_step_model_is_chosen_by_the_ranks_unless_named(capsys, device, flag, model) -> None:
    argv = [*MLP, "--device", device, "--interconnect", "ib-hdr", *flag]
    out = _run(capsys, *argv)["distributed"]
    gb, step = out["gradient_buckets"], out["train_step"]
    assert gb["step_model"]["name"] == step["step_model"] == model
    # the training step reported is the searched size's price under that model
    assert step["critical_path_s"] == pytest.approx(gb["searched_predicted_s"])
    if model == "serial":  # nothing overlaps: every all-reduce is exposed
        assert step["exposed_comm_s"] == pytest.approx(step["t_comm_s"])


def test_plan_records_the_step_model_that_priced_the_bucket_size(capsys, tmp_path) -> None:
    path = tmp_path / "plan.json"
    argv = ["plan", "--model", "zoo:dp-grad-sync", "--shape", "D=64,HID=256,L=1,DP=2"]
    assert main([*argv, "--device", "cpu", "--dtype", "fp32", "--save-plan", str(path)]) == 0
    assert "step model serial" in capsys.readouterr().out
    dp = Plan.from_json(json.loads(path.read_text())).data_parallel
    assert dp is not None and dp.step_model == "serial"


def test_each_collective_reports_its_cheapest_algorithm(capsys) -> None:
    # the captured all-reduce over the TP pair, and the gradient bucket over 64 DP ranks
    argv = ["--model", "zoo:tp-mlp", "--shape", SHAPE, "--tp", "2", "--dp", "64"]
    argv += ["--device", "h100", "--dtype", "fp32", "--interconnect", "pcie4"]
    out = _run(capsys, *argv)["distributed"]
    link = get_link("pcie4")

    def priced(nbytes: int, p: int) -> dict[str, float]:
        return {a: collective_time_s("all_reduce", a, nbytes, p, link) for a in ("ring", "tree")}

    (c,) = out["collectives"]
    want = priced(2 * 16 * 64 * 4, 2)  # B·S·D fp32 over the pair: ring (tree moves 2 S)
    assert (c["bytes"], c["ranks"]) == (2 * 16 * 64 * 4, 2)
    assert c["candidates"] == pytest.approx(want)
    assert c["algorithm"] == min(want, key=want.__getitem__) == "ring"
    assert out["forward"]["t_comm_s"] == pytest.approx(want["ring"])
    (b,) = out["gradient_buckets"]["buckets"]  # 66 KB of gradients: one bucket
    grads = priced(b["bytes"], 64)  # 126 latencies by ring against 12 by tree
    assert b["candidates"] == pytest.approx(grads)
    assert b["algorithm"] == min(grads, key=grads.__getitem__)
    if link.measured is None:  # the datasheet's 5 us, 32 GB/s: latency-bound, tree
        assert b["algorithm"] == "tree"
    assert main(["analyze", *argv]) == 0
    text = capsys.readouterr().out
    assert "ring (ring" in text and "1 tree (the cheapest algorithm per bucket)" in text
