"""Which device a realization runs on: the program's tensors decide, and a CPU scalar
constant lifted by export (a `torch.tensor(x)` built in forward) does not stand in the way
of a GPU program. CUDA tensors here are fake ones, so this runs on any machine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from planner.errors import PlanError
from planner.realize.graph import device_of


def _parts_and_captured(inputs, state):
    parts = SimpleNamespace(state=state)
    captured = SimpleNamespace(example_inputs=tuple(inputs), planning_only=False)
    return parts, captured


def test_a_cpu_scalar_constant_does_not_block_a_cuda_program():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 8, device="cuda")
        w = torch.empty(8, 8, device="cuda")
    scale = torch.tensor(8.0) ** 0.5  # what export lifts from DeBERTa's attention scale
    parts, captured = _parts_and_captured([x], {"w": w, "c_scale": scale})
    assert device_of(parts, captured, None).type == "cuda"
    assert device_of(parts, captured, "cuda").type == "cuda"


def test_a_cpu_tensor_with_dimensions_in_a_cuda_program_is_refused():
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 8, device="cuda")
    table = torch.zeros(4)
    parts, captured = _parts_and_captured([x], {"table": table})
    with pytest.raises(PlanError, match="tensors on \\['cpu', 'cuda'\\]"):
        device_of(parts, captured, "cuda")


def test_a_cpu_program_asked_to_run_on_cuda_is_refused():
    parts, captured = _parts_and_captured([torch.zeros(2)], {"s": torch.tensor(1.0)})
    with pytest.raises(PlanError, match="realize on cuda"):
        device_of(parts, captured, "cuda")
