"""Hugging Face `generate` through the backend, as users decode: the prefill graph takes an
int argument (`logits_to_keep`) and the decode graph takes the KV cache's tensors, held by
a cache object passed as an argument. Both are planned, and the tokens are eager's."""

from __future__ import annotations

import warnings

import pytest
import torch

from planner.runtime.backend import fusion_planner_backend

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_generate_through_the_backend_plans_prefill_and_decode(name):
    from benchmarks.models import gpt2, llama

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, (ids,) = {"gpt2": gpt2, "llama": llama}[name].tiny(1, 8)
    model.eval()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    backend = fusion_planner_backend()
    model.forward = torch.compile(model.forward, backend=backend, dynamic=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        got = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch._dynamo.reset()
    s = backend.stats
    assert torch.equal(got, want)
    assert s.graphs == 2 and s.realized >= 2 and not s.fallbacks, s
    assert not s.per_shape, s  # each decode bucket is exported and realized whole


class _TakesAnInt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, keep: int):
        return torch.relu(self.proj(x))[:, -keep:]


def test_an_int_argument_is_baked_in_and_another_value_runs_dynamos_graph():
    torch._dynamo.reset()
    module = _TakesAnInt().eval()
    backend = fusion_planner_backend()
    compiled = torch.compile(module, backend=backend, dynamic=True)
    x = torch.randn(2, 5, 8)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for keep in (1, 1, 3, 2):
            torch.testing.assert_close(compiled(x, keep), module(x, keep))
    torch._dynamo.reset()
    s = backend.stats
    # one graph for every value: dynamo left `keep` symbolic, the plan baked in 1 and
    # the other values ran dynamo's graph
    assert s.graphs == 1 and not s.fallbacks and s.realized >= 1, s


@pytest.mark.slow
def test_generate_with_a_static_cache_updated_in_place_gives_eagers_tokens():
    """A static KV cache is written in place: the plan computes the cache's new values as
    outputs and writes them back into the cache, so both graphs are planned and the tokens
    are eager's."""
    from benchmarks.models import llama

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, (ids,) = llama.tiny(1, 8)
    model.eval()
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
    backend = fusion_planner_backend()
    model.forward = torch.compile(model.forward, backend=backend, dynamic=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        got = model.generate(ids, **kw)
    torch._dynamo.reset()
    assert torch.equal(got, want)
    s = backend.stats
    assert s.graphs == 2 and s.realized >= 2 and not s.fallbacks, s


@pytest.mark.slow
def test_the_generate_benchmark_runs_and_every_contender_gives_eagers_tokens(tmp_path):
    import json

    from benchmarks import generate

    out = tmp_path / "generate"
    args = ["--quick", "--models", "gpt2", "--prompt", "8", "--new-tokens", "4"]
    assert generate.main([*args, "--rounds", "2", "--warmup", "1", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [r["contender"] for r in rows] == list(generate.CONTENDERS)
    assert all(r["tokens_differ"] == 0 and r["median_s"] > 0 for r in rows)
    planner = next(r for r in rows if r["contender"] == "planner")
    assert planner["runtime_stats"]["realized"] >= 2 and not planner["runtime_stats"]["fallbacks"]
    assert "| gpt2 | planner |" in out.with_suffix(".md").read_text()
