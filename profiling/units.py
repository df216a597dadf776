"""Timing one group alone, or one whole plan, on this machine's device.

A group is cut out of the model's program exactly as a realized plan cuts it
(planner.realize_graph), realized the same way ("auto": SDPA / concatenated GEMM /
Inductor / eager, planner.realize_units), and run on the *real* boundary values of one
eager run of the model on random inputs: right shapes, dtypes and strides, and masks and
indices that mean what they meant. Its outputs are checked against that eager run before
anything is timed. On GPU the group is timed as copies of it back to back in one CUDA
graph (profiling.timer.measure_in_graph), as it runs among a realized plan's kernels.

A whole plan is realized, verified, and timed twice on GPU: whole calls from the host
(`call_s`: guards, input copies into the plan's CUDA graph, its replay, output copies),
and its kernels alone, as copies in one graph (the timing). The host part of a call is
the same for every plan of a graph and jitters: on the H100, the same plans' call times
differed by up to 1.8x between two collections, enough to decide which plan looked best.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from planner import modelspec
from planner.capture import Captured, export_model
from planner.partition import Partition
from planner.realization import realization_of
from planner.realize import GroupCompiler, inductor_compiler, realize
from planner.realize_check import compare_outputs
from planner.realize_graph import ProgramParts, group_graphs, take_apart
from planner.realize_reference import run_in_high_precision
from planner.realize_units import GroupUnit, fake_mode_of, prepare_unit, reference_values
from profiling.timer import Timing, measure, measure_in_graph

# Timer settings for one unit: enough reps for a stable median, bounded so that a
# collection covers many units in a device session.
UNIT_TIMER = {"warmup": 2, "min_reps": 10, "max_reps": 100, "max_seconds": 1.0}


@dataclass(frozen=True)
class Outcome:
    """What measuring one unit gave: a timing, or why there is none."""

    timing: Timing | None
    realization: str
    compile_s: float
    error: str = ""
    cuda_graph: bool = False
    n_fallbacks: int = 0
    call_s: float = math.nan  # plans: median of whole calls from the host (guards, copies)

    @property
    def ok(self) -> bool:
        return self.timing is not None and not self.error


def export_on(
    model: str, shape: str, dtype: str, device: str | torch.device
) -> tuple[Captured, tuple[Any, ...]]:
    """Build `model` at `shape` in `dtype` on `device` (seed 0) and export it."""
    spec = modelspec.resolve(model, shape)
    module, inputs = spec.build(dtype=modelspec.parse_dtype(dtype), device=device)
    return export_model(module, inputs, name=spec.label), inputs


def reference(captured: Captured) -> tuple[ProgramParts, dict[str, Any]]:
    """The program taken apart once, and every value of one eager run on its inputs."""
    parts = take_apart(captured, Partition.singletons(captured.graph))
    keep = set(parts.by_name)
    values, _ = reference_values(parts, captured.example_inputs, keep)
    return parts, values


def group_unit(
    captured: Captured,
    nodes: Iterable[int],
    realization: str = "auto",
    compiler: GroupCompiler | None = None,
) -> GroupUnit:
    """Group `nodes` of `captured` realized (and compiled) as a plan would."""
    graph = captured.graph
    members = sorted(set(nodes))
    if realization == "auto":
        realization = realization_of(graph, members)
    rest = [[i] for i in range(len(graph)) if i not in set(members)]
    partition = Partition.from_groups(graph, [members, *rest])
    parts = take_apart(captured, partition)
    index = partition.group_of[members[0]]
    (gg,) = group_graphs(parts, partition, only=index)
    return prepare_unit(
        graph, parts, gg, realization, compiler or inductor_compiler(), fake_mode_of(parts)
    )


def _timed(fn: Any, device: torch.device, dtype: str, graphs: bool) -> tuple[Timing, bool]:
    if graphs and device.type == "cuda":
        try:
            return measure_in_graph(fn, device=device, dtype=dtype, **UNIT_TIMER), True
        except Exception:  # not capturable: time it as it is
            torch.cuda.synchronize()
    return measure(fn, device=device, dtype=dtype, **UNIT_TIMER), False


def measure_group(
    captured: Captured,
    values: dict[str, Any],
    nodes: Iterable[int],
    realization: str = "auto",
    *,
    compiler: GroupCompiler | None = None,
    cuda_graphs: bool = True,
) -> Outcome:
    """Realize group `nodes`, check it against eager, time it (see the module doc)."""
    dtype = _dtype(captured)
    try:
        unit = group_unit(captured, nodes, realization, compiler)
    except Exception as e:  # a group the realizer cannot cut: recorded, not raised
        return Outcome(None, realization, 0.0, f"cut: {type(e).__name__}: {str(e)[:200]}")
    if unit.fallback:
        return Outcome(None, unit.requested, unit.compile_s, unit.fallback)
    args = [unit.extra_state.get(n, values.get(n)) for n in unit.inputs]
    device = _device_of(args, captured)
    try:
        with torch.no_grad():
            got = unit.run(*args)
        # judged against the group's own ops in high precision on the same inputs
        high = run_in_high_precision(unit.group.module, args[: len(unit.group.inputs)], dtype)
        want = [values[o] for o in unit.group.outputs]
        bad = compare_outputs(want, list(got), dtype, high=high.values)
    except Exception as e:
        return Outcome(None, unit.realization, unit.compile_s, f"run: {type(e).__name__}: {e}")
    if bad is not None:
        return Outcome(None, unit.realization, unit.compile_s, f"mismatch vs eager: {bad}")
    with torch.no_grad():
        timing, graphed = _timed(lambda: unit.run(*args), device, dtype, cuda_graphs)
    return Outcome(timing, unit.realization, unit.compile_s, "", graphed)


def measure_plan(
    captured: Captured,
    groups: Sequence[Iterable[int]],
    *,
    compiler: GroupCompiler | None = None,
) -> Outcome:
    """Realize the partition `groups` (auto realizations, verified), time whole calls."""
    dtype = _dtype(captured)
    partition = Partition.from_groups(captured.graph, groups)
    try:
        r = realize(captured, partition, compiler=compiler, verify=True)
    except Exception as e:
        return Outcome(None, "auto", 0.0, f"realize: {type(e).__name__}: {str(e)[:200]}")
    if not r.verified:
        return Outcome(None, "auto", r.compile_s, "plan disagrees with eager", r.cuda_graph)
    inputs = tuple(captured.example_inputs)
    with torch.no_grad():
        call = measure(lambda: r(*inputs), device=r.device, dtype=dtype, **UNIT_TIMER)
        timing = call
        if r.cuda_graph:  # the plan's kernels alone, as copies in one graph (module doc)
            try:
                timing = measure_in_graph(
                    lambda: r.run_flat(*inputs), device=r.device, dtype=dtype, **UNIT_TIMER
                )
            except Exception:  # not capturable this way: the whole call stands for it
                torch.cuda.synchronize()
    return Outcome(
        timing,
        _dominant(r.realizations),
        r.compile_s,
        "",
        r.cuda_graph,
        len(r.fallbacks),
        call.median_s,
    )


def _dominant(realizations: Sequence[str]) -> str:
    fused = [x for x in realizations if x != "eager"]
    if not fused:
        return "eager"
    return max(sorted(set(fused)), key=fused.count)


def _dtype(captured: Captured) -> str:
    """The model's compute dtype: its first floating input's, else its parameters' (a
    token-id model's float inputs are its weights)."""
    for kinds in (("input",), ("param", "buffer", "const")):
        for t in captured.graph.tensors:
            if t.kind in kinds and t.dtype.startswith(("float", "bfloat")):
                return t.dtype
    return "float32"


def _device_of(args: Sequence[Any], captured: Captured) -> torch.device:
    for a in list(args) + list(captured.example_inputs):
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def nan_timing_fields() -> dict[str, float]:
    return {
        "measured_median_s": math.nan,
        "measured_p99_s": math.nan,
        "measured_iqr_s": math.nan,
        "measured_min_s": math.nan,
    }
