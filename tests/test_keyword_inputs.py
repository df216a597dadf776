"""Factories that give keyword arguments: an encoder-decoder model called as its users call
it (`model(input_ids=..., decoder_input_ids=...)`), tuned by `fusion-plan tune` and then
served by the backend from the tuned plan."""

from __future__ import annotations

import warnings

import pytest
import torch

from cli.main import main
from planner.runtime.backend import fusion_planner_backend
from zoo.modelspec import KeywordCall, resolve

T = pytest.importorskip("transformers")

FACTORY = """
import torch
import transformers as T


def factory(B=2, S=16):
    cfg = T.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                     decoder_start_token_id=0)
    model = T.T5ForConditionalGeneration(cfg).eval()
    return model, {"input_ids": torch.randint(0, 96, (B, S)),
                   "decoder_input_ids": torch.randint(0, 96, (B, 8))}
"""


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "seq2seq.py"
    path.write_text(FACTORY)
    return f"{path}:factory"


def test_keyword_inputs_become_a_positional_call_of_the_same_model(factory):
    spec = resolve(factory, "B=2,S=16")
    module, inputs = spec.build()
    assert isinstance(module, KeywordCall) and module.names == ("input_ids", "decoder_input_ids")
    assert [tuple(x.shape) for x in inputs] == [(2, 16), (2, 8)]
    with torch.no_grad():
        got = module(*inputs)
        want = module.model(input_ids=inputs[0], decoder_input_ids=inputs[1])
    torch.testing.assert_close(got.logits, want.logits)
    assert spec.dims["S"] == ((0, 1),)  # the decoder's length does not follow S


@pytest.mark.slow  # about 14 s: tune and serve a T5; the default run keeps the capture
def test_tuned_with_keywords_and_served_to_a_keyword_call(factory, tmp_path, capsys):
    db = str(tmp_path / "plans.sqlite")
    args = ["tune", "--model", factory, "--shape", "B=2", "--dynamic", "S=16..16"]
    args += ["--strategy", "priority", "--top-k", "1", "--cache", db, "--no-compile-baseline"]
    rc = main(args)
    assert rc == 0, capsys.readouterr()
    model = resolve(factory, "B=2,S=16").build()[0].model
    torch.manual_seed(1)
    kwargs = {
        "input_ids": torch.randint(0, 96, (2, 16)),
        "decoder_input_ids": torch.randint(0, 96, (2, 8)),
    }
    backend = fusion_planner_backend(db, device="cpu")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        got, want = compiled(**kwargs), model(**kwargs)
    torch._dynamo.reset()
    s = backend.stats
    assert s.exact + s.bucket >= 1 and s.default == 0 and not s.fallbacks, s
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
