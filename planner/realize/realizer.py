"""Realize a plan: every group of a partition becomes one executable unit.

    realized = realize(captured, plan)        # captured = planner.ir.capture.export_model(...)
    y = realized(x)                           # the model's call signature

Each group's FX subgraph (planner.realize.graph: boundary tensors in, boundary tensors
out, nothing else crosses) runs as its label, one of `planner.fusion.realization.REALIZATIONS`:
the label a Plan records for it (by default), else the realization rule's:
- "inductor": compiled by TorchInductor as one unit (`torch._inductor.standalone_compile`,
  present with the same arguments in torch 2.11 and 2.13), so everything inside may fuse;
- "sdpa" / "concat_gemm": the group's attention pattern or sibling GEMMs rewritten into a
  known fused kernel first (planner.realize.kernels), then compiled like "inductor" when
  anything is left to fuse around it;
- "eager": the aten ops as they are (singletons, views, opaque ops, fallbacks);
- a compiled label with a mode ("inductor+autotune", "concat_gemm+autotune", ...): the
  same rewrite, compiled with the mode's Inductor options (`MODE_OPTIONS`).

Correctness first: a group whose compile fails, or whose outputs are less accurate than
eager's on the same inputs (judged against a higher-precision run of the same ops,
planner.realize.check), falls back to eager with a warning; the realized plan as a whole
is checked the same way, and a whole-plan failure falls back only the groups it is
narrowed to. The model always runs and gives the right answer.

Groups with the same compile key (the same subgraph up to names, inputs of the same
layouts, the same compile options: planner.realize.compilers) are compiled once per
realization and share the compiled callable; a later one reports `reuses`.

Shapes: a program exported with symbolic dims (planner.ir.capture_dynamic) is compiled once
with symbolic shapes and serves every shape in its range. With static shapes on a GPU the
whole plan is captured in one CUDA graph (static input buffers, outputs copied out), so
per-group Python overhead does not eat the gains at small shapes. A plan realized over a
range of shapes records one CUDA graph per shape that recurs (its second call), up to a
bound, and replays it from then on (`_ShapeGraphs`): the runtime's buckets serve streams of
varying lengths, where launching each group from Python would cost more than fusion saves.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

import planner.realize.layout as layout
from planner.errors import PlanError
from planner.fusion.partition import Partition
from planner.fusion.realization import (
    current_labels,
    labels_to_run,
    realization_of,
    substitute_unmet,
)
from planner.ir.capture import Captured
from planner.ir.graph import OpGraph
from planner.plans.plan import Plan
from planner.realize.check import Mismatch, compare_outputs
from planner.realize.compilers import GroupCompiler, SharedCompiles, inductor_compiler
from planner.realize.cudagraphs import RealizeWarning, _GraphReplay, _ShapeGraphs
from planner.realize.derived import DerivedState
from planner.realize.graph import (
    GroupGraph,
    ProgramParts,
    build_top,
    device_of,
    group_graphs,
    group_order,
    plan_outputs,
    take_apart,
    user_input_fakes,
)
from planner.realize.lean import GroupCalls, InputGuard, lean_program
from planner.realize.reference import HighRun, run_in_high_precision
from planner.realize.units import (
    MODE_OPTIONS,
    GroupReport,
    GroupUnit,
    _clone,
    fake_mode_of,
    prepare_unit,
    reference_values,
)

log = logging.getLogger(__name__)

choose_realization = realization_of  # an alias of the rule (planner.fusion.realization)


def _partition_of(graph: OpGraph, plan: Plan | Partition) -> Partition:
    if isinstance(plan, Partition):
        if plan.graph.structure_key != graph.structure_key or len(plan.graph) != len(graph):
            raise PlanError("the partition was made for another model than the captured one")
        return plan if plan.graph is graph else Partition(graph, plan.masks)
    if isinstance(plan, Plan):
        return plan.partition(graph) if plan.graph_key == graph.key else plan.partition_for(graph)
    raise PlanError(f"realize takes a Plan or a Partition, got {type(plan).__name__}")


def _requested(
    graph: OpGraph,
    partition: Partition,
    plan: Plan | Partition,
    realizations: str | Sequence[str] | Mapping[int, str],
) -> list[str]:
    """The realization asked for each group (index into partition.groups)."""
    recorded = None
    if isinstance(plan, Plan):
        recorded = {gp.nodes: gp.realization for gp in plan.groups}
        if realizations == "plan":
            recorded, why = current_labels(graph, partition.groups, recorded, plan.versions)
            if why:
                log.warning(why)
                warnings.warn(why, RealizeWarning, stacklevel=3)
    try:
        return labels_to_run(graph, partition.groups, recorded, realizations)
    except ValueError as e:
        raise PlanError(str(e)) from e


def _honoured(graph: OpGraph, partition: Partition, wanted: list[str]) -> dict[int, str]:
    """`substitute_unmet` on `wanted` (in place), each substitution warned and logged."""
    out = substitute_unmet(graph, partition.groups, wanted)
    for gi, why in out.items():
        log.warning("group %d (%d ops): %s", gi, len(partition.groups[gi]), why)
        warnings.warn(f"group {gi}: {why}", RealizeWarning, stacklevel=3)
    return out


class RealizedPlan:
    """A plan turned into code: call it like the model; it returns what the model returns
    (the captured example call's structure in, the model's output structure out).

    `realizations[g]` is what group g (index into `partition.groups`) actually runs as,
    `fallbacks` maps groups that fell back to eager to the reason, `compile_s` is the
    total compile time. `cuda_graph` says whether calls replay one CUDA graph.
    """

    def __init__(
        self,
        captured: Captured,
        partition: Partition,
        parts: ProgramParts,
        units: list[GroupUnit],
        order: tuple[int, ...],
        device: torch.device,
        out_orders: Mapping[int, Sequence[int]] | None = None,
    ):
        self.captured = captured
        self.partition = partition
        self.device = device
        self._parts = parts
        self._units = units
        self._order = order
        self._impls = GroupCalls([u.run for u in units])
        self._guard = InputGuard(user_input_fakes(parts), captured.program.range_constraints)
        # copies of state (concatenated, padded, channels-last weights) follow their sources
        self._derived = DerivedState.of_units(parts.state, units)
        # the model's compute dtype: the loosest precision any value was rounded to
        self._dtype = next((d for d, _ in self._guard.specs if d.is_floating_point), None)
        self._io = captured.io
        self._out_spec = captured.program.call_spec.out_spec
        n_out = self._out_spec.num_leaves if self._out_spec is not None else -1
        self._flat_out = self._out_spec == pytree.tree_structure(tuple(range(n_out)))
        self._whole_fallback: Callable[..., Any] | None = None
        self._graph: _GraphReplay | None = None
        self._shape_graphs: _ShapeGraphs | None = None
        self.verified: bool | None = None
        self.reference = ""  # what the last verify judged against (planner.realize.check)
        runners = [self._runner(g) for g in range(len(units))]
        self.top = build_top(
            parts,
            [(u.inputs, u.group.outputs) for u in units],
            order,
            runners,
            {k: v for u in units for k, v in u.extra_state.items()},
        )
        self._forward = lean_program(self.top, runners, self._impls)
        # user outputs whose layout a fused kernel changed (beyond padded rows): given
        # eager's order back
        self._out_orders = dict(out_orders or {})
        if self._out_orders:
            top, fix = self._forward, self._out_orders

            def forward(*args: Any) -> tuple[Any, ...]:
                outs = list(top(*args))
                for i, order in fix.items():
                    outs[i] = layout.to_order(outs[i], order)
                return tuple(outs)

            self._forward = forward

    def _runner(self, g: int) -> Callable[..., Any]:
        impls = self._impls

        def run(*args: Any) -> Any:
            return impls[g](*args)

        run.__name__ = run.__qualname__ = f"group_{g}"
        return run

    # ---- reports ---------------------------------------------------------------------
    @property
    def groups(self) -> tuple[GroupReport, ...]:
        return tuple(u.report() for u in self._units)

    @property
    def realizations(self) -> tuple[str, ...]:
        return tuple(u.realization for u in self._units)

    @property
    def modules(self) -> tuple[fx.GraphModule, ...]:
        """The FX module each group runs: its subgraph after its realization's rewrite
        (compiled from it where `groups[g].compiled`); the group's own ops when eager."""
        return tuple(u.group.module if u.is_eager else u.module for u in self._units)

    @property
    def fallbacks(self) -> dict[int, str]:
        return {u.group.index: u.fallback for u in self._units if u.fallback}

    @property
    def compile_s(self) -> float:
        return sum(u.compile_s for u in self._units)

    @property
    def cuda_graph(self) -> bool:
        return self._graph is not None

    @property
    def shape_graphs(self) -> int:
        """CUDA graphs recorded so far for shapes of a dynamic plan (0 when off)."""
        return len(self._shape_graphs.graphs) if self._shape_graphs is not None else 0

    @property
    def static_shapes(self) -> bool:
        return self._guard.static

    @property
    def lean_calls(self) -> bool:
        """Compiled groups that allow it skip their runtime wrappers in inference (on by
        default; planner.realize.lean, `groups[g].lean`)."""
        return all(u.lean_switch[0] for u in self._units)

    @lean_calls.setter
    def lean_calls(self, on: bool) -> None:
        for u in self._units:
            u.lean_switch[0] = bool(on)

    def describe(self) -> str:
        lines = [
            f"RealizedPlan: {len(self._units)} groups on {self.device}, compile "
            f"{self.compile_s:.2f} s, cuda graph {'on' if self.cuda_graph else 'off'}"
        ]
        for r in self.groups:
            what = r.realization + (" (compiled)" if r.compiled else "")
            what += f" (group {r.reuses}'s kernel)" if r.reuses is not None else ""
            fb = f"  <- fell back: {r.fallback}" if r.fallback else ""
            lines.append(f"  group {r.index:3d} {len(r.nodes):3d} ops  {what}{fb}")
        return "\n".join(lines)

    # ---- running ---------------------------------------------------------------------
    def run_flat(self, *args: Any) -> tuple[Any, ...]:
        """The plan on flat user inputs -> flat user outputs (no checks, no CUDA graph);
        inputs the program updates in place get their new values."""
        return self._write_back(args, self._forward(*args))

    def _write_back(self, args: Sequence[Any], flat: Sequence[Any]) -> Sequence[Any]:
        """The user outputs of `flat`, after copying the values after them into the user
        inputs the program updates in place (ProgramParts.mutated)."""
        mutated = self._parts.mutated
        if not mutated:
            return flat
        n = len(flat) - len(mutated)
        for i, value in zip(mutated, flat[n:]):
            args[i].copy_(value)
        return flat[:n]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the plan on a call like the model's; returns what the model returns (its
        output structure, planner.ir.pytrees), built around the plan's flat outputs."""
        if self._io is not None:
            args = self._io.flat_inputs(args, kwargs)
        elif kwargs:
            raise PlanError("the realized plan takes positional tensor inputs only")
        self._guard.check(args)
        self._derived.refresh()
        if self._whole_fallback is not None:
            out = self._whole_fallback(*args)  # the exported program: flat when io is known
            return self._io.rebuild_outputs(out) if self._io is not None else out
        if self._graph is not None:
            flat = self._graph(args)
        elif self._shape_graphs is not None:
            flat = self._shape_graphs(args)
        else:
            flat = self._forward(*args)
        return self._rebuild(self._write_back(args, flat))

    def _rebuild(self, flat: Sequence[Any]) -> Any:
        """The model's output structure around the plan's flat outputs."""
        if self._io is not None:
            return self._io.rebuild_outputs(flat)
        if self._flat_out:  # a tuple of the outputs as they are
            return tuple(flat)
        return pytree.tree_unflatten(list(flat), self._out_spec)

    # ---- fallbacks and checks ----------------------------------------------------------
    def _fall_back(self, g: int, reason: str) -> None:
        unit = self._units[g]
        unit.to_eager(reason)
        self._impls[g] = unit.run
        warnings.warn(
            f"group {g} ({len(unit.group.nodes)} ops, {unit.requested}) runs eagerly: {reason}",
            RealizeWarning,
            stacklevel=3,
        )

    def _compute_dtype(self) -> torch.dtype | None:
        """The model's compute dtype: the coarsest floating dtype of its inputs and state
        (a token-id model has no floating input; its parameters say it is bf16)."""
        found = [d for d, _ in self._guard.specs if d.is_floating_point]
        found += [t.dtype for t in self._parts.state.values() if t.is_floating_point()]
        return max(found, key=lambda d: torch.finfo(d).eps, default=None)

    def _program_args(self, inputs: Sequence[Any]) -> list[Any]:
        """The exported program's placeholders in order: state and the user inputs."""
        user = dict(zip(self._parts.user_inputs, inputs))
        return [
            self._parts.state[n.name] if n.name in self._parts.state else user[n.name]
            for n in self._parts.gm.graph.nodes
            if n.op == "placeholder"
        ]

    def high_reference(self, inputs: Sequence[Any], updates: bool = False) -> HighRun:
        """The user outputs of the exported program run in high precision on `inputs`
        (planner.realize.check.run_in_high_precision); with `updates`, followed by the new
        values of the inputs it updates in place, as the plan's flat outputs are."""
        high = run_in_high_precision(
            self._parts.gm, self._program_args(inputs), self._compute_dtype()
        )
        if high.values is None:
            return high
        order = plan_outputs(self.captured.program.graph_signature.output_specs)
        if not updates:
            order = order[: len(order) - len(self._parts.mutated)]
        return dataclasses.replace(high, values=[high.values[i] for i in order])

    def _free_user_outputs(self) -> set[str]:
        """User outputs that no group reads and whose layout is not fixed up afterwards:
        the caller is the only reader, so a padded layout a kernel writes them in (same
        dimension order, gaps between rows) may be returned as it is instead of copied."""
        read = {name for u in self._units for name in u.inputs}
        fixed = {
            v.name
            for i, v in enumerate(self._parts.outputs)
            if i in self._out_orders and isinstance(v, fx.Node)
        }
        returned = {v.name for v in self._parts.outputs if isinstance(v, fx.Node)}
        return returned - read - fixed

    def check_groups(self, ref: dict[str, Any], bound: dict[Any, int] | None = None) -> None:
        """Each non-eager group on eager's values of its inputs (in the layouts the unit was
        made for) vs eager's values of its outputs, judged against the group's own ops run
        in high precision on those inputs (planner.realize.check); where layouts propagate,
        strides too. A group that fails falls back."""
        bound = bound or {}
        dtype = self._compute_dtype()
        restrided = False
        free = self._free_user_outputs()
        for unit in self._units:
            if unit.is_eager:
                continue
            fakes = unit.group.fakes
            try:
                args = [
                    unit.extra_state[n]
                    if n in unit.extra_state
                    else layout.as_layout(ref.get(n), fakes[i], bound)
                    for i, n in enumerate(unit.inputs)
                ]
                got = list(self._impls[unit.group.index](*args))
                high = run_in_high_precision(
                    unit.group.module, args[: len(unit.group.inputs)], dtype
                )
                want = [ref[n] for n in unit.group.outputs]
                bad = compare_outputs(want, got, dtype, high=high.values)
                if bad is None and unit.out_fakes:
                    moved = {
                        j: strides
                        for j, (o, f) in enumerate(zip(got, unit.out_fakes))
                        if o.numel() > 1
                        and list(o.stride()) != (strides := layout.concrete_layout(f, bound)[1])
                    }
                    padded = [
                        j
                        for j, st in moved.items()
                        if unit.group.outputs[j] in free
                        and layout.padded_of(got[j].shape, got[j].stride(), st)
                    ]
                    for j in padded:  # returned as the kernel wrote it, as torch.compile does
                        del moved[j]
                    if padded:
                        what = ", ".join(f"output {j} {tuple(got[j].stride())}" for j in padded)
                        unit.note = "; ".join(
                            filter(None, [unit.note, f"returned with padded rows: {what}"])
                        )
                    if moved:  # e.g. Inductor padded a GEMM's output rows (its pad_mm pass)
                        restrided = True
                        self._impls[unit.group.index] = layout.in_planned_layout(
                            self._impls[unit.group.index], moved
                        )
                        what = ", ".join(
                            f"output {j} {tuple(got[j].stride())} -> {tuple(st)}"
                            for j, st in moved.items()
                        )
                        unit.note = "; ".join(
                            filter(None, [unit.note, f"copied to the planned layout: {what}"])
                        )
            except Exception as e:  # a kernel that cannot run is a failed realization
                bad = Mismatch(0, f"run: {type(e).__name__}: {str(e)[:200]}")
            if bad is not None:
                self._fall_back(unit.group.index, f"mismatch, group alone: {bad}")
        if restrided:
            self._record_graphs_again()

    def verify(self, inputs: Sequence[Any]) -> Mismatch | None:
        """Check the plan against eager on `inputs` and repair it (planner.realize.check's
        rule, against the program run in high precision): each group alone first, then the
        whole plan; a whole-plan failure is narrowed to the groups responsible
        (`_localize`) and only those fall back. Returns what still disagrees (None when
        the plan is verified). The runtime may call it on real inputs at any time."""
        ref, expected = reference_values(self._parts, inputs)
        high = self.high_reference(inputs, updates=True)
        self.reference = high.describe()
        before = set(self.fallbacks)
        self.check_groups(ref, layout.bindings(user_input_fakes(self._parts), inputs))
        bad = self._compare_whole(expected, inputs, high.values)
        if bad is not None:
            bad = self._localize(expected, inputs, high.values, bad)
        if bad is not None:  # the cut itself is wrong: run the program as exported
            self._whole_fallback = self.captured.program.module()
            warnings.warn(
                f"the realized plan disagrees with eager even with every group eager ({bad}); "
                "running the exported program unchanged. Please report this.",
                RealizeWarning,
                stacklevel=2,
            )
        self.verified = bad is None
        if set(self.fallbacks) != before:
            self._record_graphs_again()
        return bad

    def _compare_whole(
        self, expected: list[Any], inputs: Sequence[Any], high: list[Any] | None = None
    ) -> Mismatch | None:
        try:
            got = list(self._forward(*inputs))
            return compare_outputs(expected, got, self._compute_dtype(), high=high)
        except Exception as e:  # a plan that cannot run is a failed realization too
            return Mismatch(0, f"run: {type(e).__name__}: {str(e)[:200]}")

    def _localize(
        self, expected: list[Any], inputs: Sequence[Any], high: list[Any] | None, bad: Mismatch
    ) -> Mismatch | None:
        """Find the groups a whole-plan mismatch comes from and fall back only those.

        With the non-eager groups in execution order, "prefix k" runs the first k as
        planned and the rest eagerly. Prefix 0 must pass (else the cut is wrong: returned);
        bisection finds the first k whose prefix fails, group k-1 falls back, and the
        search goes on from there until the whole plan passes: O(m log n) plan runs for m
        culprits among n groups, no recompiling (eager runners are swapped in and out).
        """
        live = [g for g in self._order if not self._units[g].is_eager]
        planned = {g: self._impls[g] for g in live}
        eager = {g: self._units[g].eager_runner() for g in live}

        def check(k: int) -> Mismatch | None:
            for i, g in enumerate(live):
                self._impls[g] = planned[g] if i < k else eager[g]
            return self._compare_whole(expected, inputs, high)

        culprits: dict[int, Mismatch] = {}
        try:
            cut = check(0)
            if cut is not None:
                return cut
            lo, hi, why = 0, len(live), bad
            while why is not None:
                while hi - lo > 1:  # prefix lo passes, prefix hi fails with `why`
                    mid = (lo + hi) // 2
                    m = check(mid)
                    lo, hi, why = (mid, hi, why) if m is None else (lo, mid, m)
                if hi == 0:  # fails with every group eager after all
                    return why
                g = live.pop(hi - 1)
                culprits[g], self._impls[g] = why, eager[g]
                hi = len(live)
                why = check(hi)
        finally:
            for g, fn in planned.items():
                self._impls[g] = fn
        n_live = len(planned)
        for g, why in culprits.items():
            self._fall_back(g, f"mismatch, whole plan narrowed to it: {why}")
        if n_live > 1 and len(culprits) == n_live:
            warnings.warn(
                f"all {n_live} compiled groups fell back: the plan runs as eager. Please "
                "report this (a plan that cannot keep any group is a realizer bug).",
                RealizeWarning,
                stacklevel=3,
            )
        return None

    def _record_graphs_again(self) -> None:
        """CUDA graphs recorded before a fallback replay the old kernels: record anew."""
        if self._graph is not None:
            old, self._graph = self._graph, None
            self.capture_cuda_graph(old.static_in, old.copy_outputs)
        if self._shape_graphs is not None:
            s = self._shape_graphs
            self._shape_graphs = self._new_shape_graphs(s.limit, s.max_bytes)

    def _tail_candidates(self) -> tuple[int, ...]:
        """Groups that may run after a CUDA graph's replay instead of inside it: each of
        their outputs is a user output, returned as it is (no layout fix-up), and read by
        no other group. Run outside, they write fresh memory the caller may keep, so their
        outputs need no copy out of the graph's static buffers."""
        free = self._free_user_outputs()
        out = []
        for g, u in enumerate(self._units):
            names = set(u.group.outputs)
            if names and names <= free:
                out.append(g)
        return tuple(out)

    def capture_cuda_graph(self, inputs: Sequence[Any], copy_outputs: bool = True) -> bool:
        """Record the whole plan in one CUDA graph (static shapes); False if it cannot.
        With `copy_outputs`, groups whose outputs are large user outputs that no other group
        reads run after each replay, outside the graph (`_GraphReplay`)."""
        if self.device.type != "cuda" or not self._guard.static or self._whole_fallback:
            return False
        try:
            tail = self._tail_candidates() if copy_outputs else ()
            # outputs whose layout is fixed up get it after the replay: the fix-up's copy
            # is then the copy out of the graph's buffers, not a second one
            self._graph = _GraphReplay(
                self.top.forward if copy_outputs else self._forward,
                tuple(inputs),
                copy_outputs,
                tail=tail,
                impls=self._impls,
                out_orders=self._out_orders if copy_outputs else None,
            )
        except Exception as e:  # capture is an optimization: never fail the plan for it
            warnings.warn(
                f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); "
                "the plan runs without it",
                RealizeWarning,
                stacklevel=2,
            )
            self._graph = None
        return self._graph is not None

    def record_shape_graphs(self, limit: int = 256, max_bytes: int = 2 << 30) -> bool:
        """Dynamic plans on CUDA: a CUDA graph per recurring input shape (see `_ShapeGraphs`)."""
        if self.device.type != "cuda" or self._guard.static or self._whole_fallback:
            return False
        self._shape_graphs = self._new_shape_graphs(limit, max_bytes)
        return True

    def _new_shape_graphs(self, limit: int, max_bytes: int) -> _ShapeGraphs:
        """Per-shape graphs that run large user outputs' groups after each replay (as
        `capture_cuda_graph` does), outside a graph through the plan's lean program."""
        return _ShapeGraphs(
            self._forward,
            limit,
            max_bytes,
            record=self.top.forward,
            tail=self._tail_candidates(),
            impls=self._impls,
            out_orders=self._out_orders,
        )


def _padded_fake(got: Any, eager: Any) -> bool:
    """Whether `got` is `eager`'s layout with padded rows (static sizes only): such an
    output is returned as it is, as torch.compile returns Inductor's padded GEMM outputs."""
    try:
        shape, st, want = (
            tuple(int(d) for d in x) for x in (got.shape, got.stride(), eager.stride())
        )
    except (TypeError, RuntimeError):  # symbolic sizes
        return False
    return layout.padded_of(shape, st, want)


def _symbolic(parts: ProgramParts) -> bool:
    """Whether any user input has a symbolic size (a program realized over a range)."""
    return any(
        not isinstance(d, int) for f in user_input_fakes(parts) for d in getattr(f, "shape", ())
    )


def _mutates(gm: fx.GraphModule) -> bool:
    """Whether the program holds an in-place op (export's programs normally hold none)."""
    for n in gm.graph.nodes:
        if n.op == "call_function":
            name = str(n.target).split(".")
            if len(name) >= 2 and name[-2].endswith("_") and not name[-2].startswith("_"):
                return True
    return False


def _prepare_propagating(
    graph: OpGraph,
    parts: ProgramParts,
    groups: list[GroupGraph],
    order: tuple[int, ...],
    wanted: list[str],
    compile_group: GroupCompiler,
    fake_mode: Any,
    compilers: Mapping[str, GroupCompiler] | None = None,
    shared: SharedCompiles | None = None,
) -> tuple[list[GroupUnit], dict[int, list[int]]]:
    """Prepare the groups in execution order, each traced with the layouts its producers
    hand it (planner.realize.layout). Returns the units and, for user outputs whose
    layout changed, eager's dimension order to give them back."""
    actual: dict[str, Any] = {}
    user_outs = [v.name for v in parts.outputs if isinstance(v, fx.Node)]
    may_drop = not _mutates(parts.gm)
    units: list[GroupUnit | None] = [None] * len(groups)
    for gi in order:
        gg = groups[gi]
        fakes = tuple(actual.get(n, f) for n, f in zip(gg.inputs, gg.fakes))
        module = _clone(gg.module)
        layout.adapt_inputs(module, fakes, gg.fakes, fake_mode)
        if may_drop and wanted[gi] == "eager":  # its outputs are traced again below
            layout.clones_to_contiguous(module, user_outs)
        adapted = dataclasses.replace(gg, module=module, fakes=fakes)
        unit = prepare_unit(
            graph,
            parts,
            adapted,
            wanted[gi],
            compile_group,
            fake_mode,
            RealizeWarning,
            keep_layout=False,
            compilers=compilers,
            shared=shared,
        )
        unit.out_fakes = tuple(unit.predicted_outputs(fake_mode))
        actual.update(zip(gg.outputs, unit.out_fakes))
        units[gi] = unit
    out_orders = {}
    for i, v in enumerate(parts.outputs):
        if isinstance(v, fx.Node) and v.name in actual:
            eager, got = parts.by_name[v.name].meta["val"], actual[v.name]
            if not layout.same_strides(got, eager) and not _padded_fake(got, eager):
                out_orders[i] = layout.stride_order(eager)
    return [u for u in units if u is not None], out_orders


def realize(
    captured: Captured,
    plan_or_partition: Plan | Partition,
    *,
    device: str | torch.device | None = None,
    realizations: str | Sequence[str] | Mapping[int, str] = "plan",
    cuda_graphs: bool | str = "auto",
    verify: bool = True,
    compiler: GroupCompiler | None = None,
    copy_outputs: bool = True,
    inputs: Sequence[Any] | None = None,
    propagate_layouts: bool = True,
    share_compiles: bool | None = None,
    before_run: Callable[[], None] | None = None,
    propagate_symbolic: bool = True,
) -> RealizedPlan:
    """Realize `plan_or_partition` of `captured` (see the module docstring).

    `realizations`: "plan" (the default: a Plan's recorded labels; for a Partition, or a
    group whose label was not recorded, the realization rule's, planner.fusion.realization),
    "auto" (the rule's for every group, whatever the Plan says), one name for every group,
    or one per group (sequence, or {group index: name}; groups left out get the rule's). A
    group that cannot run as asked (a fused-kernel label without its pattern in the group)
    runs as the rule's label instead, with a `RealizeWarning` and a logged reason; its
    report keeps what was asked (`groups[g].requested`) and why (`groups[g].note`).
    `cuda_graphs`: "auto" = on CUDA, one graph for static shapes, else one per recurring
    shape (outputs must then be copied out: `copy_outputs`). `verify` checks against eager on
    `inputs` (default: the capture's example inputs). `compiler` replaces Inductor (tests
    inject failures with it). `propagate_layouts`: groups hand on the layouts their kernels
    compute (planner.realize.layout; static shapes unless `propagate_symbolic`); False
    copies every boundary value back to eager's layout (also the fallback when propagation
    cannot be done). `propagate_symbolic`: a program with symbolic sizes (realized over a
    range) propagates layouts too (False: eager's layouts at its boundaries).
    A Plan that records a tensor-parallel decision (`Plan.tensor_parallel`) is realized as
    planner.distributed.tp_realize.realize_tp does it instead: the decision applied to the
    rank program, verified against it on every rank, its other ops eager.
    `share_compiles`: groups with the same compile key (planner.realize.compilers) are
    compiled once and share the callable; None = on for Inductor, off for a `compiler`
    given (which may tell groups apart by node names, as the tests' fault injectors do).
    `before_run` is called once the plan is compiled, before anything runs it (its check,
    CUDA graphs), and what it raises is raised: there the ranks of a program with
    collectives agree that every rank compiled it (profiling.runner).
    """
    if isinstance(plan_or_partition, Plan) and plan_or_partition.tensor_parallel is not None:
        # a rank program's recorded TP decision: the rewritten program, verified on the ranks
        from planner.distributed.tp_realize import realize_tp

        tp = realize_tp(captured, plan_or_partition, inputs=inputs, verify=verify)
        return tp  # type: ignore[return-value]
    graph = captured.graph
    partition = _partition_of(graph, plan_or_partition)
    asked = _requested(graph, partition, plan_or_partition, realizations)
    wanted = list(asked)
    substituted = _honoured(graph, partition, wanted)
    copies = plan_or_partition.copies() if isinstance(plan_or_partition, Plan) else ()
    parts = take_apart(captured, partition, copies)
    dev = device_of(parts, captured, device)
    groups: list[GroupGraph] = group_graphs(parts, partition)
    for gg in groups:  # every op recomputed where needed: nothing to compile, never called
        if not gg.outputs:
            wanted[gg.index] = "eager"
    order = group_order(parts, groups)
    compile_group = compiler or inductor_compiler()
    # an injected compiler (tests) compiles every mode; else Inductor with the mode's options
    compilers = {m: compiler or inductor_compiler(o) for m, o in MODE_OPTIONS.items()}
    share = compiler is None if share_compiles is None else share_compiles
    shared = SharedCompiles() if share else None
    t0 = time.perf_counter()
    fake_mode = fake_mode_of(parts)
    out_orders: dict[int, list[int]] = {}
    units: list[GroupUnit] | None = None
    # Symbolic programs propagate layouts unless told not to (docs/runtime.md).
    if propagate_layouts and (propagate_symbolic or not _symbolic(parts)):
        try:
            units, out_orders = _prepare_propagating(
                graph, parts, groups, order, wanted, compile_group, fake_mode, compilers, shared
            )
        except PlanError as e:
            warnings.warn(
                f"layouts cannot propagate through this plan ({e}); boundary values keep "
                "eager's layout",
                RealizeWarning,
                stacklevel=2,
            )
    if units is None:
        args = (compile_group, fake_mode, RealizeWarning)
        units = [
            prepare_unit(
                graph, parts, gg, wanted[gg.index], *args, compilers=compilers, shared=shared
            )
            for gg in groups
        ]
    for gi, why in substituted.items():
        units[gi].requested = asked[gi]
        units[gi].note = "; ".join(filter(None, [why, units[gi].note]))
    log.info(
        "realized %d groups in %.2f s (%d compiled, %d of them sharing another's kernel)",
        len(units),
        time.perf_counter() - t0,
        sum(u.compiled for u in units),
        sum(u.reuses is not None for u in units),
    )
    realized = RealizedPlan(captured, partition, parts, units, order, dev, out_orders)
    example = tuple(inputs) if inputs is not None else tuple(captured.example_inputs)
    if before_run is not None:
        before_run()
    if verify:
        realized.verify(example)
    if cuda_graphs is True or (cuda_graphs == "auto" and dev.type == "cuda"):
        if realized.static_shapes:
            realized.capture_cuda_graph(example, copy_outputs)
        elif copy_outputs:
            realized.record_shape_graphs()
    return realized
