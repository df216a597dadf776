"""The model's Python floats reach the backend as constants of dynamo's graph, not as
per-call tensor inputs; a float that changes later still gives eager's answer."""

from __future__ import annotations

import torch

from planner.runtime.backend import fusion_planner_backend


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16, eps=1e-5)
        self.fc = torch.nn.Linear(16, 16)
        self.scale = 0.125

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x)) * self.scale + x


def float_inputs(example_inputs: list) -> int:
    return sum(
        isinstance(t, torch.Tensor) and t.dim() == 0 and t.dtype == torch.float64
        for t in example_inputs
    )


def test_float_attributes_become_constants_and_a_changed_one_recompiles():
    torch.manual_seed(0)
    model = Block().eval()
    backend = fusion_planner_backend(None)
    seen: list[int] = []

    def spy(gm, example_inputs):
        seen.append(float_inputs(example_inputs))
        return backend(gm, example_inputs)

    fn = torch.compile(model, backend=spy, dynamic=True)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x))
        assert seen[0] > 0, "dynamo passed no float inputs: the case this test covers is gone"
        assert seen[-1] == 0, seen  # traced again with the floats constant
        compiled = len(seen)
        y = torch.randn(3, 7, 16)
        torch.testing.assert_close(fn(y), model(y))
        assert len(seen) == compiled  # another shape: no new trace for the floats
        model.scale = 0.5  # a float that changes: a guard fails, the frame recompiles
        torch.testing.assert_close(fn(y), model(y))
