"""Timing one group alone, or one whole plan, on this machine's device.

A group is cut out of the model's program exactly as a realized plan cuts it
(planner.realize.graph), realized the same way ("auto": SDPA / concatenated GEMM /
Inductor / eager, planner.realize.units), and run on the *real* boundary values of one
eager run of the model on random inputs: right shapes, dtypes and strides, and masks and
indices that mean what they meant. Its outputs are checked against that eager run before
anything is timed. On GPU the group is timed as copies of it back to back in one CUDA
graph (profiling.timer.measure_in_graph), as it runs among a realized plan's kernels.

A whole plan is realized, verified, and timed twice on GPU: whole calls from the host
(`call_s`: guards, input copies into the plan's CUDA graph, its replay, output copies),
and its kernels alone, as copies in one graph (the timing). The host part of a call is
the same for every plan of a graph and jitters: on the H100, the same plans' call times
differed by up to 1.8x between two collections, enough to decide which plan looked best.

Both are measured by the one runner (profiling.runner; `unit_runner` is a collection's
settings of it) and come back as planner.measurement.Measurement records.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from planner.fusion.partition import Partition
from planner.fusion.realization import realization_of
from planner.ir.capture import Captured, export_model
from planner.measurement import Measurement, PlanJob
from planner.realize.check import compare_outputs
from planner.realize.graph import ProgramParts, group_graphs, take_apart
from planner.realize.realizer import GroupCompiler, inductor_compiler
from planner.realize.reference import run_in_high_precision
from planner.realize.units import GroupUnit, fake_mode_of, prepare_unit, reference_values
from profiling.runner import DeviceRunner, RealizedExecutor, compute_dtype
from zoo import modelspec

# Timer settings for one unit: enough reps for a stable median, bounded so that a
# collection covers many units in a device session.
UNIT_TIMER = {"warmup": 2, "min_reps": 10, "max_reps": 100, "max_seconds": 1.0}


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


def unit_runner(device: str | torch.device | None = None) -> DeviceRunner:
    """The runner a collection measures with: the realized plan called directly, its
    kernels timed in one CUDA graph on GPU (module doc), UNIT_TIMER, one check."""
    return DeviceRunner(
        executor=RealizedExecutor(),
        device=device,
        timer=UNIT_TIMER,
        trials=1,
        kernels_in_graph=True,
    )


def measure_group(
    captured: Captured,
    values: dict[str, Any],
    nodes: Iterable[int],
    realization: str = "auto",
    *,
    runner: DeviceRunner | None = None,
    compiler: GroupCompiler | None = None,
    cuda_graphs: bool = True,
) -> Measurement:
    """Realize group `nodes`, check it against eager, time it (see the module doc)."""
    dtype = compute_dtype(captured)
    label = f"group {realization}"
    runner = runner or unit_runner(_device_of([], captured))
    try:
        unit = group_unit(captured, nodes, realization, compiler)
    except Exception as e:  # a group the realizer cannot cut: recorded, not raised
        return runner.failed(label, "realize", e, dtype, executor="callable")
    about = {
        "executor": "callable",
        "compile_s": unit.compile_s,
        "realizations": (unit.realization,),
    }
    if unit.fallback:
        return runner.failed(label, "realize", unit.fallback, dtype, **about)
    args = [unit.extra_state.get(n, values.get(n)) for n in unit.inputs]
    try:
        with torch.no_grad():
            got = unit.run(*args)
        # judged against the group's own ops in high precision on the same inputs
        high = run_in_high_precision(unit.group.module, args[: len(unit.group.inputs)], dtype)
        want = [values[o] for o in unit.group.outputs]
        bad = compare_outputs(want, list(got), dtype, high=high.values)
    except Exception as e:
        return runner.failed(label, "run", e, dtype, **about)
    if bad is not None:
        return runner.failed(label, "accuracy", f"mismatch vs eager: {bad}", dtype, **about)
    m = runner.measure_callable(
        unit.run,
        args,
        label=label,
        compile_s=unit.compile_s,
        dtype=dtype,
        in_graph=cuda_graphs,
    )
    return dataclasses.replace(m, realizations=(unit.realization,))


def measure_plan(
    captured: Captured,
    groups: Sequence[Iterable[int]],
    *,
    runner: DeviceRunner | None = None,
    compiler: GroupCompiler | None = None,
) -> Measurement:
    """Realize the partition `groups`, verify it, time it (see the module doc)."""
    partition = Partition.from_groups(captured.graph, groups)
    if runner is None or compiler is not None:
        runner = unit_runner(_device_of([], captured))
        if compiler is not None:
            runner.executor = RealizedExecutor(compiler=compiler)
    return runner.measure_plan(PlanJob(captured, partition, label="plan"))


def dominant_realization(realizations: Sequence[str]) -> str:
    fused = [x for x in realizations if x != "eager"]
    if not fused:
        return "eager"
    return max(sorted(set(fused)), key=fused.count)


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
