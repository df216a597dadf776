"""The graphs a model with graph breaks is served as, each with the bucket it is tuned for.

`torch.compile` splits a model with a graph break (a `print`, a `.item()` branch, a call
dynamo cannot trace) into several graphs, and the runtime backend plans each one on its
own, keyed by its own structure key. A plan tuned on the whole model (exported in one
piece) is never met there, so `tune` tunes each graph the backend will meet instead
(`served_parts`).

Each graph's inputs are the tensors dynamo hands it (activations, not the model's inputs),
so the bucket spec the runtime looks it up with is derived here: every named dimension of
the tuning job (`S`, `B`) is moved by one step on its own, the model traced again, and an
axis of a graph's input that moved with it by the same step is that dimension (`DynamicDim`
with the job's policy). An axis that moves differently (a flattened `B*S`) cannot be
named by one dimension; it stays exact, and the part says so: its plan then serves only
the representative's size of that axis.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from planner.errors import CaptureError, first_line
from planner.ir.capture import Captured, export_model
from planner.measurement import Timing
from planner.plans.buckets import Bucket, BucketSpec, DynamicDim
from planner.plans.cache import PlanCache
from planner.runtime.backend import FusionPlannerBackend
from planner.runtime.graph import LiftedGraph, LiftError, trace_graphs, trace_served
from profiling.runner import DeviceRunner, ServedExecutor, first_call


@dataclass(frozen=True)
class Part:
    """One graph the backend serves for the model: `module` (dynamo's graph lifted) run
    on `inputs`, captured as the backend captures it, with the spec and bucket it is
    stored under. `notes`: what limits where its plan applies."""

    index: int  # 1-based, in the order dynamo compiled the graphs
    count: int
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    captured: Captured | None  # None: not plannable (see `skipped`)
    spec: BucketSpec | None
    bucket: Bucket | None
    notes: tuple[str, ...] = ()
    skipped: str = ""  # why this graph is not tuned (the backend runs it as dynamo's graph)
    # other buckets of `spec` the same graph is called with in one forward (one layer's
    # code reused at other sizes): its plan is stored for them too
    also: tuple[Bucket, ...] = ()

    @property
    def label(self) -> str:
        return f"graph {self.index} of {self.count}"


@dataclass(frozen=True)
class Served:
    """How `torch.compile` serves a model at one call: as one graph (`whole`: dynamo's
    graph lifted, and the user tensors it takes), or as several (`parts`: graph breaks);
    neither when dynamo cannot trace it (the caller exports the model directly)."""

    whole: tuple[LiftedGraph, tuple[Any, ...]] | None = None
    parts: list[Part] | None = None


def served_graphs(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    spec: BucketSpec,
    bucket: Bucket,
    label: str,
) -> Served:
    """The graph, or the graphs, `torch.compile` serves `module` as at `inputs` (a call at
    the bucket's representative); see `Served`."""
    calls: list[list[tuple[tuple[int, ...], ...]]] = []
    whole, graphs = trace_served(module, inputs, calls)
    if whole is not None:
        return Served(whole=whole)
    return Served(parts=served_parts(module, inputs, graphs, calls, spec, bucket, label))


def served_parts(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    graphs: list[tuple[LiftedGraph, tuple] | LiftError] | None,
    calls: list[list[tuple[tuple[int, ...], ...]]],
    spec: BucketSpec,
    bucket: Bucket,
    label: str,
) -> list[Part] | None:
    """The parts of a model dynamo does not trace as one graph, from `trace_graphs`'
    `graphs` and `calls` at `inputs` (see `served_graphs`); None when dynamo cannot run
    it at all (`graphs` None), or none of its graphs can be planned."""
    if graphs is None or not any(isinstance(g, tuple) for g in graphs):
        return None  # nothing the backend could plan: the whole-model path reports it
    moved = _moved_traces(module, inputs, spec, len(graphs))
    parts: list[Part] = []
    seen_keys: dict[str, int] = {}  # structure key -> its part's index in `parts`
    n = len(graphs)
    for k, g in enumerate(graphs, 1):
        if isinstance(g, LiftError):
            parts.append(Part(k, n, module, (), None, None, None, skipped=first_line(g)))
            continue
        lifted, user = g
        # a fresh module over the same graph and state: dynamo will not trace the code of
        # a module made inside its own compile (the lift ran in a backend) a second time
        program = fx.GraphModule(lifted.module, lifted.module.graph)
        try:
            captured = export_model(program, user, name=f"{label} [graph {k} of {n}]")
        except Exception as e:  # the backend would fail to export it too: dynamo's graph runs
            why = f"{type(e).__name__}: {first_line(e)}"
            parts.append(Part(k, n, program, user, None, None, None, skipped=why))
            continue
        key = captured.graph.structure_key
        if key in seen_keys:  # the same graph again (a layer's code reused): tuned once
            first = parts[seen_keys[key]]
            other = first.spec.bucket_of([tuple(x.shape) for x in user]) if first.spec else None
            if other is not None and other not in (first.bucket, *first.also):
                parts[seen_keys[key]] = replace(first, also=(*first.also, other))
            continue
        seen_keys[key] = len(parts)
        part_spec, part_bucket, notes = _part_bucket(user, k - 1, spec, bucket, moved)
        others = (part_spec.bucket_of(shapes) for shapes in calls[k - 1])
        also = tuple(dict.fromkeys(b for b in others if b is not None and b != part_bucket))
        parts.append(Part(k, n, program, user, captured, part_spec, part_bucket, notes, also=also))
    return parts


def _moved_traces(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    spec: BucketSpec,
    count: int,
) -> dict[str, tuple[int, int, list[list[tuple[int, ...]] | None]] | str]:
    """For each dimension name of `spec`: (its size at `inputs`, its size one step away,
    each graph's user-input shapes traced there), or why it could not be traced (a string).
    The step narrows the inputs' axes of that name by one (grows them, repeating the first
    slice, where narrowing would reach a size dynamo specializes)."""
    leaves = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    positions: dict[str, list[tuple[int, int]]] = {}
    for d in spec.dims:
        positions.setdefault(d.name, []).append((d.input, d.axis))
    out: dict[str, Any] = {}
    for name, where in positions.items():
        i0, a0 = where[0]
        if i0 >= len(leaves) or a0 >= leaves[i0].dim():
            out[name] = f"{name} is not an axis of the call's tensors"
            continue
        size = int(leaves[i0].shape[a0])
        step = size - 1 if size - 1 >= 2 else size + 1
        new = list(leaves)
        for i, a in where:
            t = new[i]
            # contiguous, as the call's own tensors are (dynamo can split a narrowed view's
            # program into other graphs than the call's)
            if step < size:
                new[i] = t.narrow(a, 0, step).contiguous()
            else:
                new[i] = torch.cat([t, t.narrow(a, 0, 1)], a)
        moved_inputs = _with_tensors(inputs, new)
        try:
            graphs = trace_graphs(module, moved_inputs)
        except CaptureError as e:
            out[name] = f"the model does not run with {name}={step}: {first_line(e)}"
            continue
        if len(graphs) != count:
            out[name] = f"the model breaks into another number of graphs at {name}={step}"
            continue
        shapes = [[tuple(x.shape) for x in g[1]] if isinstance(g, tuple) else None for g in graphs]
        out[name] = (size, step, shapes)
    return out


def _with_tensors(inputs: tuple[Any, ...], tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    """`inputs` with its tensor leaves replaced, in order, by `tensors`."""
    it = iter(tensors)
    return pytree.tree_map(lambda x: next(it) if isinstance(x, torch.Tensor) else x, inputs)


def _part_bucket(
    user: tuple[torch.Tensor, ...],
    index: int,
    spec: BucketSpec,
    bucket: Bucket,
    moved: dict[str, Any],
) -> tuple[BucketSpec, Bucket, tuple[str, ...]]:
    """The spec and bucket of graph `index` (0-based), whose user inputs at the
    representative are `user`: each axis that moved with a dimension, by that dimension's
    step, is that dimension, with its policy and its range in `bucket`."""
    shapes = [tuple(int(s) for s in x.shape) for x in user]
    policy = {d.name: p for d, p in zip(spec.dims, spec.policies)}
    ranges = {}
    for d in spec.dims:
        ranges.setdefault(d.name, bucket.dims[d.input][d.axis])
    dims: list[DynamicDim] = []
    notes: list[str] = []
    claimed: set[tuple[int, int]] = set()
    for name, found in moved.items():
        if isinstance(found, str):
            notes.append(f"{name} is exact in this graph's bucket ({found})")
            continue
        size, step, graphs = found
        there = graphs[index]
        if there is None or len(there) != len(shapes):
            notes.append(f"{name} is exact in this graph's bucket (its inputs differ there)")
            continue
        for i, (a_shape, b_shape) in enumerate(zip(shapes, there)):
            if len(a_shape) != len(b_shape):
                notes.append(f"{name} is exact in this graph's bucket (its inputs differ there)")
                break
            for axis, (x, y) in enumerate(zip(a_shape, b_shape)):
                if x == y:
                    continue
                if x == size and y == step and (i, axis) not in claimed:
                    dims.append(DynamicDim(name, i, axis))
                    claimed.add((i, axis))
                elif (i, axis) not in claimed:
                    notes.append(
                        f"input {i} axis {axis} ({x}) moves with {name} but is not {name}: "
                        f"exact in this graph's bucket, so its plan serves {name}={size} "
                        "only on that axis"
                    )
    part_spec = BucketSpec(tuple(dims), tuple(policy[d.name] for d in dims))
    out: list[list[Any]] = [list(s) for s in shapes]
    for d in dims:
        out[d.input][d.axis] = ranges[d.name]
    return part_spec, Bucket(tuple(tuple(s) for s in out)), tuple(dict.fromkeys(notes))


def whole_model_served(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    cache: PlanCache,
    device: torch.device,
    timer: dict[str, Any],
    dtype: str,
) -> tuple[Timing | None, Timing | None, str]:
    """The model with graph breaks as the user runs it once its graphs are tuned:
    `torch.compile(module, backend=fusion_planner_backend(cache), dynamic=True)` against
    eager, timed in interleaved rounds (the Python between the graphs included, which the
    per-graph rows leave out). (eager, served, "") or (None, None, why it failed)."""
    backend = FusionPlannerBackend(cache, device=device, record_misses=False)
    compiled = torch.compile(module, backend=backend, dynamic=True)
    runner = DeviceRunner(executor=ServedExecutor(), device=device, timer=timer)
    try:
        setup, _ = first_call(lambda: compiled(*inputs), device)
        timed = runner.measure_interleaved(
            {"eager": lambda: module(*inputs), "served": lambda: compiled(*inputs)},
            dtype=dtype,
            compile_s={"served": setup},
        )
    except Exception as e:  # the per-graph plans stand; only this figure is missing
        return None, None, f"{type(e).__name__}: {first_line(e)}"
    finally:
        torch._dynamo.reset()
    eager, served = timed["eager"], timed["served"]
    if eager.timing is None or served.timing is None:
        return None, None, str(eager.error or served.error)
    if backend.stats.default or backend.stats.fallbacks:
        why = f"served with {backend.stats.default} default plan(s)"
        return eager.timing, served.timing, why
    return eager.timing, served.timing, ""
