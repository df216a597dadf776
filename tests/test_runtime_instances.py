"""One dynamo graph, several module instances: dynamo passes parameters as arguments and
reuses a graph for every instance of a module class (the repeated layers around a graph
break; two models of one class compiled with one backend), while the runtime's lift bakes
one instance's parameters into the module it plans. Each instance must be served with its
own weights (before, every instance after the first got the first one's: a
`transformers` DistilBERT called with `output_attentions=True`, which breaks the graph in
every attention layer, returned hidden states off by 0.04)."""

from __future__ import annotations

import warnings

import torch

from planner.runtime.backend import fusion_planner_backend


class Block(torch.nn.Module):
    def __init__(self, graph_break: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.graph_break = graph_break

    def forward(self, x):
        h = torch.nn.functional.gelu(self.lin(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.norm(h + x) * 2


class Stack(torch.nn.Module):
    def __init__(self, n: int = 3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(graph_break=True) for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _serve(compiled, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            return compiled(x)


def test_two_models_of_one_class_on_one_backend_keep_their_own_weights():
    torch._dynamo.reset()
    torch.manual_seed(0)
    first, second = Block().eval(), Block().eval()
    x = torch.randn(2, 5, 8)
    backend = fusion_planner_backend(None, record_misses=False)
    a = torch.compile(first, backend=backend, dynamic=True)
    b = torch.compile(second, backend=backend, dynamic=True)
    got_a, got_b = _serve(a, x), _serve(b, x)
    with torch.no_grad():
        torch.testing.assert_close(got_a, first(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_b, second(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs == 1 and backend.stats.realized == 2, backend.stats
    torch._dynamo.reset()


def test_layers_around_a_graph_break_each_run_their_own_weights():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(2, 5, 8)
    backend = fusion_planner_backend(None, record_misses=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for _ in range(2):  # the second call goes through the per-instance lifts made by the first
        got = _serve(compiled, x)
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert not backend.stats.fallbacks, backend.stats
    torch._dynamo.reset()


def test_a_replaced_parameter_is_served_not_the_old_one():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 5, 8)
    backend = fusion_planner_backend(None, record_misses=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    _serve(compiled, x)
    model.lin.weight = torch.nn.Parameter(torch.randn(8, 8))
    with torch.no_grad():
        torch.testing.assert_close(_serve(compiled, x), model(x), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_gradients_of_each_instance_are_its_own():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Stack(2).eval()
    x = torch.randn(2, 5, 8)
    model(x).pow(2).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    backend = fusion_planner_backend(None, record_misses=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x).pow(2).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-3, atol=1e-4, msg=n)
    torch._dynamo.reset()
