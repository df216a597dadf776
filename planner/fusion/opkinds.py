"""Fusion kinds: how an op behaves when fused, as a table over op categories and targets.

The taxonomy (planner/ir/taxonomy.py) says what an op *costs*; this table says how it may
*fuse*. The kinds follow TVM's OpPatternKind (elemwise < broadcast < injective <
comm-reduce < out-elemwise-fusable < opaque), plus FREE for views, which move nothing and
may join any group. Legality (planner/fusion/legality.py), the rule-based default partition
(planner/fusion/fuse_rules.py) and the pattern library (planner/fusion/patterns.py) all read kinds from
here, so a change of mind about one op is one line.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from planner.ir.graph import Category, OpGraph, OpNode


class Kind(enum.IntEnum):
    """Ordered like TVM's OpPatternKind: a path of kinds <= K fuses under rules for K."""

    FREE = 0  # views: metadata only
    ELEMWISE = 1  # one output element from the same element of each input
    BROADCAST = 2  # elementwise with broadcasting or generated values (creation ops)
    INJECTIVE = 3  # each output element from one input element, any index map (copies, cat)
    REDUCE = 4  # reductions, norms, softmax: an output element from many input elements
    ANCHOR = 5  # GEMM / conv / attention: tensor-core kernels that take elementwise epilogues
    OPAQUE = 6  # unknown ops and collectives: never fused


@dataclass(frozen=True)
class KindRule:
    applies: Callable[[OpNode], bool]
    kind: Kind
    why: str


def _is_inference_batch_norm(n: OpNode) -> bool:
    if "no_training" in n.target or "_no_update" in n.target:
        return True
    return n.op in ("batch_norm", "native_batch_norm") and dict(n.attrs).get("training") is False


# First matching rule wins; the category table at the end is the fallback.
# fmt: off
KIND_RULES: tuple[KindRule, ...] = (
    # Inference BN is y = x * scale[c] + shift[c]: an elementwise map with per-channel
    # constants, which is why Conv->BN->Act fuses (test_patterns::test_conv_bn_act).
    KindRule(_is_inference_batch_norm, Kind.ELEMWISE, "inference BN is a per-channel affine map"),
    KindRule(lambda n: n.category is Category.VIEW, Kind.FREE, "views move no bytes"),
    KindRule(lambda n: n.category is Category.POINTWISE, Kind.ELEMWISE, "elementwise map"),
    KindRule(lambda n: n.category is Category.BROADCAST, Kind.BROADCAST,
             "generated or broadcast values: computed in place by the consumer's loop"),
    KindRule(lambda n: n.category is Category.COPY, Kind.INJECTIVE,
             "index remapping: fuses as a load with another index expression"),
    KindRule(lambda n: n.category in (Category.REDUCTION, Category.NORM, Category.SOFTMAX),
             Kind.REDUCE, "needs a whole row before it can emit an element"),
    KindRule(lambda n: n.category is Category.COMPUTE, Kind.ANCHOR,
             "tensor-core kernel: takes epilogues, not prologues"),
    KindRule(lambda n: n.category in (Category.OPAQUE, Category.COLLECTIVE), Kind.OPAQUE,
             "unknown semantics or communication: never fused"),
)
# fmt: on


def kind_of(node: OpNode) -> Kind:
    for rule in KIND_RULES:
        if rule.applies(node):
            return rule.kind
    return Kind.OPAQUE  # a category added later without a rule here is never fused


_KINDS_CACHE: dict[str, tuple[Kind, ...]] = {}


def kinds(graph: OpGraph) -> tuple[Kind, ...]:
    """kind_of for every node of `graph`, cached per graph key."""
    got = _KINDS_CACHE.get(graph.key)
    if got is None or len(got) != len(graph.nodes):
        got = tuple(kind_of(n) for n in graph.nodes)
        if len(_KINDS_CACHE) > 256:
            _KINDS_CACHE.clear()
        _KINDS_CACHE[graph.key] = got
    return got


def elementwise_like(kind: Kind) -> bool:
    """Kinds that fuse freely with each other in one loop nest."""
    return kind <= Kind.INJECTIVE
