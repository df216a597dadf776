"""planner.realize.derived: copies of weights a plan makes follow the model's weights.

A plan that runs on concatenated, padded or channels-last copies of weights must give
eager's answer after the weights change in place (an optimizer step, load_state_dict).
"""

from __future__ import annotations

import pytest
import torch

import zoo
from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.realize import conv_layout, units
from planner.realize.derived import DerivedState, Recipe
from planner.realize.realizer import realize
from tests.test_conv_layout import _bottleneck, _conv_groups
from tests.test_realize import (
    QKV,
    _Head,
    assert_close,
    build,
    eager_out,
    groups_by_name,
    run_eagerly,
)


def _concat_plan():
    module, inputs, c = build("transformer-block")
    p = groups_by_name(c.graph, QKV)
    r = realize(c, p, compiler=run_eagerly)
    assert any(u.derived for u in r._units), "the plan holds no concatenated weight"
    return module.eval(), inputs, r


def test_concatenated_weights_follow_an_optimizer_step():
    module, inputs, r = _concat_plan()
    assert_close(r(*inputs), eager_out(module, inputs), tol=1e-5)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    module(*inputs).float().pow(2).mean().backward()
    opt.step()
    assert_close(r(*inputs), eager_out(module, inputs), tol=1e-5)


def test_load_state_dict_reaches_the_plan():
    module, inputs, r = _concat_plan()
    other, _, _ = build("transformer-block")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    module.load_state_dict(other.state_dict())
    assert_close(r(*inputs), eager_out(module, inputs), tol=1e-5)


def test_padded_and_channels_last_weights_follow_in_place_updates(monkeypatch):
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_DEVICES", ("cpu",))
    pad = units.pad_unaligned_linears
    monkeypatch.setattr(
        units, "pad_unaligned_linears", lambda *a, **k: pad(*a, **{**k, "devices": ("cpu",)})
    )
    head = _Head(d=16, vocab=37).float()
    x = torch.randn(2, 5, 16)
    conv, img, c_conv = _bottleneck()
    c_head = export_model(head, (x,))
    plans = [
        (head, (x,), realize(c_head, Partition.whole(c_head.graph))),
        (conv, img, realize(c_conv, _conv_groups(c_conv.graph), compiler=run_eagerly)),
    ]
    for module, args, r in plans:
        assert any(u.derived for u in r._units)
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(-1.5)
        assert_close(r(*args), eager_out(module, args), tol=1e-4)


def test_a_copy_is_made_again_only_when_its_sources_change():
    a, b = torch.ones(2), torch.zeros(3)
    made = {"ab": torch.cat([a, b]), "b2": b * 2}
    recipes = {
        "ab": Recipe(("a", "b"), lambda x, y: torch.cat([x, y])),
        "b2": Recipe(("b",), lambda y: y * 2),
    }
    d = DerivedState({"a": a, "b": b}, made, recipes)
    buf = made["ab"]
    assert d.refresh() == 0
    a.add_(1)
    assert d.refresh() == 1 and made["ab"] is buf  # the same memory, made again
    assert made["ab"].tolist() == [2, 2, 0, 0, 0]
    b.add_(3)
    assert d.refresh() == 2 and made["b2"].tolist() == [6, 6, 6]
    assert d.refresh() == 0


# ---- GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_cuda_graph_reads_the_copies_made_again():
    """On CUDA the plan replays one graph: the copies are made again in the memory the graph
    reads, and the channels-last convolution plan matches eager after an update too."""
    torch.manual_seed(0)
    module, inputs = zoo.get("transformer-block").build(
        {"B": 2, "S": 64, "D": 128, "H": 4}, dtype=torch.float32, device="cuda"
    )
    c = export_model(module, inputs)
    r = realize(c, groups_by_name(c.graph, QKV), realizations="auto")
    assert r.cuda_graph and any(u.derived for u in r._units)
    conv, img = zoo.get("resnet-bottleneck").build(
        {"B": 2, "C": 64, "HW": 16}, dtype=torch.float32, device="cuda"
    )
    conv.eval()
    cc = export_model(conv, img)
    rc = realize(cc, _conv_groups(cc.graph))
    assert rc.cuda_graph and any("channels-last" in u.note for u in rc._units)
    for m, args, plan in ((module.eval(), inputs, r), (conv, img, rc)):
        assert_close(plan(*args), eager_out(m, args), tol=2e-2)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(-1.5)
        assert_close(plan(*args), eager_out(m, args), tol=2e-2)
