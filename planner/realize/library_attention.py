"""Attention inside a compiled group runs the library kernel on a mask it accepts.

Each `aten.scaled_dot_product_attention` node of a group that Inductor will compile on CUDA
is replaced by `fusion_planner::attention`, an operator Inductor cannot decompose: at run
time it calls `torch.nn.functional.scaled_dot_product_attention`, which picks its kernel
on the real tensors. A mask whose last dimension is not contiguous (broadcast along it
with stride 0, or an additive bias permuted from another layout, as T5's position bias),
which the fused kernels refuse, is made dense first, so such a call is not sent to the math
kernel; a dense mask broadcast over batch or heads that still gets the math kernel is
expanded too. The output has the layout the fused kernels write (4-D attention: (batch, tokens,
heads, dim) in memory, seen as (batch, heads, tokens, dim)), so the usual transpose and
reshape after it are views; an output that comes back otherwise (the math kernel) is
copied into that layout. Where a group's outputs keep eager's strides (a plan realized
over a shape range), an attention whose output leaves the group keeps Inductor's
lowering.

An attention in a group the plan runs eagerly is replaced the same way when its mask is
not contiguous along keys (`eager_mask_sites`): the same values, computed by a fused kernel
instead of the math kernel. Why: docs/realization.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

aten = torch.ops.aten

LIBRARY_ATTENTION_DEVICES = ("cuda",)


def _layout_of(shape: Sequence[int]) -> tuple[int, ...]:
    """Dimension order, outermost first, of the layout the operator returns."""
    return (0, 2, 1, 3) if len(shape) == 4 else tuple(range(len(shape)))


def _empty_in_layout(like: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    order = _layout_of(shape)
    inverse = [order.index(d) for d in range(len(shape))]
    base = like.new_empty([shape[d] for d in order])
    return base.permute(inverse)


@torch.library.custom_op("fusion_planner::attention", mutates_args=())
def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """`scaled_dot_product_attention` in the layout `_layout_of` says, a mask broadcast
    along its last dimension (stride 0 there) made dense first: the fused kernels refuse
    such a mask, and the call would fall to the math kernel."""
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    if attn_mask is not None and attn_mask.dim() and attn_mask.stride(-1) != 1:
        attn_mask = _dense_keys(attn_mask)
    if attn_mask is not None and attn_mask.dim() and 0 in attn_mask.stride()[:-1]:
        attn_mask = _dense_if_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale, kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kwargs
    )
    want = _empty_in_layout(out, out.shape)
    if out.stride() == want.stride():
        return out
    return want.copy_(out)


def _dense_keys(mask: torch.Tensor) -> torch.Tensor:
    """`mask` with its last two dimensions dense (row-major), the leading dimensions it is
    broadcast along (stride 0, as a bias shared by the batch) still broadcast: one copy of
    the shared part, not one per batch entry."""
    lead = mask.dim() - 2
    index = tuple(
        slice(0, 1) if d < lead and mask.stride(d) == 0 and mask.shape[d] > 1 else slice(None)
        for d in range(mask.dim())
    )
    return mask[index].contiguous().expand(mask.shape)


_MATH = 0  # torch._fused_sdp_choice's number for the math kernel


_EXPAND: dict[tuple, bool] = {}  # call metadata -> whether to expand the mask (bounded)
_EXPAND_LIMIT = 256


def _dense_if_math(query, key, value, attn_mask, dropout_p, is_causal, scale, kwargs):
    """`attn_mask` expanded to the scores' full shape and made dense when the dispatcher
    would give the broadcast one the math kernel and the dense one a fused kernel; else as
    it is. The dispatcher reads only the tensors' metadata, so its answer is asked once per
    kind of call (shapes, strides, dtypes, devices and the other arguments), not per call."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None or query.device.type != "cuda" or query.dim() != 4:
        return attn_mask
    full = (*query.shape[:-1], key.shape[-2])
    tensors = (query, key, value, attn_mask)
    call = (
        *((tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad) for t in tensors),
        dropout_p,
        is_causal,
        scale,
        tuple(sorted(kwargs.items())),
    )
    expand = _EXPAND.get(call)
    if expand is None:
        try:

            def math(mask: torch.Tensor) -> bool:
                args = (query, key, value, mask, dropout_p, is_causal)
                return int(choose(*args, scale=scale, **kwargs)) == _MATH

            # the dense mask's layout, without copying it just to ask
            expand = math(attn_mask) and not math(attn_mask.new_empty(full))
        except Exception:  # a private helper whose signature may change: keep the mask
            expand = False
        if len(_EXPAND) >= _EXPAND_LIMIT:
            _EXPAND.clear()
        _EXPAND[call] = expand
    return attn_mask.expand(full).contiguous() if expand else attn_mask


@attention.register_fake
def _(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    shape = [*query.shape[:-1], value.shape[-1]]
    return _empty_in_layout(query, shape)


def attention_sites(
    gm: fx.GraphModule, devices: Sequence[str] | None = None, keep_layout: bool = True
) -> list[fx.Node]:
    """The `scaled_dot_product_attention` nodes of `gm` on `devices` (default CUDA); with
    `keep_layout` (the group's outputs keep eager's strides) only those whose output only
    other nodes of `gm` read."""
    out = []
    for node in gm.graph.nodes:
        if (
            node.op != "call_function"
            or node.target is not aten.scaled_dot_product_attention.default
        ):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.device.type not in (
            devices or LIBRARY_ATTENTION_DEVICES
        ):
            continue
        if keep_layout and any(u.op == "output" for u in node.users):
            continue  # a group output keeps the layout the plan gave it
        out.append(node)
    return out


def _mask_of(node: fx.Node) -> fx.Node | None:
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    return mask if isinstance(mask, fx.Node) else None


def eager_mask_sites(
    gm: fx.GraphModule, devices: Sequence[str] | None = None, keep_layout: bool = True
) -> list[fx.Node]:
    """Those of `attention_sites(gm, devices, keep_layout)` whose mask is not contiguous
    along its last dimension: eager would hand it to the math kernel."""
    out = []
    for node in attention_sites(gm, devices, keep_layout):
        mask = _mask_of(node)
        val = mask.meta.get("val") if mask is not None else None
        if isinstance(val, torch.Tensor) and val.dim() and val.stride(-1) != 1:
            out.append(node)
    return out


_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False}


def use_library_attention(
    gm: fx.GraphModule,
    devices: Sequence[str] | None = None,
    keep_layout: bool = True,
    sites: Sequence[fx.Node] | None = None,
) -> int:
    """Replace `sites` (default: `attention_sites(gm, devices, keep_layout)`) by
    `fusion_planner::attention` (in place); returns how many. The caller re-propagates fake
    values (the output layout changes)."""
    sites = attention_sites(gm, devices, keep_layout) if sites is None else list(sites)
    g = gm.graph
    for node in sites:
        given = dict(zip(_ARGS, node.args))
        given.update({k: v for k, v in node.kwargs.items() if k in _ARGS})
        args = tuple(given.get(k, _DEFAULTS.get(k)) for k in _ARGS)
        scale = node.kwargs.get("scale")
        gqa = bool(node.kwargs.get("enable_gqa", False))
        with g.inserting_before(node):
            new = g.call_function(torch.ops.fusion_planner.attention.default, (*args, scale, gqa))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        g.erase_node(node)
    if sites:
        gm.recompile()
    return len(sites)
