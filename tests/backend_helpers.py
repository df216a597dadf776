"""Helpers the fault tests share for driving the runtime backend (imported as
`tests.backend_helpers`, like `tests.partition_helpers`)."""

from __future__ import annotations

import torch

import zoo


class Recording:
    """A realizer that runs the captured program as it is and records each plan (the
    backend's choices are what these tests check; planner.realize.realizer has its own tests)."""

    def __init__(self):
        self.plans: list = []

    def __call__(self, captured, plan):
        self.plans.append(plan)
        return captured.program.module()


def small_block() -> torch.nn.Module:
    """The zoo transformer block at D=32 (inputs (b, s, 32))."""
    return zoo.get("transformer-block").build({"B": 2, "S": 16, "D": 32, "H": 4})[0]


class PositionSlice(torch.nn.Module):
    """Export traces it into other ops by length: `pos[:, :S]` (a table of 16 positions)
    is an identity slice at S=16, which a static export drops, and a real one below."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 16, 32))
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        return torch.tanh(h * 2 + self.pos[:, : x.shape[1]]) + 1


def run_shapes(compiled, module, sizes, d=32, b=2) -> None:
    """Call `compiled` at each sequence length and check it against `module`."""
    for s in sizes:
        x = torch.randn(b, s, d)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)


class ReadsLastFirst(torch.nn.Module):
    """`forward(memory, tokens)` uses `tokens` first (as a `transformers` encoder-decoder
    called with keyword arguments reads `decoder_input_ids` first): dynamo numbers the
    inputs tokens, memory, the call memory, tokens."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(32, 32)
        self.kv = torch.nn.Linear(32, 32)

    def forward(self, memory, tokens):
        q = torch.relu(self.q(tokens * 2))
        k = torch.tanh(self.kv(memory))
        return torch.softmax(q @ k.transpose(1, 2), -1) @ k


class BreakBetweenLayers(torch.nn.Module):
    """Two MLP layers with a graph break between them (as a `print` or a `.item()`
    branch makes): torch.compile serves it as two graphs. `flatten`: the first layer's
    output is flattened to (B*S, 32) before the break, so the second graph's input has an
    axis that moves with S without being S."""

    def __init__(self, flatten: bool = False):
        super().__init__()
        self.flatten = flatten
        self.a1, self.a2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.b1, self.b2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        h = x + self.a2(torch.nn.functional.gelu(self.a1(x)))
        if self.flatten:
            h = h.reshape(-1, 32)
        torch._dynamo.graph_break()
        out = h + self.b2(torch.nn.functional.gelu(self.b1(h)))
        return out.reshape(x.shape).softmax(-1)


class _Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + x


class HalvingLayers(torch.nn.Module):
    """One layer called twice, on the whole sequence and then on its first half, with a
    graph break in the loop: dynamo runs the loop eagerly, compiles the layer's code once
    and serves both sizes with that graph."""

    def __init__(self):
        super().__init__()
        self.layer = _Residual()

    def forward(self, x):
        for _ in range(2):
            x = self.layer(x)
            torch._dynamo.graph_break()
            x = x[:, : x.shape[1] // 2]
        return x
