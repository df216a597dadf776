"""Which input axes follow a file factory's shape parameter, inferred without a `dims`
attribute, and `--dynamic` on such a factory through `fusion-plan tune`."""

from __future__ import annotations

import textwrap

import pytest
import torch

from cli.main import main
from planner.errors import FusionPlannerError, ModelSpecError
from planner.ir.capture import capture
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from zoo import modelspec

FACTORIES = """
import torch

CALLS = []


class Net(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x, extra):
        return self.lin(x) * extra["mask"].unsqueeze(-1) + extra["bias"][0]


def nested(B=2, S=8, D=16):
    CALLS.append((B, S, D))
    x = torch.randn(B, S, D)
    return Net(D), (x, {"mask": torch.ones(B, S), "bias": [torch.zeros(D)]})


def shifted(B=2, S=8, D=16):
    return Net(D), (torch.randn(B, S + 1, D), {"mask": torch.ones(B, S + 1), "bias": [torch.zeros(D)]})


def ragged(B=2, S=8, D=16):
    return torch.nn.Identity(), tuple(torch.randn(B, D) for _ in range(S // 4))


def declared(B=2, S=8, D=16):
    return Net(D), (torch.randn(B, S, D), {"mask": torch.ones(B, S), "bias": [torch.zeros(D)]})


declared.dims = {"S": (0, 1)}


def hidden(B=2, S=8, HID=32):
    return torch.nn.Sequential(torch.nn.Linear(16, HID), torch.nn.Linear(HID, 16)), (torch.randn(B, S, 16),)


def picky(B=2, S=8):
    if S % 8:
        raise ValueError("S must be a multiple of 8")
    return torch.nn.Identity(), (torch.randn(B, S),)


def plain(B=2, S=8, D=16):
    return torch.nn.Linear(D, D), (torch.randn(B, S, D),)
"""


@pytest.fixture
def factories(tmp_path):
    f = tmp_path / "factories.py"
    f.write_text(textwrap.dedent(FACTORIES))
    return str(f)


def test_inferred_axes_cover_nested_inputs_and_are_cached(factories):
    spec = modelspec.resolve(f"{factories}:nested")
    # tensor leaves in pytree order: x, mask, bias[0]
    assert spec.dims["S"] == ((0, 1), (1, 1))
    assert spec.dims["B"] == ((0, 0), (1, 0))
    assert spec.dims["D"] == ((0, 2), (2, 0))
    calls = modelspec._load_factory(f"{factories}:nested").__globals__["CALLS"]
    n = len(calls)
    assert modelspec.resolve(f"{factories}:nested").dims["S"] == ((0, 1), (1, 1))
    assert len(calls) == n  # a second resolve asks the cache, not the factory
    # probes are built on the meta device: three values of S, B and D fixed
    assert len({c[1] for c in calls}) >= 3


def test_inferred_axes_feed_bucket_specs_that_tie_inputs_together(factories):
    spec = modelspec.resolve(f"{factories}:nested", "S=16")
    bspec = parse_dynamic("S=8..32", spec.dims)
    _m, inputs = spec.build(device="meta")
    base = modelspec.tensor_shapes(inputs)
    keys = [b.key for b in bspec.buckets(base)]
    assert keys == [
        "[2,8-8,16];[2,8-8];[16]",
        "[2,9-16,16];[2,9-16];[16]",
        "[2,17-32,16];[2,17-32];[16]",
    ]
    b = bspec.bucket_of([(2, 20, 16), (2, 20), (16,)])
    assert b is not None and b.key == keys[2]
    assert bspec.representative_params(b) == {"S": 32}


def test_unmapped_structure_changing_and_shape_only_params_are_refused(factories):
    with pytest.raises(ModelSpecError, match=r"input 0 axis 1 has sizes \[9, 17, 5\].*not equal"):
        modelspec.resolve(f"{factories}:shifted").dims["S"]
    with pytest.raises(ModelSpecError, match="change structure with S"):
        modelspec.resolve(f"{factories}:ragged").dims["S"]
    with pytest.raises(FusionPlannerError, match=r"no input axis .* follows HID"):
        parse_dynamic("HID=8..64", modelspec.resolve(f"{factories}:hidden").dims)


def test_factory_errors_are_reported_and_probes_skip_invalid_values(factories):
    with pytest.raises(
        ModelSpecError, match=r"picky\(B=2, S=12\) raised ValueError: S must be a multiple of 8"
    ):
        modelspec.resolve(f"{factories}:picky", "S=12").build()
    # the factory refuses S = 4, 9 and 7: S = 16 and 32 are probed instead
    assert modelspec.resolve(f"{factories}:picky").dims["S"] == ((0, 1),)


def test_declared_dims_override_inference(factories):
    spec = modelspec.resolve(f"{factories}:declared")
    assert spec.dims == {"S": (0, 1)}
    assert [d.input for d in parse_dynamic("S=8..16", spec.dims).dims] == [0]


def test_build_places_nested_inputs_on_dtype(factories):
    _m, inputs = modelspec.resolve(f"{factories}:nested").build(dtype=torch.float64)
    assert inputs[1]["mask"].dtype == torch.float64
    assert inputs[1]["bias"][0].dtype == torch.float64


def test_tune_cli_dynamic_on_a_factory_without_dims(factories, tmp_path, capsys):
    torch.set_num_threads(1)
    db = str(tmp_path / "plans.sqlite")
    args = ["tune", "--model", f"{factories}:plain", "--shape", "B=1,D=8", "--dynamic", "S=4..8"]
    args += ["--strategy", "greedy", "--top-k", "1", "--no-compile-baseline", "--cache", db]
    assert main(args) == 0
    assert "nothing measured" not in capsys.readouterr().out
    m, inputs = modelspec.resolve(f"{factories}:plain", "B=1,D=8,S=6").build(device="meta")
    g = capture(m, inputs)
    with PlanCache(db) as cache:
        assert cache.lookup(g.structure_key, g.input_shapes).hit
