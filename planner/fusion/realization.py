"""The realization rule: how one group of a partition runs, decided in one place.

A group becomes code in one of the ways of `REALIZATIONS`. `realization_of(graph, nodes)`
picks one by `REALIZATION_RULES`, the first rule that holds winning; attention and sibling
GEMMs are found by planner.fusion.recognize, the recognizer the pattern library uses too. Every
stage takes its labels from this function:

- the objective labels each group of a Plan with it (`Objective.make_plan`,
  `Plan.from_partition`);
- `planner.realize.realizer` runs the Plan's labels, and derives them with this rule for a bare
  partition or an unlabelled plan;
- the realized-roofline cost model splits a group into the kernels of its label, the
  learned model reads the label as a feature, and the profiling collector writes it into
  every dataset row.

So the label the cost model scored, the one measured and the one served are the same.
`unmet(graph, nodes, label)` says why a group cannot run as a given label (a plan stored
by another version may ask for a kernel whose pattern the group no longer holds);
`planner.realize.realizer` then runs the rule's own label for that group and warns with the reason.
docs/realization.md has the rule, its consumers and the fallbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from planner.fusion.opkinds import Kind, kinds
from planner.fusion.recognize import find_attention, find_sibling_gemms
from planner.ir.graph import OpGraph

log = logging.getLogger(__name__)

# Recorded in every Plan's `versions` ("realization_rule"): a plan that records another
# version, or none, has its labels re-derived by realize (`current_labels`), with a
# warning where they change, rather than trusted.
RULE_VERSION = "2"

# How a group becomes executable code (planner.realize.realizer):
REALIZATIONS = (
    "inductor",  # the group's aten subgraph compiled by TorchInductor as one unit
    "sdpa",  # the attention pattern -> torch.nn.functional.scaled_dot_product_attention
    "concat_gemm",  # sibling GEMMs on one input -> one GEMM on concatenated weights
    "eager",  # run the aten ops as they are (singletons, fallbacks, opaque ops)
)

# A compiled label may carry a compile mode after a "+": the same rewrite, compiled with
# other Inductor options. The mode changes how the group's kernels are generated, not which
# ops they hold, so the learned model's one-hot features (REALIZATIONS) read the base label.
MODES = {
    "autotune": "Inductor max-autotune: Triton GEMM/convolution templates benchmarked "
    "against the library call, the group's epilogue fused into the winning template",
}
COMPILED = ("inductor", "sdpa", "concat_gemm")  # the labels Inductor compiles
LABELS = REALIZATIONS + tuple(f"{b}+{m}" for b in COMPILED for m in MODES)


@dataclass(frozen=True)
class RealizationRule:
    """One entry of the rule: `label` when `holds(graph, members, work)`; `members` are the
    group's nodes (sorted), `work` those that are not views."""

    label: str
    holds: Callable[[OpGraph, list[int], list[int]], bool]
    why: str
    test: str


# GEMM ops whose operands' last dims are the leading dimensions cuBLAS sees
_GEMMS = ("mm", "bmm", "matmul", "addmm", "baddbmm", "linear")
_ALIGN_BYTES = 16  # tensor-core GEMMs want every leading dimension a multiple of 16 bytes


def misaligned_gemm(g: OpGraph, node: int) -> bool:
    """Whether node `node` is a GEMM with a contracted (K) or output (N) size that is not a
    multiple of 16 bytes of its dtype: cuBLAS then falls back to slow unaligned kernels
    (an LM head over GPT-2's 50257-token vocabulary, on an H100), while
    Inductor pads such a GEMM to an aligned shape first (its `pad_mm` pass)."""
    n = g.nodes[node]
    if n.op not in _GEMMS or not n.inputs or not n.outputs:
        return False
    first = g.tensors[n.inputs[1 if n.op in ("addmm", "baddbmm") else 0]]
    out = g.tensors[n.outputs[0]]
    if not first.shape or not out.shape:
        return False
    per = max(1, _ALIGN_BYTES // out.itemsize)
    return first.shape[-1] % per != 0 or out.shape[-1] % per != 0


def _lone_misaligned_gemm(g: OpGraph, members: list[int], work: list[int]) -> bool:
    return len(work) == 1 and misaligned_gemm(g, work[0])


def _opaque(g: OpGraph, members: list[int], work: list[int]) -> bool:
    ks = kinds(g)
    return any(ks[i] is Kind.OPAQUE for i in work)


# The rule, first entry that holds wins. The learned cost model was trained on these labels
# (the collector wrote them); a change here changes what its `realization_*` features mean.
# fmt: off
REALIZATION_RULES: tuple[RealizationRule, ...] = (
    RealizationRule("eager", _opaque,
                    "opaque ops and collectives cannot be compiled into a fused unit",
                    "test_realization::test_rule_table_on_hand_built_groups"),
    RealizationRule("inductor", _lone_misaligned_gemm,
                    "a GEMM whose K or N is not a multiple of 16 bytes: Inductor pads it to an "
                    "aligned shape, where the library call runs an unaligned kernel",
                    "test_realization::test_lone_misaligned_gemm_is_compiled"),
    RealizationRule("eager", lambda g, ms, work: len(work) <= 1,
                    "one op (plus views) has nothing to fuse: its eager kernel is the fused "
                    "kernel", "test_realization::test_rule_table_on_hand_built_groups"),
    RealizationRule("sdpa", lambda g, ms, work: bool(find_attention(g, ms)),
                    "explicit attention -> one SDPA call: the score matrix never reaches memory",
                    "test_realize::test_sdpa_and_concat_rewrites_match_eager"),
    RealizationRule("concat_gemm", lambda g, ms, work: bool(find_sibling_gemms(g, ms)),
                    "sibling GEMMs on one input -> one GEMM: the input is read once; Inductor "
                    "compiles what else the group holds around it",
                    "test_realize::test_sdpa_and_concat_rewrites_match_eager"),
    RealizationRule("inductor", lambda g, ms, work: True,
                    "anything else: Inductor fuses the group as one unit",
                    "test_realize::test_transformer_block_compiled_by_inductor_matches_eager"),
)
# fmt: on


def split_label(label: str) -> tuple[str, str]:
    """(base realization, compile mode) of a label: "inductor+autotune" -> ("inductor",
    "autotune"); a label without a mode has mode ""."""
    base, _, mode = label.partition("+")
    return base, mode


def _has_anchor(graph: OpGraph, members: list[int]) -> bool:
    """Whether the group holds a GEMM or convolution (what a GEMM template would run)."""
    ks = kinds(graph)
    return any(ks[i] is Kind.ANCHOR for i in members)


def _members(nodes: int | Iterable[int]) -> list[int]:
    if isinstance(nodes, int):
        return [i for i in range(nodes.bit_length()) if nodes >> i & 1]
    return sorted(set(nodes))


def rule_for(graph: OpGraph, nodes: int | Iterable[int]) -> RealizationRule:
    """The entry of `REALIZATION_RULES` that decides the group (a bitmask or node indices)."""
    members = _members(nodes)
    ks = kinds(graph)
    work = [i for i in members if ks[i] is not Kind.FREE]
    for rule in REALIZATION_RULES:
        if rule.holds(graph, members, work):
            return rule
    raise AssertionError("the last realization rule always holds")  # pragma: no cover


def realization_of(graph: OpGraph, nodes: int | Iterable[int]) -> str:
    """How the group `nodes` (a bitmask or node indices) of `graph` runs: one of
    `REALIZATIONS`, by `REALIZATION_RULES`."""
    return rule_for(graph, nodes).label


def realizations_of(graph: OpGraph, groups: Iterable[int | Iterable[int]]) -> tuple[str, ...]:
    """`realization_of` for each group of a partition (masks or node sets), in order."""
    return tuple(realization_of(graph, g) for g in groups)


def unmet(graph: OpGraph, nodes: int | Iterable[int], label: str) -> str | None:
    """Why the group cannot run as `label` (None when it can). A fused-kernel label needs
    its pattern inside the group; "inductor" and "eager" can always be attempted (a group
    Inductor cannot compile falls back to eager at realization, with its reason)."""
    if label not in LABELS:
        return f"unknown realization {label!r} (known: {', '.join(LABELS)})"
    members = _members(nodes)
    label, mode = split_label(label)
    if mode and not _has_anchor(graph, members):
        return f"the group holds no GEMM or convolution for {mode} templates to run"
    if label == "sdpa" and not find_attention(graph, members):
        return "the group holds no attention pattern the SDPA rewrite applies to"
    if label == "concat_gemm" and not find_sibling_gemms(graph, members):
        return "the group holds no sibling linears on one input to concatenate"
    return None


def choices_for(graph: OpGraph, nodes: int | Iterable[int]) -> tuple[str, ...]:
    """The labels worth trying for a group, the rule's first; one label when there is no
    choice that changes the group's kernels.

    Only groups holding a GEMM or convolution get more: Inductor's default (the library
    call, the rest fused into separate kernels) is the rule's; its max-autotune templates
    with the epilogue fused ("+autotune"); for a fused-kernel label, the ops compiled as
    they are instead (separate GEMMs rather than one on concatenated weights, explicit
    attention rather than SDPA); and eager (each op its own kernel, no compile). Opaque
    groups run eagerly whatever is asked."""
    members = _members(nodes)  # once: `nodes` may be an iterator
    rule = rule_for(graph, members)
    if rule.label == "eager" and _opaque(graph, members, members):
        return (rule.label,)
    if not _has_anchor(graph, members):
        return (rule.label,)
    out = [rule.label]
    bases = [rule.label] if rule.label != "eager" else []
    if rule.label in ("sdpa", "concat_gemm"):
        bases.append("inductor")
    if rule.label == "eager":
        bases.append("inductor")  # one GEMM alone: a template may beat the library call
    for b in bases:
        for label in (b, *(f"{b}+{m}" for m in MODES)):
            if label not in out:
                out.append(label)
    if "eager" not in out:
        out.append("eager")
    return tuple(out)


def labels_to_run(
    graph: OpGraph,
    groups: Sequence[Iterable[int]],
    recorded: Mapping[tuple[int, ...], str] | None,
    realizations: str | Sequence[str] | Mapping[int, str] = "plan",
) -> list[str]:
    """The label each group (of a partition, in order) is asked to run as.

    `recorded`: a Plan's labels by sorted node tuple (None for a bare partition).
    `realizations`: "plan" (the recorded label; the rule's where none is recorded),
    "auto" (the rule's for every group), one label for all, or one per group (a sequence,
    or {group index: label} with the rule's for the groups left out). Raises ValueError
    for an unknown label or a sequence of the wrong length.
    """
    n = len(groups)
    if realizations in ("plan", "auto"):
        recorded = recorded if realizations == "plan" else None
        wanted = [(recorded or {}).get(tuple(sorted(g)), "") for g in groups]
        unlabelled = [i for i, r in enumerate(wanted) if not r]
        for i in unlabelled:
            wanted[i] = realization_of(graph, groups[i])
        if recorded is not None and unlabelled:
            log.info("the plan records no realization for %d group(s): the rule's", len(unlabelled))
    elif isinstance(realizations, str):
        wanted = [realizations] * n
    elif isinstance(realizations, Mapping):
        wanted = [realizations.get(i) or realization_of(graph, g) for i, g in enumerate(groups)]
    else:
        wanted = list(realizations)
        if len(wanted) != n:
            raise ValueError(f"{len(wanted)} realizations for {n} groups")
    bad = sorted({r for r in wanted if r not in LABELS})
    if bad:
        raise ValueError(f"unknown realization(s) {bad}; use 'auto', 'plan' or {LABELS}")
    return wanted


def current_labels(
    graph: OpGraph,
    groups: Sequence[Iterable[int]],
    recorded: Mapping[tuple[int, ...], str],
    versions: Mapping[str, str],
) -> tuple[dict[tuple[int, ...], str], str]:
    """A plan's labels (by sorted node tuple) as realize should run them, and why they
    changed ("" when they did not): a plan recording another `RULE_VERSION`, or none (its
    labels were not necessarily what realize ran), runs as the current rule labels its
    groups."""
    rule = versions.get("realization_rule")
    if rule == RULE_VERSION:
        return dict(recorded), ""
    derived = {tuple(sorted(g)): realization_of(graph, g) for g in groups}
    changed = sum(1 for k, v in derived.items() if recorded.get(k) not in ("", v))
    if not changed:
        return derived, ""
    since = f"rule {rule}" if rule else "no recorded rule"
    return derived, (
        f"the plan's realization labels were made under {since}, this is rule {RULE_VERSION}:"
        f" its groups run as the current rule labels them ({changed} label(s) differ)"
    )


def substitute_unmet(
    graph: OpGraph, groups: Sequence[Iterable[int]], wanted: list[str]
) -> dict[int, str]:
    """Replace, in `wanted`, each label its group cannot run as (`unmet`) by the rule's own
    label for the group; returns {group index: what was asked, what runs and why}, for the
    caller to warn with. Never a different realization without such a reason."""
    out: dict[int, str] = {}
    for gi, label in enumerate(wanted):
        why = unmet(graph, groups[gi], label)
        if why is None:
            continue
        instead = realization_of(graph, groups[gi])
        out[gi] = f"asked for {label}, runs as {instead}: {why}"
        wanted[gi] = instead
    return out


__all__ = [
    "COMPILED",
    "LABELS",
    "MODES",
    "REALIZATIONS",
    "REALIZATION_RULES",
    "RULE_VERSION",
    "RealizationRule",
    "choices_for",
    "current_labels",
    "labels_to_run",
    "realization_of",
    "realizations_of",
    "rule_for",
    "split_label",
    "substitute_unmet",
    "unmet",
]
