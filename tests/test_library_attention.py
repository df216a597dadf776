"""Attention inside a compiled group runs as `fusion_planner::attention`, the library call
eager makes, instead of whatever Inductor would lower it to."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from planner.fusion.partition import Partition
from planner.ir.capture import export_model
from planner.realize import library_attention
from planner.realize.realizer import RealizeWarning, realize

_SDPA = torch.nn.functional.scaled_dot_product_attention


@contextlib.contextmanager
def _masks_passed_on():
    """The masks `scaled_dot_product_attention` is called with while active, in order."""
    seen = []

    def recording(*a, **k):
        seen.append(a[3] if len(a) > 3 else k.get("attn_mask"))
        return _SDPA(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
        yield seen


class _Attend(torch.nn.Module):
    """ViT-style attention: projections, heads split by view and transpose, SDPA, merge."""

    def __init__(self, d: int = 32, h: int = 4):
        super().__init__()
        self.h = h
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.h, d // self.h).transpose(1, 2) for p in self.qkv)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, d) * 0.5 + x)


def _captured():
    torch.manual_seed(0)
    module = _Attend().eval()
    x = torch.randn(2, 13, 32)
    return module, x, export_model(module, (x,))


def test_attention_in_a_compiled_group_is_the_library_call(monkeypatch):
    monkeypatch.setattr(library_attention, "LIBRARY_ATTENTION_DEVICES", ("cpu",))
    module, x, c = _captured()
    ops = [n.op for n in c.graph.nodes]
    at = ops.index("scaled_dot_product_attention")
    # the attention and everything after it up to the output projection in one group
    tail = [i for i in range(at, len(ops)) if ops[i] != "linear"]
    rest = [[i] for i in range(len(ops)) if i not in tail]
    p = Partition.from_groups(c.graph, [*rest, tail])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RealizeWarning)
        r = realize(c, p)
    g = next(g for g in r.groups if "attention(s) as eager's library kernel" in g.note)
    assert r.realizations[g.index] == "inductor" and not r.fallbacks
    code = str(r.modules[g.index].graph)
    assert "fusion_planner.attention" in code and "scaled_dot_product_attention" not in code
    for _ in range(2):
        x = torch.randn(2, 13, 32)
        with torch.no_grad():
            want = module(x)
        torch.testing.assert_close(r(x), want, rtol=1e-4, atol=1e-4)


def test_the_operator_returns_its_layout_and_eager_values():
    q, k, v = (torch.randn(2, 4, 13, 8) for _ in range(3))
    mask = torch.rand(13, 13) > 0.3
    for kwargs in ({}, {"attn_mask": mask}, {"is_causal": True}, {"scale": 0.3}):
        got = torch.ops.fusion_planner.attention(
            q,
            k,
            v,
            kwargs.get("attn_mask"),
            0.0,
            kwargs.get("is_causal", False),
            kwargs.get("scale"),
            False,
        )
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        torch.testing.assert_close(got, want)
        assert got.stride() == (13 * 4 * 8, 8, 4 * 8, 1)  # (batch, tokens, heads, dim) in memory
    torch.library.opcheck(
        torch.ops.fusion_planner.attention.default, (q, k, v, None, 0.0, False, None, False)
    )


def test_off_cuda_and_at_group_outputs_nothing_changes():
    _, _, c = _captured()
    r = realize(c, Partition.whole(c.graph))  # the CPU: Inductor's own lowering stays
    assert not any("library kernel" in g.note for g in r.groups)


def test_an_attention_leaving_its_group_hands_its_layout_on(monkeypatch):
    """Where layouts propagate (a static plan), an attention that is its group's output is
    replaced too: the consumer group is traced with the operator's layout."""
    monkeypatch.setattr(library_attention, "LIBRARY_ATTENTION_DEVICES", ("cpu",))
    module, x, c = _captured()
    ops = [n.op for n in c.graph.nodes]
    at = ops.index("scaled_dot_product_attention")
    head = [i for i in range(at + 1) if ops[i] != "linear"]  # views, transposes, attention
    rest = [[i] for i in range(len(ops)) if i not in head]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RealizeWarning)
        p = Partition.from_groups(c.graph, [head, *rest])
        g = next(i for i, grp in enumerate(p.groups) if at in grp)
        r = realize(c, p, realizations={g: "inductor"})
    assert "library kernel" in r.groups[g].note and not r.fallbacks
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(r(x), want, rtol=1e-4, atol=1e-4)


def test_a_mask_broadcast_along_its_last_dimension_is_made_dense():
    """Such a mask (a traced model's all-true mask) would send the call to the math kernel;
    the operator passes it on dense, with the same values."""
    q, k, v = (torch.randn(2, 4, 13, 8) for _ in range(3))
    keep = torch.rand(13) > 0.2
    mask = keep[None, None, :, None].expand(1, 1, 13, 13)  # by query row, stride 0 along keys
    assert mask.stride()[-1] == 0
    with _masks_passed_on() as seen:
        got = torch.ops.fusion_planner.attention(q, k, v, mask, 0.0, False, None, False)
    torch.testing.assert_close(got, _SDPA(q, k, v, mask), equal_nan=True)
    assert seen[-1].stride()[-1] == 1 and torch.equal(seen[-1], mask)


class _Biased(torch.nn.Module):
    """T5-style attention: an additive position bias looked up as (S, S, heads) and
    permuted to (1, heads, S, S), so the mask is not contiguous along keys."""

    def __init__(self, d: int = 32, h: int = 4, s: int = 13):
        super().__init__()
        self.h = h
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.bias = torch.nn.Embedding(2 * s, h)
        self.register_buffer("pos", torch.arange(s)[None, :] - torch.arange(s)[:, None] + s)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.h, d // self.h).transpose(1, 2) for p in self.qkv)
        mask = self.bias(self.pos).permute(2, 0, 1).unsqueeze(0)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, scale=1.0)
        return (o * 2.0).sum(1)


def test_an_eager_groups_attention_gets_its_permuted_mask_dense(monkeypatch):
    """In a group the plan runs eagerly, an attention whose mask is not contiguous along
    keys runs as the operator (the fused kernels refuse such a mask), with eager's values;
    the kernel is given the mask dense."""
    monkeypatch.setattr(library_attention, "LIBRARY_ATTENTION_DEVICES", ("cpu",))
    torch.manual_seed(0)
    module = _Biased().eval()
    x = torch.randn(2, 13, 32)
    c = export_model(module, (x,))
    ops = [n.op for n in c.graph.nodes]
    at = ops.index("scaled_dot_product_attention")
    tail = list(range(at, len(ops)))  # the attention and what reads it
    p = Partition.from_groups(c.graph, [*([i] for i in range(at)), tail])
    g_at = len(p.groups) - 1
    for propagate_layouts in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RealizeWarning)
            r = realize(c, p, realizations={g_at: "eager"}, propagate_layouts=propagate_layouts)
        g = r.groups[g_at]
        assert r.realizations[g_at] == "eager" and not r.fallbacks
        assert "attention(s) on a dense mask" in g.note, g.note
        assert "fusion_planner.attention" in str(r.modules[g_at].graph)
        x = torch.randn(2, 13, 32)
        with _masks_passed_on() as seen:
            got = r(x)
        assert seen and seen[-1].stride()[-1] == 1
        with torch.no_grad():
            want = module(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_an_eager_group_with_a_dense_mask_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(library_attention, "LIBRARY_ATTENTION_DEVICES", ("cpu",))
    _, _, c = _captured()  # no mask at all
    ops = [n.op for n in c.graph.nodes]
    at = ops.index("scaled_dot_product_attention")
    p = Partition.from_groups(c.graph, [[i] for i in range(len(ops))])
    r = realize(c, p, realizations={at: "eager"})
    assert "dense mask" not in r.groups[at].note
    assert "scaled_dot_product_attention" in str(r.modules[at].graph)


def test_a_shared_mask_is_made_dense_once_not_per_batch_entry():
    """A permuted bias broadcast over the batch (T5's, traced): the kernel gets it dense
    along keys and still broadcast over the batch, with the same values."""
    q, k, v = (torch.randn(3, 4, 13, 8) for _ in range(3))
    bias = torch.randn(13, 13, 4).permute(2, 0, 1).unsqueeze(0).expand(3, 4, 13, 13)
    assert bias.stride() == (0, 1, 52, 4)
    with _masks_passed_on() as seen:
        got = torch.ops.fusion_planner.attention(q, k, v, bias, 0.0, False, 1.0, False)
    torch.testing.assert_close(got, _SDPA(q, k, v, bias, scale=1.0))
    assert seen[-1].stride() == (0, 169, 13, 1) and torch.equal(seen[-1], bias)
