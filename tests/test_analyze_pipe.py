"""`fusion-plan analyze --pp N --schedule S --microbatches M|auto`: the pipeline step."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from planner.distributed.comm_cost import bubble_fraction
from planner.distributed.dp import BACKWARD_FACTOR
from planner.distributed.links import get_link
from planner.distributed.pipeline import StageCost, p2p_time_s, price_microbatches
from planner.hardware import get_spec

B, D, HID = 8, 16, 32
MLP = ["--model", "zoo:mlp", "--shape", f"B={B},D={D},HID={HID}", "--device", "h100",
       "--dtype", "fp32", "--interconnect", "pcie4"]  # fmt: skip


def _run(capsys, *argv: str) -> dict:
    assert main(["analyze", *MLP, *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pp_prices_the_step_of_the_mlp_cut_into_stages(capsys, schedule) -> None:
    out = _run(capsys, "--pp", "2", "--schedule", schedule, "--microbatches", "4")
    rows = out["rows"]
    pipe = out["distributed"]["pipeline"]
    m, costs, step = 4, pipe["stage_costs"], pipe["step_model"]
    # the 5 ops (linear, relu, linear, relu, linear) cut once, contiguously, in op order
    (a0, a1), (b0, b1) = costs[0]["ops"], costs[1]["ops"]
    assert (a0, a1 == b0, b1) == (0, True, len(rows)) and 0 < a1 < len(rows)
    for c in costs:
        lo, hi = c["ops"]
        assert c["forward_s"] == pytest.approx(sum(r["predicted_s"] for r in rows[lo:hi]))
        assert c["backward_s"] == pytest.approx(BACKWARD_FACTOR * c["forward_s"])
        # each op is one kernel: the stage's fixed part is its launches
        assert c["forward_overhead_s"] == pytest.approx((hi - lo) * get_spec("h100").launch_s)
    # the cut falls after a linear or relu of width HID: one (B, HID) fp32 tensor crosses
    assert costs[0]["send_bytes"] == B * HID * 4 and costs[1]["send_bytes"] == 0
    send = p2p_time_s(B * HID * 4 / m, get_link("pcie4"))
    for s, (c, st) in enumerate(zip(costs, step["per_stage"])):
        # a micro-batch: the fixed part plus a quarter of the rest
        fo = c["forward_overhead_s"]
        assert st["forward_s"] == pytest.approx(fo + (c["forward_s"] - fo) / m)
        assert st["busy_s"] == pytest.approx(m * (st["forward_s"] + st["backward_s"]))
        assert st["busy_s"] + st["idle_s"] == pytest.approx(step["step_s"])
        want = m if schedule == "gpipe" else min(m, 2 - s)
        assert st["peak_in_flight"] == want
        assert step["memory_bytes"][s] == pytest.approx(want * c["activation_bytes"] / m)
    assert step["per_stage"][0]["send_s"] == pytest.approx(send)
    # measured on the timeline: at least the equal-stage bubble, at least one round trip
    assert pipe["bubble_fraction"] == bubble_fraction(schedule, 2, m)
    assert step["bubble_fraction_measured"] >= pipe["bubble_fraction"] - 1e-12
    assert step["exposed_p2p_s"] >= 2 * send * (1 - 1e-9)


def test_auto_takes_the_fastest_divisor_that_fits_the_activation_limit(capsys) -> None:
    free = _run(capsys, "--pp", "2", "--microbatches", "auto")["distributed"]["pipeline"]
    table = free["search"]
    assert [r["microbatches"] for r in table] == [1, 2, 4, 8]
    best = min(table, key=lambda r: r["step_s"])
    assert free["microbatches"] == best["microbatches"]
    # a limit below the fastest count's peak pushes the choice to one that fits
    limit_b = best["peak_memory_bytes"] * 0.999
    fits = [r for r in table if r["peak_memory_bytes"] <= limit_b]
    limited = _run(capsys, "--pp", "2", "--activation-limit-mb", str(limit_b / 2**20))
    pipe = limited["distributed"]["pipeline"]
    assert [r["fits"] for r in pipe["search"]] == [r in fits for r in table]
    assert fits and best not in fits
    assert pipe["microbatches"] == min(fits, key=lambda r: r["step_s"])["microbatches"]
    # text: the search table marks the chosen row
    assert main(["analyze", *MLP, "--pp", "2", "--activation-limit-mb", "1e-9"]) == 0
    text = capsys.readouterr().out
    assert "micro-batch search over the divisors of B=8" in text
    assert "no micro-batch count keeps every stage's activations within" in text


def test_text_breakdown(capsys) -> None:
    assert main(["analyze", *MLP, "--pp", "3", "--schedule", "gpipe", "--microbatches", "2"]) == 0
    text = capsys.readouterr().out
    assert "pipeline gpipe: 5 ops cut into 3 stages" in text
    assert "3 stages x 2 micro-batches of 4 samples: step" in text
    lines = text[text.index("in flight") :].splitlines()[1:4]
    assert [ln.split()[0] for ln in lines] == ["0", "1", "2"]
    assert [ln.split()[6] for ln in lines] == ["2", "2", "2"]  # GPipe holds every micro-batch


INTERLEAVED = ("--schedule", "interleaved", "--virtual-stages")


def test_interleaved_prices_the_step_over_chunks(capsys) -> None:
    p, v, m = 2, 2, 4
    out = _run(capsys, "--pp", str(p), *INTERLEAVED, str(v), "--microbatches", str(m))
    rows, pipe = out["rows"], out["distributed"]["pipeline"]
    costs, step = pipe["stage_costs"], pipe["step_model"]
    assert (pipe["virtual_stages"], step["chunks"], step["stages"]) == (v, v, p)
    # the 5 ops cut into v·p = 4 contiguous chunks; chunk k is chunk k // p of stage k % p
    assert [(c["stage"], c["chunk"]) for c in costs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [c["ops"][0] for c in costs] == [0] + [c["ops"][1] for c in costs[:-1]]
    assert costs[-1]["ops"][1] == len(rows) and costs[-1]["send_bytes"] == 0
    # the same costs through the library give the same step
    chunks = [
        StageCost(c["forward_s"], c["backward_s"], c["activation_bytes"], c["send_bytes"],
                  c["forward_overhead_s"], c["backward_overhead_s"])
        for c in costs
    ]  # fmt: skip
    row = price_microbatches("interleaved", chunks, m, get_link("pcie4"), chunks=v)
    assert step["step_s"] == pytest.approx(row.step.step_s)
    for d, st in enumerate(step["per_stage"]):
        # a stage's micro-batch runs all its chunks: each its fixed part plus 1/m of the rest
        mine = [c for c in costs if c["stage"] == d]
        want = sum(c["forward_overhead_s"] + (c["forward_s"] - c["forward_overhead_s"]) / m
                   for c in mine)  # fmt: skip
        assert st["forward_s"] == pytest.approx(want)
        assert st["busy_s"] == pytest.approx(m * (st["forward_s"] + st["backward_s"]))
        assert st["busy_s"] + st["idle_s"] == pytest.approx(step["step_s"])
        # Megatron's warm-up plus one, in (micro-batch, chunk) pairs
        assert st["peak_in_flight"] == min((p - d - 1) * 2 + (v - 1) * p + 1, v * m)
        # every chunk but the last virtual stage sends one message per micro-batch
        sends = [p2p_time_s(c["send_bytes"] / m, get_link("pcie4")) for c in mine]
        assert st["send_s"] == pytest.approx(sum(sends))
    assert pipe["bubble_fraction"] == bubble_fraction("interleaved", p, m, v)
    assert step["bubble_fraction_measured"] >= pipe["bubble_fraction"] - 1e-12
    assert step["exposed_p2p_s"] > 0
    # text
    assert main(["analyze", *MLP, "--pp", "2", *INTERLEAVED, "2", "--microbatches", "4"]) == 0
    text = capsys.readouterr().out
    assert "pipeline interleaved: 5 ops cut into 4 chunks in op order" in text
    assert "2 stages x 2 chunks x 4 micro-batches of 2 samples: step" in text
    assert "in flight counts (micro-batch, chunk) pairs" in text


def test_interleaved_with_one_chunk_is_1f1b(capsys) -> None:
    one_f = _run(capsys, "--pp", "2", "--schedule", "1f1b", "--microbatches", "4")
    inter = _run(capsys, "--pp", "2", *INTERLEAVED, "1", "--microbatches", "4")
    a, b = one_f["distributed"]["pipeline"], inter["distributed"]["pipeline"]
    assert b["step_model"]["step_s"] == a["step_model"]["step_s"]
    assert b["step_model"]["per_stage"] == a["step_model"]["per_stage"]


def test_interleaved_auto_searches_the_multiples_of_the_stages(capsys) -> None:
    out = _run(capsys, "--pp", "2", *INTERLEAVED, "2")
    pipe = out["distributed"]["pipeline"]
    assert [r["microbatches"] for r in pipe["search"]] == [2, 4, 8]  # divisors of B=8
    assert pipe["microbatches"] == min(pipe["search"], key=lambda r: r["step_s"])["microbatches"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pp", "0"], "--pp must be >= 1"),
        (["--pp", "2", "--microbatches", "x"], "positive integer or auto"),
        (["--pp", "2", "--microbatches", "-2"], "positive integer or auto"),
        (["--pp", "2", "--microbatches", "3"], "does not split the batch B=8"),
        (["--pp", "9"], "9 pipeline stages need at least 9 ops; the graph has 5"),
        (["--pp", "2", "--activation-limit-mb", "0"], "--activation-limit-mb must be > 0"),
        (["--pp", "2", "--microbatch-overhead-us", "1e9"], "exceeds stage 0's whole forward"),
        (["--pp", "2", "--schedule", "interleaved"], "needs --virtual-stages V"),
        (["--pp", "2", *INTERLEAVED, "0"], "--virtual-stages must be >= 1, got 0"),
        (["--pp", "2", "--virtual-stages", "2"], "--virtual-stages 2 needs --schedule interleaved"),
        (["--pp", "2", *INTERLEAVED, "2", "--microbatches", "1"], "a multiple of --pp 2"),
        (["--pp", "3", *INTERLEAVED, "2"], "multiples of --pp 3, and there are none"),
        (["--pp", "2", *INTERLEAVED, "3", "--microbatches", "2"], "6 chunks need at least 6 ops"),
    ],
)
def test_bad_pipeline_input_is_a_clear_message(capsys, argv, message) -> None:
    assert main(["analyze", *MLP, *argv]) != 0
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_overhead_flag_sets_the_fixed_part(capsys) -> None:
    out = _run(capsys, "--pp", "2", "--microbatches", "2", "--microbatch-overhead-us", "1")
    for c in out["distributed"]["pipeline"]["stage_costs"]:
        assert c["forward_overhead_s"] == pytest.approx(1e-6)
        assert c["backward_overhead_s"] == pytest.approx(BACKWARD_FACTOR * 1e-6)
