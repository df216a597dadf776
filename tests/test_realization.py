"""planner.fusion.realization: one rule labels every group, the Plan records it, realize runs it.

The labels a Plan records are checked against what `realize` actually ran for each group
(the report, and the FX module the group runs: an SDPA call, a concatenated GEMM, a
compiled unit or the group's own ops) on zoo models and a Hugging Face model built from
its config. Compiles are replaced by `run_eagerly` (the rewritten subgraph as FX code):
which module is handed to the compiler is what is checked, not Inductor.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import warnings

import pytest
import torch

import learned_cost.features as learned_features
import zoo
from learned_cost.analytical import AnalyticalModel
from learned_cost.corrected import default_realization
from learned_cost.realized import RealizedRoofline
from planner import objective
from planner.fusion.partition import Partition
from planner.fusion.patterns import LIBRARY, PatternDef, match_all
from planner.fusion.realization import (
    REALIZATION_RULES,
    REALIZATIONS,
    RULE_VERSION,
    realization_of,
    rule_for,
    unmet,
)
from planner.fusion.recognize import find_attention, find_sibling_gemms
from planner.hardware import get_spec
from planner.ir.capture import export_model
from planner.objective import Objective
from planner.plans.plan import GroupPlan, Plan
from planner.realize import kernels as realize_patterns
from planner.realize import realizer as realize_mod
from planner.realize.realizer import RealizeWarning, realize
from search.strategies import get_strategy
from zoo.randgraph import GraphBuilder

TINY = {"B": 2, "S": 16, "D": 32, "H": 2}
ZOO = {
    "transformer-block": TINY,
    "gpt2-block": TINY,
    "llama-block": {**TINY, "MAXS": 64},
    "bert-layer": TINY,
    "mlp": {"B": 4, "D": 16, "HID": 32, "L": 2},
    "conv-bn-relu-maxpool": {"B": 2, "CIN": 3, "C": 8, "HW": 8},
}
M = (8, 8)


def run_eagerly(gm, fakes, fake_mode):
    return gm.forward


class Recording:
    """A group compiler that runs the module as FX code and keeps each module it got."""

    def __init__(self):
        self.compiled: list[torch.fx.GraphModule] = []

    def __call__(self, gm, fakes, fake_mode):
        self.compiled.append(gm)
        return gm.forward


def build(name: str):
    torch.manual_seed(0)
    module, inputs = zoo.get(name).build(ZOO[name])
    return module, inputs, export_model(module, inputs)


def planned(captured) -> Plan:
    obj = Objective(AnalyticalModel(get_spec("cpu")))
    res = get_strategy("priority").plan(captured.graph, obj)
    return obj.make_plan(res.partition, res.evaluation, strategy="priority", device="cpu",
                         dtype="float32")  # fmt: skip


def targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def assert_runs_as_labelled(plan: Plan, captured, r, recorder: Recording) -> None:
    """Each group ran as its Plan label: the report and the module that ran agree."""
    labels = {gp.nodes: gp.realization for gp in plan.groups}
    compiled_ids = {id(gm) for gm in recorder.compiled}
    for g, (group, rep) in enumerate(zip(r.partition.groups, r.groups)):
        label = labels[tuple(sorted(group))]
        assert (rep.requested, rep.realization, rep.fallback) == (label, label, ""), g
        ops = targets(r.modules[g])
        own = sum("scaled_dot_product_attention" in captured.graph.nodes[i].op for i in group)
        sdpa = ops.count("aten.scaled_dot_product_attention.default") > own  # rewritten
        concat = any(str(n.target).startswith("concat_w_") for n in r.modules[g].graph.nodes)
        assert sdpa == (label == "sdpa"), (g, label, ops)
        assert concat == (label == "concat_gemm"), (g, label, ops)
        if label == "sdpa":
            assert not any("softmax" in t for t in ops)  # the explicit attention is gone
        if label == "inductor":
            assert rep.compiled and id(r.modules[g]) in compiled_ids  # handed to the compiler
        if label == "eager":
            assert not rep.compiled and id(r.modules[g]) not in compiled_ids


# ---- the rule ----------------------------------------------------------------------------
def test_rule_table_on_hand_built_groups():
    b = GraphBuilder()
    x = b.input(M)
    (c,) = b.op("mylib.mystery.default", [x], [M])
    (v,) = b.op("aten.t.default", [c], [M], view=True)
    (r,) = b.op("aten.relu.default", [v], [M])
    b.op("aten.exp.default", [r], [M])
    g = b.build()
    assert realization_of(g, {0}) == "eager"  # opaque
    assert realization_of(g, 0b0110) == "eager"  # a view and one op: nothing to fuse
    assert realization_of(g, {1, 2, 3}) == "inductor"
    assert realization_of(g, 0b1111) == "eager"  # holding an opaque op
    assert rule_for(g, {2, 3}) is REALIZATION_RULES[-1]


def test_every_rule_names_its_reason_and_a_test_that_exists():
    for rule in REALIZATION_RULES:
        assert rule.label in REALIZATIONS and rule.why
        module, name = rule.test.split("::")
        mod = __import__(f"tests.{module}", fromlist=[name])
        assert inspect.isfunction(getattr(mod, name)), rule.test
    assert REALIZATION_RULES[-1].label == "inductor"  # the last rule always holds


def test_the_old_call_sites_are_the_rule():
    assert objective.realization_of is realization_of
    assert realize_patterns.choose_realization is realization_of
    assert realize_mod.choose_realization is realization_of
    assert "realization" not in {f.name for f in dataclasses.fields(PatternDef)}
    assert set(learned_features.REALIZATIONS) == set(REALIZATIONS)  # the learned one-hots


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_consumer_sees_the_rules_label(name):
    """Objective, Plan, pattern matches, the realized roofline and the learned model's
    labeller agree with the rule on every group of several partitions of a zoo model."""
    module, inputs = zoo.get(name).build(ZOO[name], device="meta")
    g = export_model(module, inputs).graph
    obj = Objective(AnalyticalModel(get_spec("h100")))
    partitions = [Partition.singletons(g), Partition.whole(g)]
    partitions += [get_strategy(s).plan(g, obj).partition for s in ("greedy", "priority")]
    roofline = RealizedRoofline(get_spec("h100"))
    for p in partitions:
        plan = obj.make_plan(p, obj.evaluate(p), strategy="t", device="h100", dtype="float32")
        derived = Plan.from_partition(p, device="h100", dtype="float32", strategy="t",
                                      cost_model="-", predicted_s=0.0)  # fmt: skip
        for group, gp, dp in zip(p.groups, plan.groups, derived.groups):
            label = realization_of(g, group)
            assert gp.realization == dp.realization == label
            assert default_realization(g, frozenset(group)) == label
            kernels = roofline.kernels(g, group)
            if label == "sdpa":
                assert any(set(m.core) in map(set, kernels) for m in find_attention(g, group))
            if label == "concat_gemm":
                sets = [set(s.nodes) for s in find_sibling_gemms(g, group)]
                assert any(k in sets for k in map(set, kernels))
    for m in match_all(g):
        assert m.realization == realization_of(g, m.nodes)
        if m.pattern == "attention":
            assert m.realization == "sdpa"
        if m.pattern == "sibling_gemms":
            assert m.realization == "concat_gemm"


def test_library_attention_and_siblings_are_the_recognizers_matches():
    for name in ("transformer-block", "gpt2-block", "llama-block", "bert-layer"):
        module, inputs = zoo.get(name).build(ZOO[name], device="meta")
        g = export_model(module, inputs).graph
        ms = match_all(g, LIBRARY)
        att = [m for m in ms if m.pattern == "attention"]
        found = find_attention(g)
        assert len(att) == len(found) == 1
        (m,), (a,) = att, found
        assert set(a.core) <= m.nodes  # plus the mask's constant producers (gpt2, llama)
        assert (m.role("qk"), m.role("softmax"), m.role("pv")) == ([a.qk], [a.softmax], [a.pv])
        sib = sorted(sorted(m.nodes) for m in ms if m.pattern == "sibling_gemms")
        assert sib == sorted(sorted(s.nodes) for s in find_sibling_gemms(g))


# ---- the Plan's labels are what runs -----------------------------------------------------
@pytest.mark.parametrize("name", sorted(ZOO))
def test_plan_labels_are_what_runs_on_zoo_models(name):
    _, _, c = build(name)
    plan = planned(c)
    assert {gp.realization for gp in plan.groups} <= set(REALIZATIONS)
    rec = Recording()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RealizeWarning)
        r = realize(c, plan, compiler=rec)
    assert_runs_as_labelled(plan, c, r, rec)
    if name in ("transformer-block", "bert-layer", "llama-block", "gpt2-block"):
        assert "sdpa" in r.realizations


@pytest.mark.optional
def test_plan_labels_are_what_runs_on_a_transformers_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = export_model(model, (ids,), name="bert")
    plan = planned(c)
    rec = Recording()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RealizeWarning)
        r = realize(c, plan, compiler=rec)
    assert_runs_as_labelled(plan, c, r, rec)
    assert "concat_gemm" in r.realizations  # Q, K, V read the hidden state once
    with torch.no_grad():
        want = model(ids).last_hidden_state
    assert torch.allclose(r(ids).last_hidden_state, want, atol=1e-5)


def test_realize_runs_the_plans_label_even_where_the_rule_would_differ():
    """The Plan decides: a lone op labelled "inductor" (the rule says eager) is compiled,
    and `realizations="auto"` is how to ask for the rule's labels instead."""
    _, _, c = build("mlp")
    plan = planned(c)
    g = next(i for i, gp in enumerate(plan.groups) if gp.realization == "eager")
    groups = list(plan.groups)
    groups[g] = dataclasses.replace(groups[g], realization="inductor")
    edited = dataclasses.replace(plan, groups=tuple(groups))
    rec = Recording()
    r = realize(c, edited, compiler=rec)
    assert_runs_as_labelled(edited, c, r, rec)
    auto = realize(c, edited, compiler=run_eagerly, realizations="auto")
    assert auto.realizations == tuple(gp.realization for gp in plan.groups)


def test_a_label_that_cannot_be_honoured_falls_back_with_a_logged_reason(caplog):
    module, inputs, c = build("transformer-block")
    plan = planned(c)
    g = next(i for i, gp in enumerate(plan.groups) if gp.realization == "inductor")
    assert unmet(c.graph, plan.groups[g].nodes, "sdpa") is not None
    groups = list(plan.groups)
    groups[g] = dataclasses.replace(groups[g], realization="sdpa")  # as an older version might
    stale = dataclasses.replace(plan, groups=tuple(groups))
    asked = pytest.warns(RealizeWarning, match="asked for sdpa, runs as inductor")
    with caplog.at_level(logging.WARNING, logger="planner.realize.realizer"), asked:
        r = realize(c, stale, compiler=run_eagerly)
    gi = r.partition.groups.index(next(x for x in r.partition.groups
                                       if tuple(sorted(x)) == plan.groups[g].nodes))  # fmt: skip
    rep = r.groups[gi]
    assert (rep.requested, rep.realization) == ("sdpa", "inductor")
    assert "no attention pattern" in rep.note
    assert any("asked for sdpa" in rec.message for rec in caplog.records)
    with torch.no_grad():
        assert torch.allclose(r(*inputs), module(*inputs), atol=1e-5)


def test_an_unlabelled_plan_is_realized_with_the_rules_labels():
    _, _, c = build("transformer-block")
    plan = planned(c)
    bare = dataclasses.replace(plan, groups=tuple(GroupPlan(gp.nodes) for gp in plan.groups))
    assert Plan.from_json(bare.to_json()).groups == bare.groups  # "" survives a round trip
    r = realize(c, bare, compiler=run_eagerly)
    assert r.realizations == tuple(gp.realization for gp in plan.groups)


def test_a_plan_from_before_the_rule_runs_as_the_rule_labels_it():
    """Plans stored before the rule was versioned carry labels realize never ran (a lone
    GEMM "inductor"): they run as the rule labels them, with a warning saying so."""
    _, _, c = build("mlp")
    plan = planned(c)
    old = dataclasses.replace(
        plan,
        groups=tuple(
            dataclasses.replace(gp, realization="inductor") if gp.realization == "eager" else gp
            for gp in plan.groups
        ),
        versions={k: v for k, v in plan.versions.items() if k != "realization_rule"},
    )
    old = Plan.from_json(old.to_json())
    assert "realization_rule" not in old.versions and old.groups != plan.groups
    with pytest.warns(RealizeWarning, match="no recorded rule"):
        r = realize(c, old, compiler=run_eagerly)
    assert r.realizations == tuple(gp.realization for gp in plan.groups)
    assert plan.versions["realization_rule"] == RULE_VERSION


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lone_misaligned_gemm_is_compiled(dtype):
    """A lone GEMM whose N or K is not a multiple of 16 bytes is compiled (Inductor pads it);
    an aligned one stays a library call."""
    per = 16 // torch.tensor([], dtype=dtype).element_size()
    for n_out, k, want in (
        (4 * per, 2 * per, "eager"),
        (4 * per + 1, 2 * per, "inductor"),
        (4 * per, 2 * per + 1, "inductor"),
    ):
        m = torch.nn.Linear(k, n_out, bias=False).to(dtype)
        g = export_model(m, (torch.randn(3, k, dtype=dtype),)).graph
        (gemm,) = [n.index for n in g.nodes if n.op in ("mm", "linear", "addmm", "matmul")]
        assert realization_of(g, {gemm}) == want, (n_out, k)
