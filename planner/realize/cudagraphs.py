"""CUDA graphs of a realized plan: one graph of a static plan (`_GraphReplay`), or one per
recurring input shape of a plan realized over a shape range (`_ShapeGraphs`).

planner.realize.realizer records and replays them; outputs the caller receives are never
overwritten by a later replay (copied out, or computed after the replay).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import planner.realize.layout as layout


class RealizeWarning(UserWarning):
    """A group fell back to eager, or CUDA-graph capture was skipped."""


class _GraphReplay:
    """One CUDA graph of the whole plan: inputs copied into static buffers, replay,
    outputs copied out (so the next call cannot overwrite what the caller holds).

    `out_orders`: output index -> the dimension order the caller gets it in, for outputs
    whose kernels lay them out otherwise; `fn` then returns them as computed, and each call
    lays them out after the replay (that copy doubles as the copy out of the graph).

    `tail`: groups (indices into `impls`, the plan's per-group callables) whose outputs are
    only returned to the caller. Where their outputs hold at least `TAIL_MIN_BYTES`, the
    graph records everything but them, remembering the static buffers they read; each
    call replays the graph, then runs them on those buffers, so their outputs are fresh
    tensors and need no copy (an LM head's logits can be most of a language model's output
    bytes). The static buffers are read right after the replay, on the same stream, before
    any later replay can overwrite them. Running a group outside the graph costs host time
    on every call, copying its output out costs device time: a call with small outputs is
    bound by its host time, one with large outputs by the device, and `TAIL_MIN_BYTES`
    is where the measured trade-off turns (docs/runtime.md, "Handing outputs back").

    The other outputs are handed back as `_Handout` works out once after recording.
    """

    TAIL_MIN_BYTES = 32 << 20

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: tuple[Any, ...],
        copy_outputs: bool,
        *,
        warmup: int = 3,
        pool: Any = None,
        tail: Sequence[int] = (),
        impls: list[Callable[..., Any]] | None = None,
        out_orders: Mapping[int, Sequence[int]] | None = None,
    ):
        self.out_orders = dict(out_orders or {})
        self.static_in = tuple(
            t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs
        )
        metas: dict[int, tuple[bool, list[tuple[Any, ...]]]] = {}  # group -> its outputs
        originals = {g: impls[g] for g in tail} if impls is not None and copy_outputs else {}

        def measuring(g: int, impl: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any) -> Any:
                outs = impl(*args)
                flat = _flat_tensors(outs)
                if all(isinstance(t, torch.Tensor) for t in flat):
                    metas[g] = (
                        isinstance(outs, (tuple, list)),
                        [(t.shape, t.stride(), t.dtype, t.device, t.nbytes) for t in flat],
                    )
                return outs

            return run

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(warmup):  # lazy kernel compiles, autotuning, library workspaces
                if i == warmup - 1:
                    for g, impl in originals.items():
                        impls[g] = measuring(g, impl)  # type: ignore[index]
                try:
                    fn(*self.static_in)
                finally:
                    for g, impl in originals.items():
                        impls[g] = impl  # type: ignore[index]
        torch.cuda.current_stream().wait_stream(stream)
        big = {
            g: impl
            for g, impl in originals.items()
            if g in metas and sum(m[4] for m in metas[g][1]) >= self.TAIL_MIN_BYTES
        }
        self.tail_impls: dict[int, Callable[..., Any]] = {}
        self.tail_args: dict[int, tuple[Any, ...]] = {}
        for attempt in (big, {}):  # without a tail if a deferred output is not returned as is
            self.tail_impls, self.tail_args = dict(attempt), {}
            placeholders: dict[int, tuple[int, int]] = {}
            self.graph = torch.cuda.CUDAGraph()
            for g in self.tail_impls:
                impls[g] = self._deferred(g, metas[g], placeholders)  # type: ignore[index]
            try:
                with torch.cuda.graph(self.graph, pool=pool):
                    self.static_out = fn(*self.static_in)
            finally:
                for g, impl in originals.items():
                    impls[g] = impl  # type: ignore[index]
            self.from_tail = tuple(placeholders.get(id(o)) for o in self.static_out)
            if set(placeholders.values()) <= set(self.from_tail):
                break
        # a deferred output's stand-in is never written or read: its memory goes back to
        # the pool, and the graph's size (what `_ShapeGraphs` budgets) leaves it out
        self.static_out = tuple(
            None if t is not None else o for o, t in zip(self.static_out, self.from_tail)
        )
        self.copy_outputs = copy_outputs
        self.handout = _Handout(self.static_out, self.from_tail, self.out_orders)
        self.nbytes = sum(
            t.nbytes for t in (*self.static_in, *self.static_out) if isinstance(t, torch.Tensor)
        )

    def _deferred(
        self,
        g: int,
        meta: tuple[bool, list[tuple[Any, ...]]],
        placeholders: dict[int, tuple[int, int]],
    ) -> Callable[..., Any]:
        """Group g's stand-in while the graph records: remembers the buffers it reads and
        returns empty tensors shaped like its outputs (no kernel is recorded for it);
        `placeholders` maps each one's id to (g, its output index)."""

        def run(*args: Any) -> Any:
            self.tail_args[g] = args
            outs = []
            for j, (shape, stride, dtype, device, _) in enumerate(meta[1]):
                t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
                placeholders[id(t)] = (g, j)
                outs.append(t)
            return tuple(outs) if meta[0] else outs[0]

        return run

    def __call__(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        for dst, src in zip(self.static_in, args):
            if isinstance(dst, torch.Tensor) and dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        if not self.copy_outputs:
            return self.static_out
        fresh = {g: _flat_tensors(impl(*self.tail_args[g])) for g, impl in self.tail_impls.items()}
        return self.handout(self.static_out, fresh)


class _Handout:
    """Hands a graph's outputs back as fresh tensors, the way worked out once from its
    static outputs after recording (the host time of each call is what matters here):

    - an output a deferred group computes (`from_tail[i]` = (group, output index)) is
      taken from that group's fresh outputs;
    - an output the plan owes the caller in another dimension order (`out_orders`) is
      laid out in it, which copies it;
    - contiguous outputs of one shape, dtype and device (a KV cache's keys and values)
      are copied in one `torch.stack` and split with `unbind`: two calls instead of an
      allocation per output. They share one storage (keeping one keeps the group's memory)
      and are detached, so the caller may modify each in place, in grad mode too;
    - the remaining tensors are allocated in their own layouts and copied with one
      `_foreach_copy_`; anything else is returned as it is.
    """

    def __init__(
        self,
        static_out: Sequence[Any],
        from_tail: Sequence[tuple[int, int] | None],
        out_orders: Mapping[int, Sequence[int]],
    ):
        self.kept = [
            o if not isinstance(o, torch.Tensor) and t is None else None
            for o, t in zip(static_out, from_tail)
        ]
        self.tail = [(i, t[0], t[1]) for i, t in enumerate(from_tail) if t is not None]
        self.reorder: list[tuple[int, Sequence[int]]] = []
        clones: list[int] = []
        for i, (o, t) in enumerate(zip(static_out, from_tail)):
            if t is not None or not isinstance(o, torch.Tensor):
                continue
            order = out_orders.get(i)
            if order is not None and layout.to_order(o, order).data_ptr() != o.data_ptr():
                self.reorder.append((i, order))
            else:
                clones.append(i)
        alike: dict[tuple[Any, ...], list[int]] = {}
        for i in clones:
            o = static_out[i]
            if o.is_contiguous() and o.numel() > 0:
                alike.setdefault((tuple(o.shape), o.dtype, o.device), []).append(i)
        self.stacks = [(ix, [static_out[i] for i in ix]) for ix in alike.values() if len(ix) > 1]
        stacked = {i for ix, _ in self.stacks for i in ix}
        self.singles = [i for i in clones if i not in stacked]
        self.single_src = [static_out[i] for i in self.singles]

    def __call__(
        self, static_out: Sequence[Any], fresh: Mapping[int, list[Any]]
    ) -> tuple[Any, ...]:
        out = list(self.kept)
        for i, g, j in self.tail:
            out[i] = fresh[g][j]
        for i, order in self.reorder:
            out[i] = layout.to_order(static_out[i], order)
        for ix, src in self.stacks:
            for i, t in zip(ix, torch.stack(src).unbind(0)):
                out[i] = t.detach()
        if self.singles:
            dst = [torch.empty_like(t) for t in self.single_src]
            torch._foreach_copy_(dst, self.single_src)
            for i, t in zip(self.singles, dst):
                out[i] = t
        return tuple(out)


def _flat_tensors(outs: Any) -> list[Any]:
    """A group's outputs as a list (a group returns a tuple, or one value)."""
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


class _ShapeGraphs:
    """One CUDA graph per recurring input shape of a plan realized over a shape range.

    `fn` runs a shape without a graph; `record`, when given, is what a graph records
    (the plan's program calling its groups through `impls`), so that large user outputs
    can be computed after each replay rather than copied (`_GraphReplay`'s `tail`).

    A shape's first call runs the plan as it is (a shape seen once may never come back);
    its second call records a graph (after one warm-up run on a side stream) and every
    later call replays it. At most `limit` graphs, holding at most `max_bytes` of static
    inputs and outputs, are kept, the least recently used evicted (an evicted shape must
    recur twice again to be recorded again); a shape whose capture fails runs without a
    graph from then on, with a warning.

    All graphs of the plan share one memory pool, which is safe here: calls are serialized
    (a lock), each graph's static inputs and outputs stay referenced, so no other capture
    is handed their memory, and outputs are copied out right after each replay, so the
    scratch memory two graphs share is never read across replays.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        limit: int,
        max_bytes: int,
        *,
        record: Callable[..., Any] | None = None,
        tail: Sequence[int] = (),
        impls: list[Callable[..., Any]] | None = None,
        out_orders: Mapping[int, Sequence[int]] | None = None,
    ):
        self.fn, self.limit, self.max_bytes = fn, limit, max_bytes
        # what each graph records, and the groups it may run after the replay
        # (`_GraphReplay`'s `tail`, `impls`, `out_orders`)
        self.record = record or fn
        self.replay_kw: dict[str, Any] = (
            {"tail": tuple(tail), "impls": impls, "out_orders": out_orders}
            if record is not None
            else {}
        )
        self.graphs: OrderedDict[tuple[Any, ...], _GraphReplay] = OrderedDict()
        self.bytes = 0
        self.seen: set[tuple[Any, ...]] = set()
        self.failed: set[tuple[Any, ...]] = set()
        self.pool: Any = None
        self.lock = threading.Lock()

    def __call__(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        with self.lock:
            g = self.graphs.get(key)
            if g is not None:
                self.graphs.move_to_end(key)
                return g(args)
            if key in self.failed or key not in self.seen:
                if len(self.seen) >= 16 * self.limit:
                    self.seen.clear()
                self.seen.add(key)
                return self.fn(*args)
            try:
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                g = _GraphReplay(
                    self.record, args, True, warmup=1, pool=self.pool, **self.replay_kw
                )
            except Exception as e:  # an optimization: never fail the call for it
                self.failed.add(key)
                warnings.warn(
                    f"CUDA graph capture failed for input shapes {key} "
                    f"({type(e).__name__}: {str(e)[:200]}); they run without one",
                    RealizeWarning,
                    stacklevel=3,
                )
                return self.fn(*args)
            self.graphs[key] = g
            self.bytes += g.nbytes
            while len(self.graphs) > 1 and (
                len(self.graphs) > self.limit or self.bytes > self.max_bytes
            ):
                old_key, old = self.graphs.popitem(last=False)
                self.bytes -= old.nbytes
                self.seen.discard(old_key)
            return g(args)
