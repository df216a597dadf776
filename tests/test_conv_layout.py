"""planner.realize.conv_layout: convolution groups hand channels-last values to each other.

The rule applies on CUDA by default; these tests let CPU tensors qualify (the CPU kernels
take either layout), so the rewrite, the propagated layouts and the values are checked here.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.realize import conv_layout
from planner.realize.realizer import realize
from tests.test_realize import TINY_PARAMS, assert_close, eager_out, run_eagerly

CL = torch.channels_last


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_DEVICES", ("cpu",))


def _bottleneck():
    torch.manual_seed(0)
    module, inputs = zoo.get("resnet-bottleneck").build(TINY_PARAMS["resnet-bottleneck"])
    return module.eval(), inputs, export_model(module, inputs)


def _conv_groups(graph) -> Partition:
    """One group per convolution with the ops after it (conv, BN, ReLU): a plan's shape."""
    groups: list[list[int]] = []
    for n in graph.nodes:
        if "conv" in n.target or not groups:
            groups.append([])
        groups[-1].append(n.index)
    return Partition.from_groups(graph, groups)


def _conv_units(r):
    return [u for u in r._units if "convolution(s) channels-last" in u.note]


@pytest.mark.parametrize("whole", [False, True])
def test_conv_groups_hand_on_channels_last_and_match_eager(on_cpu, whole):
    module, inputs, c = _bottleneck()
    p = Partition.whole(c.graph) if whole else _conv_groups(c.graph)
    r = realize(c, p, compiler=run_eagerly)
    units = _conv_units(r)
    assert len(units) == (1 if whole else 3)  # the bottleneck's three convolutions
    for u in units:
        assert u.extra_state and all(
            t.is_contiguous(memory_format=CL) for t in u.extra_state.values()
        )
    if not whole:  # each convolution's group hands its result on channels-last
        conv_outs = [f for u in units for f in u.out_fakes if f.dim() == 4]
        assert conv_outs and all(f.is_contiguous(memory_format=CL) for f in conv_outs)
    for _ in range(2):
        x = torch.randn_like(inputs[0])
        got, want = r(x), eager_out(module, (x,))
        assert_close(got, want, tol=1e-4)
        assert got.stride() == want.stride()  # the caller sees eager's layout


def test_only_the_first_convolution_converts_its_input(on_cpu):
    """Every later group's input is channels-last already, so its `contiguous` is a no-op:
    run eagerly, only the image's conversion copies."""
    *_, c = _bottleneck()
    r = realize(c, _conv_groups(c.graph), compiler=run_eagerly)
    conv_inputs = [
        n.args[0].meta["val"]
        for u in _conv_units(r)
        for n in u.module.graph.nodes
        if n.target is torch.ops.aten.contiguous.default
    ]
    cl = [f.is_contiguous(memory_format=CL) for f in conv_inputs]
    assert len(cl) == 3 and cl[1:] == [True, True], cl


def test_grouped_convolutions_and_other_devices_keep_eagers_layout(monkeypatch):
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4)
    x = torch.randn(1, 8, 6, 6)
    c = export_model(conv, (x,))
    r = realize(c, Partition.whole(c.graph), compiler=run_eagerly)
    assert not _conv_units(r)  # CPU: not a device the rule applies to
    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_DEVICES", ("cpu",))
    r = realize(c, Partition.whole(c.graph), compiler=run_eagerly)
    assert not _conv_units(r)  # grouped: left in eager's layout


def test_keeping_eagers_layout_leaves_convolutions_alone(on_cpu):
    module, inputs, c = _bottleneck()
    r = realize(c, _conv_groups(c.graph), compiler=run_eagerly, propagate_layouts=False)
    assert not _conv_units(r)
    assert_close(r(*inputs), eager_out(module, inputs), tol=1e-4)


def test_compiled_by_inductor_the_channels_last_plan_matches_eager(on_cpu):
    module, inputs, c = _bottleneck()
    r = realize(c, _conv_groups(c.graph))
    assert len(_conv_units(r)) == 3 and not r.fallbacks
    x = torch.randn_like(inputs[0])
    assert_close(r(x), eager_out(module, (x,)), tol=1e-4)


def _hf_vision(name: str):
    T = pytest.importorskip("transformers")
    if name == "resnet":
        from benchmarks.models import resnet

        return resnet.tiny(2, 32)
    make = {
        "resnet-bottleneck": lambda: T.ResNetModel(
            T.ResNetConfig(
                embedding_size=16,
                hidden_sizes=[16, 32, 64, 128],
                depths=[1, 1, 1, 1],
                layer_type="bottleneck",
            )
        ),
        "regnet": lambda: T.RegNetModel(  # grouped convolutions: left in NCHW
            T.RegNetConfig(
                embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1] * 4, groups_width=8
            )
        ),
        "mobilenet_v2": lambda: T.MobileNetV2Model(  # depthwise and pointwise
            T.MobileNetV2Config(image_size=32, depth_multiplier=0.35)
        ),
        "poolformer": lambda: T.PoolFormerModel(
            T.PoolFormerConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
        ),
    }[name]
    return make(), (torch.randn(2, 3, 32, 32),)


@pytest.mark.parametrize(
    "name",
    [
        "resnet",
        *[
            pytest.param(n, marks=pytest.mark.slow)
            for n in ("resnet-bottleneck", "regnet", "mobilenet_v2", "poolformer")
        ],
    ],
)
def test_hugging_face_convnets_through_the_backend_run_channels_last(on_cpu, name):
    """As a user compiles them: every group compiles (the weight copies' fake values are
    static: symbolic kernel sizes made Inductor refuse the stride-2 7x7 stem's consumers),
    and the answer is eager's."""
    from planner.runtime.backend import fusion_planner_backend

    torch._dynamo.reset()
    torch.manual_seed(0)
    module, args = _hf_vision(name)
    module.eval()
    backend = fusion_planner_backend()
    plans = []
    realizer = backend.realizer
    backend.realizer = lambda c, p, **o: plans.append(realizer(c, p, **o)) or plans[-1]
    compiled = torch.compile(module, backend=backend, dynamic=False)
    with torch.no_grad():
        got, want = compiled(*args), module(*args)
    assert len(plans) == 1 and not plans[0].fallbacks
    assert len(_conv_units(plans[0])) >= 5
    leaves = [(g, w) for g, w in zip(got.to_tuple(), want.to_tuple()) if torch.is_tensor(w)]
    assert leaves
    for g, w in leaves:
        assert_close(g, w, tol=1e-4)
    torch._dynamo.reset()
