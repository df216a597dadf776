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
from planner.distributed.links import LINKS, get_link

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


def test_dp_and_pp_what_if(capsys) -> None:
    out = _run(
        capsys,
        "--model",
        "zoo:tp-mlp",
        "--shape",
        SHAPE,
        "--tp",
        "2",
        "--dp",
        "4",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--device",
        "h100",
        "--dtype",
        "fp32",
        "--interconnect",
        "ib-hdr",
        "--bucket-mb",
        "0.0625",
    )
    step = out["distributed"]["train_step"]
    fwd = out["distributed"]["forward"]
    # backward is 2x forward compute; the step overlaps the gradient all-reduce with it
    assert step["t_comp_s"] == pytest.approx(3 * fwd["t_comp_s"] + fwd["t_comm_s"], rel=1e-6)
    assert step["t_comm_s"] > 0
    assert step["critical_path_s"] <= step["serial_sum_s"]
    assert out["distributed"]["pipeline"]["bubble_fraction"] == bubble_fraction("1f1b", 4, 8)


def test_tp_on_a_model_without_a_tp_variant_is_a_clear_error(capsys) -> None:
    code = main(["analyze", "--model", "zoo:mlp", "--shape", "B=2,D=16,HID=32", "--tp", "2"])
    assert code != 0
    assert "no tensor-parallel variant" in capsys.readouterr().err


def test_dp_across_nodes_is_priced_hierarchically(capsys) -> None:
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
    flat = _run(capsys, *argv)["distributed"]["train_step"]
    hier = _run(capsys, *argv, "--ranks-per-node", "8")["distributed"]["train_step"]
    grads = 4 * (64 * 128 + 128 + 64 * 128 + 64)  # the rank's shard: fc1, fc1 bias, fc2, bias
    # the link table's figures, measured ones preferred (nvlink4's are committed)
    nvlink, ib = get_link("nvlink4"), get_link("ib-ndr")
    want = hierarchical_all_reduce_s(grads, 8, 2, nvlink, ib)
    assert hier["t_comm_s"] == pytest.approx(want)  # one bucket holds every gradient
    assert flat["t_comm_s"] == pytest.approx(
        collective_time_s("all_reduce", "ring", grads, 16, nvlink)
    )


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
