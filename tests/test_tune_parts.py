"""Models `torch.compile` serves as several graphs (graph breaks): `tune` tunes each graph
the backend will meet, with the bucket it looks that graph up by, and the backend serves
every one from its tuned plan."""

from __future__ import annotations

import torch

from cli.main import main
from planner.plans.buckets import parse_dynamic
from planner.plans.cache import PlanCache
from planner.runtime import fusion_planner_backend
from search.tune_parts import served_graphs
from tests.backend_helpers import BreakBetweenLayers, HalvingLayers, small_block
from zoo.modelspec import resolve

DIMS = {"B": (0, 0), "S": (0, 1)}


def _served(module, b, s, dynamic):
    spec = parse_dynamic(dynamic, DIMS)
    x = torch.randn(b, s, 32)
    bucket = spec.bucket_of([tuple(x.shape)])
    return served_graphs(module, (x,), spec, bucket, "m")


def _parts(module, b, s, dynamic):
    served = _served(module, b, s, dynamic)
    assert served.whole is None
    return served.parts


def test_each_graph_between_breaks_gets_the_dims_it_moves_with():
    torch.manual_seed(0)
    first, second = _parts(BreakBetweenLayers().eval(), 4, 16, "B=1..4,S=9..16")
    assert [(p.index, p.count) for p in (first, second)] == [(1, 2), (2, 2)]
    for p in (first, second):
        assert p.captured is not None and not p.skipped and not p.notes, p
    dims = lambda p: {(d.name, d.input, d.axis) for d in p.spec.dims}  # noqa: E731
    # the first graph reads the model's (B, S, 32) input; the second its activation, and
    # the input again for its shape (`reshape(x.shape)`): every such axis is named
    assert dims(first) == {("B", 0, 0), ("S", 0, 1)} and first.bucket.key == "[3-4,9-16,32]"
    assert dims(second) == {("B", 0, 0), ("S", 0, 1), ("B", 1, 0), ("S", 1, 1)}
    assert second.bucket.key == "[3-4,9-16,32];[3-4,9-16,32]"
    assert first.captured.graph.structure_key != second.captured.graph.structure_key


def test_an_axis_that_moves_with_a_dim_without_being_it_stays_exact_and_is_said():
    torch.manual_seed(0)
    first, second = _parts(BreakBetweenLayers(flatten=True).eval(), 2, 16, "S=9..16")
    assert [(d.name, d.input, d.axis) for d in first.spec.dims] == [("S", 0, 1)]
    # the second graph reads (B*S, 32) rows: that axis stays exact in its bucket, and why
    # is said; the input read for its shape still has S
    assert [(d.name, d.input, d.axis) for d in second.spec.dims] == [("S", 1, 1)]
    assert second.bucket.key == "[32,32];[2,9-16,32]"
    assert any("moves with S but is not S" in n for n in second.notes), second.notes


def test_a_graph_served_at_other_sizes_in_one_forward_keeps_their_buckets():
    """The layer's graph is called at S and S/2: its plan is stored for the bucket of
    each (here 16 and 8 fall in S 9..16 and S 5..8)."""
    torch.manual_seed(0)
    (part,) = _parts(HalvingLayers().eval(), 2, 16, "S=5..16")
    assert part.bucket.key == "[2,9-16,32]"
    assert [b.key for b in part.also] == ["[2,5-8,32]"]


def test_a_model_dynamo_traces_whole_is_served_whole():
    served = _served(small_block().eval(), 2, 16, "S=9..16")
    assert served.whole is not None and served.parts is None


BREAKS = """
import torch

from tests.backend_helpers import BreakBetweenLayers


def factory(B=2, S=16):
    torch.manual_seed(0)
    return BreakBetweenLayers().eval(), (torch.randn(B, S, 32),)
"""


def _serve(url, module, sizes):
    be = fusion_planner_backend(PlanCache(url))
    compiled = torch.compile(module, backend=be, dynamic=True)
    with torch.no_grad():
        for s in sizes:
            x = torch.randn(2, s, 32)
            torch.testing.assert_close(compiled(x), module(x))
    torch._dynamo.reset()
    return be.stats


def test_tune_from_the_queue_then_serve_a_model_with_a_graph_break(tmp_path, capsys):
    """The user's path: a model with a graph break served first without plans queues its
    two graphs' misses; `fusion-plan tune --from-queue` tunes the bucket they fall in (and
    not the other one) and stores a plan per graph; served again, both graphs are served
    from them at other lengths of the bucket, as eager computes them."""
    (tmp_path / "breaks.py").write_text(BREAKS)
    spec, url = f"{tmp_path}/breaks.py:factory", str(tmp_path / "plans.sqlite")
    module, _ = resolve(spec, "B=2,S=16").build()
    first = _serve(url, module, (12,))
    assert first.graphs == 2 and first.default == 2 and first.queued == 2, first
    argv = ["tune", "--model", spec, "--shape", "B=2", "--dynamic", "S=5..16", "--from-queue"]
    argv += ["--strategy", "greedy", "--top-k", "1", "--cache", url, "--keep-fused"]
    assert main([*argv, "--no-compile-baseline", "--dtype", "fp32", "--progress", "off"]) == 0
    out = capsys.readouterr().out
    assert "S 9..16 (graph 1 of 2)" in out and "S 9..16 (graph 2 of 2)" in out, out
    assert "S 5..8" not in out, out
    # and the whole model as the user runs it, Python between the graphs included
    assert "whole model through the backend: " in out and " vs eager" in out, out
    assert len(PlanCache(url).entries()) == 2 and PlanCache(url).tuning_queue() == []
    stats = _serve(url, module, (16, 12, 10))
    assert stats.graphs == 2 and stats.bucket == 6 and stats.default == 0, stats
    assert not stats.fallbacks and stats.queued == 0, stats


def test_measure_points_a_model_with_a_graph_break_to_tune(tmp_path, capsys):
    (tmp_path / "breaks.py").write_text(BREAKS)
    argv = ["measure", "--model", f"{tmp_path}/breaks.py:factory", "--shape", "B=2,S=16"]
    assert main([*argv, "--strategy", "greedy", "--no-compile"]) == 2
    err = capsys.readouterr().err
    assert "runs as 2 graph(s) under torch.compile (graph breaks)" in err
    assert "`fusion-plan tune` tunes, stores and times each graph" in err


def test_a_job_with_an_untunable_graph_still_succeeds_where_another_graph_was_tuned():
    from types import SimpleNamespace as NS

    from cli.commands.tune import job_ok

    def r(bucket, plan, part="graph 1 of 2", stored="stored"):
        return NS(bucket=NS(key=bucket), plan=plan, part=part, stored=stored)

    assert job_ok([r("a", object()), r("a", None, "graph 2 of 2")])
    assert not job_ok([r("a", None), r("a", None, "graph 2 of 2")])  # no graph tuned
    assert not job_ok([r("a", None, part="")])  # a whole model without a plan
    assert not job_ok([r("a", object(), stored="NOT stored (read-only)")])
