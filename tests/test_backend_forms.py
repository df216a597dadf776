"""Batch norm's inference statistics are recorded in one form whatever device traced the
model, and rows keyed under the CPU's former form still find their graph."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

import planner.ir.backend_forms as backend_forms
from learned_cost.study.plan_eval import GraphCache
from planner.ir.backend_forms import former_keys
from planner.ir.capture import capture, export_model


def _conv_bn(eps: float = 1e-5, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8, eps=eps), torch.nn.ReLU()
    )
    return m.eval().to(dtype), torch.randn(2, 3, 8, 8, dtype=dtype)


def _bn_nodes(g):
    return [n for n in g.nodes if "batch_norm" in n.op]


def _cpu_form(monkeypatch, module, x):
    """The graph a CPU capture recorded before the rule: statistics as the kernel gives."""
    with monkeypatch.context() as m:
        m.setattr(backend_forms, "canonical_values", lambda op, attrs, vals, first: list(vals))
        return capture(module, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_statistics_are_per_channel_in_the_computation_dtype_on_every_device(dtype):
    module, x = _conv_bn(dtype=dtype)
    on_cpu = capture(module, (x,))
    as_meta = export_model(module, (x,), trace_as="meta").graph  # the CUDA/meta kernels' form
    assert on_cpu.key == as_meta.key
    (bn,) = _bn_nodes(on_cpu)
    stats = [on_cpu.tensors[t] for t in bn.outputs[1:3]]
    assert [(t.shape, t.dtype) for t in stats] == [((8,), "float32")] * 2


def test_the_cpu_form_is_a_former_key_of_todays_graph(monkeypatch):
    module, x = _conv_bn(dtype=torch.bfloat16)
    old = _cpu_form(monkeypatch, module, x)
    (bn,) = _bn_nodes(old)
    assert [old.tensors[t].shape for t in bn.outputs[1:3]] == [(0,), (0,)]
    new = capture(module, (x,))
    assert old.key != new.key and old.structure_key == new.structure_key
    assert former_keys(new) == (old.key,)


def test_a_graph_that_differs_in_substance_is_not_matched(monkeypatch):
    module, x = _conv_bn(eps=1e-3)
    other_old = _cpu_form(monkeypatch, module, x)
    default = capture(*_conv_bn()[:1], (x,))
    assert other_old.key not in former_keys(default)
    assert former_keys(capture(torch.nn.Linear(4, 4), (torch.randn(2, 4),))) == ()
    rows = {"model": "m", "shape": "", "dtype": "float32"}
    cache = GraphCache(capture_fn=lambda *a: default)
    assert cache.get({**rows, "graph_key": other_old.key}) is None


def test_the_graph_cache_matches_a_row_by_its_former_key(monkeypatch):
    module, x = _conv_bn()
    old = _cpu_form(monkeypatch, module, x)
    new = capture(module, (x,))
    cache = GraphCache(capture_fn=lambda *a: new)
    row = {"model": "m", "shape": "", "dtype": "float32"}
    assert cache.get({**row, "graph_key": old.key}) is new
    assert cache.get({**row, "graph_key": new.key}) is new


@pytest.mark.parametrize("dataset", ["h100_profiles", "cpu_profiles"])
def test_committed_batch_norm_rows_recapture(dataset):
    """One batch-norm graph of each committed dataset: the H100 rows carry the per-channel
    form, the CPU rows the CPU's former form; both find today's graph."""
    from benchmarks.generated import ROOT

    table = pq.read_table(
        ROOT / "data" / f"{dataset}.parquet",
        columns=["model", "family", "shape", "dtype", "graph_key"],
    ).to_pylist()
    rows = sorted(
        (r for r in table if r["family"] == "conv-bn-relu-maxpool"),
        key=lambda r: (r["shape"], r["dtype"]),
    )
    assert rows, f"{dataset} has no conv-bn-relu-maxpool rows"
    assert GraphCache().get(rows[0]) is not None
