"""Convolutions in channels-last across group boundaries.

cuDNN runs 2-D convolutions fastest on channels-last (NHWC) tensors, and Inductor lays a
convolution's input and weight out that way inside a compiled group. With eager's layout
(NCHW) at every group boundary, each group converts its input to channels-last and its
output back, and converts each weight on every call: a plan of many small convolution
groups pays a conversion kernel per boundary and per weight that a whole-model compile
pays once (on the H100, ResNet-18 at batch 1: 37 such launches against 5).

When layouts propagate (planner.realize.layout), a group with such a convolution is
rewritten so that:

- the convolution's input goes through `aten.contiguous(memory_format=channels_last)`,
  which copies only a value that is not channels-last already: the first group converts
  the image once; after that each group receives channels-last values from its producer,
  since the convolution's result and the pointwise ops after it keep that layout;
- a weight that is model state runs as a channels-last copy made once, at realization
  (the unit's extra state, as padded or concatenated weights are).

Only ungrouped, non-transposed 2-D convolutions of floating tensors on `devices` (CUDA by
default: on the CPU, Inductor picks mkldnn's layouts itself) are rewritten; grouped and
depthwise convolutions, which Inductor's own layout heuristic also leaves in NCHW, keep
eager's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from planner.realize.derived import Recipe, derive

aten = torch.ops.aten

CHANNELS_LAST_DEVICES: tuple[str, ...] = ("cuda",)

# target -> (index of `groups`, index of `transposed` or None) in its positional arguments
_CONVS: dict[Any, tuple[int, int | None]] = {
    aten.conv2d.default: (6, None),
    aten.convolution.default: (8, 6),
}
_DEFAULTS = {aten.conv2d.default: {6: 1}, aten.convolution.default: {}}


def _arg(node: fx.Node, i: int | None, name: str, default: Any) -> Any:
    if i is None:
        return default
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(name, _DEFAULTS[node.target].get(i, default))


def conv_sites(gm: fx.GraphModule, devices: Sequence[str] = CHANNELS_LAST_DEVICES) -> list[fx.Node]:
    """The convolutions of `gm` that run channels-last (see the module doc)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _CONVS:
            continue
        gi, ti = _CONVS[node.target]
        x = node.args[0]
        w = node.args[1]
        xv = x.meta.get("val") if isinstance(x, fx.Node) else None
        wv = w.meta.get("val") if isinstance(w, fx.Node) else None
        if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
            continue
        if xv.dim() != 4 or wv.dim() != 4 or not xv.is_floating_point():
            continue
        if xv.device.type not in devices:
            continue
        if _arg(node, gi, "groups", 1) != 1 or _arg(node, ti, "transposed", False):
            continue
        out.append(node)
    return out


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def to_channels_last(
    gm: fx.GraphModule,
    state: dict[str, torch.Tensor],
    names: list[str],
    fakes: list[Any],
    fake_mode: Any,
    prefix: str,
    recipes: dict[str, Recipe],
) -> tuple[dict[str, torch.Tensor], int]:
    """Rewrite `gm` in place as the module doc says; `state` maps the placeholders that are
    model state to their tensors. New placeholders (channels-last weight copies, named
    `prefix` + a number, their recipes recorded in `recipes`: planner.realize.derived) are
    appended to `names` and `fakes`. Returns the copies made and the number of
    convolutions rewritten (0: `gm` is unchanged)."""
    sites = conv_sites(gm, CHANNELS_LAST_DEVICES)
    if not sites:
        return {}, 0
    g = gm.graph
    extra: dict[str, torch.Tensor] = {}
    copies: dict[str, fx.Node] = {}
    converted: dict[fx.Node, fx.Node] = {}
    last = [n for n in g.nodes if n.op == "placeholder"][-1]
    for node in sites:
        x, w = node.args[0], node.args[1]
        if x not in converted:
            with g.inserting_before(node):
                converted[x] = g.call_function(
                    aten.contiguous.default, (x,), {"memory_format": torch.channels_last}
                )
        new_w = w
        if w.op == "placeholder" and w.target in state:
            if w.target not in copies:
                name = f"{prefix}{len(extra)}"
                extra[name] = derive(recipes, name, [w.target], _channels_last, state)
                with g.inserting_after(last):
                    last = copies[w.target] = g.placeholder(name)
                names.append(name)
                fakes.append(fake_mode.from_tensor(extra[name], static_shapes=True))
            new_w = copies[w.target]
        node.args = (converted[x], new_w, *node.args[2:])
    g.lint()
    gm.recompile()
    return extra, len(sites)
