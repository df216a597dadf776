"""Tolerances and the eager check (planner.realize.check, profiling.verify)."""

from __future__ import annotations

import math

import torch

import zoo
from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.realize.check import compare_tensor
from planner.realize.realizer import realize
from profiling.verify import (
    TOLERANCES,
    compare_outputs,
    tolerance_for,
    verify_against_eager,
)


def test_tolerances_follow_the_dtype_precision():
    fp32, fp16, bf16 = (TOLERANCES[d] for d in ("float32", "float16", "bfloat16"))
    assert fp32.rtol < fp16.rtol < bf16.rtol  # fewer mantissa bits, looser
    assert tolerance_for(torch.bfloat16) is bf16 and tolerance_for("float32") is fp32
    assert all(t.why for t in TOLERANCES.values())


def test_a_few_ulps_pass_and_a_real_error_fails():
    ref = torch.randn(64, 64)
    assert compare_tensor(ref, ref * (1 + 1e-6)) is None
    bad = compare_tensor(ref, ref + 0.1)
    assert (
        bad is not None
        and bad.bad_fraction > 0.5
        and math.isclose(bad.max_abs_err, 0.1, rel_tol=1e-3)
    )


def test_bf16_tolerance_accepts_what_fp32_tolerance_rejects():
    ref = torch.randn(256)
    got = ref + 0.01
    assert compare_tensor(ref, got) is not None  # fp32 reference: 1e-2 is a real error
    assert compare_tensor(ref.bfloat16(), got.bfloat16()) is None  # bf16: rounding noise


def test_shape_dtype_nan_and_integer_rules():
    ref = torch.randn(4, 4)
    assert "shape" in compare_tensor(ref, ref[:2]).reason
    assert "dtype" in compare_tensor(ref, ref.double()).reason
    nan = torch.tensor([1.0, float("nan")])
    assert compare_tensor(nan, nan.clone()) is None
    assert compare_tensor(torch.tensor([1, 2]), torch.tensor([1, 3])) is not None
    assert compare_outputs((ref, ref), [ref]).reason.startswith("1 outputs")


def test_verify_a_realized_plan_and_catch_a_wrong_one():
    module, inputs = zoo.get("mlp").build({"B": 4, "D": 16, "HID": 32, "L": 2})
    c = export_model(module, inputs)
    r = realize(c, Partition.singletons(c.graph))
    report = verify_against_eager(r, module, inputs, trials=3)
    assert report.ok and report.trials == 3 and "matches eager" in str(report)
    wrong = verify_against_eager(lambda x: module(x) * 1.01 + 0.1, module, inputs)
    assert not wrong.ok and wrong.trials == 1 and "DISAGREES" in str(wrong)


def test_fp32_values_computed_from_bf16_get_the_bf16_tolerance():
    torch.manual_seed(0)
    a, b = (torch.randn(4096) * 3).bfloat16(), (torch.randn(4096) * 3).bfloat16()
    eager = (a + b).float()  # eager rounds the sum to bf16, then widens it
    fused = a.float() + b.float()  # a fused kernel keeps the sum in fp32
    assert compare_tensor(eager, fused) is not None
    assert compare_tensor(eager, fused, at_least=torch.bfloat16) is None
    assert compare_outputs([eager], [fused], torch.bfloat16) is None
