"""The tensor-parallel decisions of `tp_plan` (chunked row-parallel GEMM, fused epilogue)
on any captured program: where they apply, what they cost, and the rewritten program.

A **site** is Megatron's column -> row pair as a captured program shows it (from the zoo's
functional-collective models or from DTensor's `ColwiseParallel`/`RowwiseParallel`, see
planner.ir.capture_dtensor): a GEMM with a weight (`mm`, `addmm` or `linear`) whose
output, through reshapes only, is all-reduced with a sum and read by nothing else (the
row-parallel GEMM and its partial sums), reached from at least one other weight GEMM
without crossing a collective (the column-parallel GEMMs, through the attention or the
activation between them). Its **epilogue** is what follows the all-reduce's `wait_tensor`
up to the next GEMM or collective: the pointwise, reduction and norm ops that depend on
the reduced sum (residual add, bias, RMSNorm or LayerNorm), taken only while the set stays
convex (an op that also needs a value computed after the all-reduce outside the set is
left out).

A decision is a `TPDecision` for every site of the program, or `SiteDecisions`, one
`TPDecision` per site (sites differ in size: an attention's output projection and an
MLP's down projection). `tp_program` realizes it on the
program's `GraphModule` (`ExportedProgram.module()`): each site's GEMM + reshapes +
all-reduce + wait become one call of `row_parallel_chunks` (the GEMM over `chunks` token
slices into one buffer, each slice all-reduced with `async_op=True` as soon as its GEMM is
issued, all waited before the reshapes), and with `fuse_epilogue` the epilogue's ops are
moved into one submodule (compiled by Inductor when `compile_epilogue`). `graph_tasks` lays
the rewritten program out on the host, compute and communication streams as
`tp_plan.block_tasks` does for the zoo block, from per-site costs (`GraphCosts`, filled by
search/tp_search.py).

**Backward.** Training a site (the unplanned program's DTensor or Megatron autograd, and
`tp_plan.PlannedTPBlock`'s) communicates only for the column GEMMs: their weights hold
a shard of the output features, so each rank's gradient of their replicated input is a
partial sum, all-reduced. The row-parallel GEMM's output is the same on every rank, so
its gradient passes the forward all-reduce unchanged: dX = g W and dW = g^T X need no
collective. Megatron's f (`parallel_models.copy_to_tp`) all-reduces once per distinct
input tensor (Q/K/V share one); DTensor's `ColwiseParallel` converts each column GEMM's
input separately and so all-reduces once per column GEMM (`TPSite.column_grad_bytes`).
`backward_tasks` prices the unplanned program's backward as the autograd engine runs it,
one chain in reverse order whose input-gradient all-reduces the next step waits for,
the other kernels at `dp.BACKWARD_FACTOR` times their forward. `tp_program(...,
backward=True)` rewrites the program for training (planner.distributed.tp_autograd): each
column GEMM all-reduces its own input's gradient in the site's chunks, each slice issued
as soon as its dX slice is computed, overlapping the next slices and dW
(`backward_tasks(..., planned=decision)` prices that).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from planner.distributed.dp import BACKWARD_FACTOR
from planner.distributed.overlap import COMM, COMPUTE, Task, schedule
from planner.distributed.tp_autograd import (
    GEMM_OPERANDS,
    column_parallel_gemm,
    row_parallel_chunks,
)
from planner.distributed.tp_plan import HOST, Prediction, TPDecision
from planner.errors import ModelSpecError
from planner.ir import taxonomy
from planner.ir.graph import Category

# reshapes that keep the token-major layout of a GEMM's output (last dimension unchanged)
RESHAPES = ("view", "_unsafe_view", "reshape")
# ops a weight is read through before a GEMM (the transpose of `x @ W.t()`, a reshape)
WEIGHT_PATH = ("t", "view", "_unsafe_view", "reshape", "permute", "transpose", "div")
# what an epilogue may hold: the memory-bound ops fused after the collective
EPILOGUE_CATEGORIES = (
    Category.POINTWISE,
    Category.BROADCAST,
    Category.REDUCTION,
    Category.NORM,
    Category.VIEW,
    Category.COPY,
)


def _op(node: fx.Node) -> str:
    return taxonomy.packet_of(str(node.target)) if node.op == "call_function" else ""


def _category(node: fx.Node) -> Category | None:
    rule = taxonomy.lookup(str(node.target)) if node.op == "call_function" else None
    return rule.category if rule is not None else None


def _is_weight(node: fx.Node) -> bool:
    """Whether `node` is a parameter (or a constant input) read through `WEIGHT_PATH`."""
    while node.op == "call_function" and _op(node) in WEIGHT_PATH:
        node = node.args[0]  # type: ignore[assignment]
    return node.op in ("get_attr", "placeholder")


def _is_weight_gemm(node: fx.Node) -> bool:
    op = _op(node)
    return op in GEMM_OPERANDS and _is_weight(node.args[GEMM_OPERANDS[op][1]])  # type: ignore[arg-type]


@dataclass(frozen=True)
class TPSite:
    """One column -> row pair ending in an all-reduce (node names of the program)."""

    gemm: str  # the row-parallel GEMM
    kind: str  # its op: mm, addmm or linear
    reshapes: tuple[str, ...]  # between the GEMM and the all-reduce
    all_reduce: str
    wait: str
    column: tuple[str, ...]  # the column-parallel GEMMs that feed it
    epilogue: tuple[str, ...]  # in program order
    rows: int  # tokens: the GEMM's output rows
    nbytes: int  # the partial sum all-reduced
    group_name: str
    # per column GEMM: (the tensor its activation is a reshape of, that activation's bytes)
    column_inputs: tuple[tuple[str, int], ...] = ()

    def column_grad_bytes(self, per_gemm: bool) -> tuple[int, ...]:
        """The input-gradient all-reduces the site's backward issues (module docstring,
        "Backward"): one per column GEMM (`per_gemm`, DTensor's `ColwiseParallel`) or one
        per distinct input tensor (Megatron's f, `parallel_models.copy_to_tp`)."""
        if per_gemm:
            return tuple(b for _, b in self.column_inputs)
        return tuple(dict(self.column_inputs).values())


def _nbytes(node: fx.Node) -> int:
    v = node.meta.get("val")
    return int(v.numel() * v.element_size()) if isinstance(v, torch.Tensor) else 0


def _column_gemms(start: fx.Node) -> tuple[str, ...]:
    """Weight GEMMs reached backwards from `start` without crossing a collective."""
    found: list[str] = []
    seen: set[fx.Node] = set()
    stack = [start]
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        if _category(n) is Category.COLLECTIVE:
            continue
        if _is_weight_gemm(n):
            found.append(n.name)
            continue
        stack += [a for a in n.all_input_nodes]
    return tuple(sorted(found))


def _column_input(node: fx.Node) -> tuple[str, int]:
    """The tensor a GEMM's activation is a reshape of, and the activation's bytes."""
    act = node.args[GEMM_OPERANDS[_op(node)][0]]
    if not isinstance(act, fx.Node):
        return ("", 0)
    base = act
    while base.op == "call_function" and _op(base) in RESHAPES:
        base = base.args[0]  # type: ignore[assignment]
    return (base.name, _nbytes(act))


def _epilogue(wait: fx.Node, order: dict[fx.Node, int]) -> tuple[str, ...]:
    """The convex set of memory-bound ops after `wait` (module docstring)."""
    downstream: set[fx.Node] = {wait}
    members: set[fx.Node] = set()
    for n in sorted(order, key=order.__getitem__):
        if order[n] <= order[wait] or not any(a in downstream for a in n.all_input_nodes):
            continue
        downstream.add(n)
        inside = {wait} | members
        convex = all(a in inside or a not in downstream for a in n.all_input_nodes)
        if convex and n.op == "call_function" and _category(n) in EPILOGUE_CATEGORIES:
            members.add(n)
    # reshapes at the edge (read only by the next GEMM) are not the epilogue's work
    changed = True
    while changed:
        changed = False
        for n in list(members):
            if _category(n) is Category.VIEW and not any(u in members for u in n.users):
                members.discard(n)
                changed = True
    return tuple(n.name for n in sorted(members, key=order.__getitem__))


def _site_at(ar: fx.Node, order: dict[fx.Node, int]) -> TPSite | None:
    if len(ar.args) < 3 or ar.args[1] != "sum":
        return None
    waits = [u for u in ar.users if _op(u) == "wait_tensor"]
    if len(ar.users) != 1 or len(waits) != 1:
        return None
    reshapes: list[str] = []
    n = ar.args[0]
    while isinstance(n, fx.Node) and _op(n) in RESHAPES and len(n.users) == 1:
        reshapes.append(n.name)
        n = n.args[0]
    if not isinstance(n, fx.Node) or not _is_weight_gemm(n) or len(n.users) != 1:
        return None
    kind = _op(n)
    act = n.args[GEMM_OPERANDS[kind][0]]
    column = _column_gemms(act) if isinstance(act, fx.Node) else ()
    val = n.meta.get("val")
    if not column or not isinstance(val, torch.Tensor):
        return None
    rows = int(val.numel() // val.shape[-1])
    by_name = {m.name: m for m in order}
    return TPSite(
        n.name,
        kind,
        tuple(reversed(reshapes)),
        ar.name,
        waits[0].name,
        column,
        _epilogue(waits[0], order),
        rows,
        _nbytes(ar.args[0]),  # type: ignore[arg-type]
        str(ar.args[2]),
        tuple(_column_input(by_name[c]) for c in column),
    )


def find_tp_sites(gm: fx.GraphModule) -> list[TPSite]:
    """The program's column -> row sites, in program order (module docstring)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    sites = []
    for n in gm.graph.nodes:
        if _op(n) == "all_reduce" and (site := _site_at(n, order)) is not None:
            sites.append(site)
    return sites


@dataclass(frozen=True)
class SiteDecisions:
    """One decision per site, in program order (site i: `per_site[i]`)."""

    per_site: tuple[TPDecision, ...]

    @property
    def label(self) -> str:
        """As `TPDecision.label` where every site has the same decision, else each site's
        in order ("k=2 fused | k=1"; planner.plans.plan.TPChoice.label alike)."""
        if len(set(self.per_site)) == 1:
            return self.per_site[0].label
        return " | ".join(d.label for d in self.per_site)

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(d.chunks for d in self.per_site)

    @property
    def fuse_epilogue(self) -> tuple[bool, ...]:
        return tuple(d.fuse_epilogue for d in self.per_site)


Decision = TPDecision | SiteDecisions


def per_site(decision: Decision, n_sites: int) -> tuple[TPDecision, ...]:
    """Each of `n_sites` sites' decision: a `TPDecision` is every site's."""
    if isinstance(decision, TPDecision):
        return (decision,) * n_sites
    if len(decision.per_site) != n_sites:
        raise ModelSpecError(
            f"{len(decision.per_site)} per-site decisions for {n_sites} sites: give one per site"
        )
    return decision.per_site


def graph_decisions(
    sites: list[TPSite], chunk_choices: tuple[int, ...] = (1, 2, 4)
) -> list[TPDecision]:
    """Every decision for all sites alike whose chunks split every site's rows evenly."""
    ks = [k for k in chunk_choices if all(s.rows % k == 0 for s in sites)]
    return [TPDecision(k, fuse) for k in ks for fuse in (False, True)]


# ---- pricing ------------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnBackward:
    """One column-parallel GEMM's backward in the program rewritten for training
    (`tp_program(..., backward=True)`): one of k slices of dX (`dx_s[k]`), dW (`dw_s`),
    the bytes of its input's gradient (all-reduced), its forward's seconds (part of its
    site's segment)."""

    dx_s: dict[int, float]
    dw_s: float
    grad_bytes: int
    forward_s: float


@dataclass(frozen=True)
class GraphCosts:
    """GPU seconds of a program's parts at one shape, and the host's issue seconds.

    `segment_s[i]`, `segment_ops[i]`: the program's other kernels run before site i's GEMM
    (the last entry: after the last site), each as its own kernel; `gemm_s[(i, k)]`: one of
    k slices of site i's GEMM; `epilogue_s[(i, fused)]`; `epilogue_ops[i]`: its kernels when
    not fused; `all_reduce_bytes[i]`: site i's whole partial sum."""

    segment_s: tuple[float, ...]
    segment_ops: tuple[int, ...]
    gemm_s: dict[tuple[int, int], float]
    epilogue_s: dict[tuple[int, bool], float]
    epilogue_ops: tuple[int, ...]
    all_reduce_bytes: tuple[int, ...]
    eager_op_host_s: float
    compiled_call_host_s: float
    collective_call_host_s: float
    # the backward: site i's dX + dW GEMMs (unchunked), its input-gradient all-reduces
    backward_gemm_s: tuple[float, ...] = ()
    column_grad_bytes: tuple[tuple[int, ...], ...] = ()
    # per site, its column GEMMs' backward in the program rewritten for training
    column_backward: tuple[tuple[ColumnBackward, ...], ...] = ()


def graph_tasks(
    c: GraphCosts,
    decision: Decision,
    all_reduce_s: Callable[[int], float],
    collectives: bool = True,
) -> list[Task]:
    """The rewritten program as host / compute / communication tasks; without
    `collectives` the all-reduces are left out (T_comp)."""
    tasks: list[Task] = []
    ds = per_site(decision, len(c.all_reduce_bytes))

    def add(name: str, stream: str, dur: float, deps: tuple[int, ...], host_s: float) -> int:
        tasks.append(Task(f"issue {name}", HOST, host_s))
        tasks.append(Task(name, stream, dur, (*deps, len(tasks) - 1)))
        return len(tasks) - 1

    prev: tuple[int, ...] = ()
    for i in range(len(c.all_reduce_bytes)):
        if c.segment_ops[i]:
            seg = c.segment_ops[i] * c.eager_op_host_s
            prev = (add(f"ops before {i}", COMPUTE, c.segment_s[i], prev, seg),)
        ars: list[int] = []
        d = ds[i]
        for j in range(d.chunks):
            g = add(f"gemm {i}[{j}]", COMPUTE, c.gemm_s[(i, d.chunks)], prev, c.eager_op_host_s)
            if collectives:
                t = all_reduce_s(c.all_reduce_bytes[i] // d.chunks)
                ars.append(add(f"all_reduce {i}[{j}]", COMM, t, (g,), c.collective_call_host_s))
            prev = (g,)
        host = c.compiled_call_host_s if d.fuse_epilogue else c.epilogue_ops[i] * c.eager_op_host_s
        if c.epilogue_ops[i]:
            dur = c.epilogue_s[(i, d.fuse_epilogue)]
            prev = (add(f"epilogue {i}", COMPUTE, dur, (*prev, *ars), host),)
        elif ars:  # nothing after the reduction: the program ends when it arrives
            prev = (*prev, *ars)
    if c.segment_ops[-1]:
        tail = c.segment_ops[-1] * c.eager_op_host_s
        add("ops after", COMPUTE, c.segment_s[-1], prev, tail)
    return tasks


def backward_tasks(
    c: GraphCosts,
    all_reduce_s: Callable[[int], float],
    collectives: bool = True,
    planned: Decision | None = None,
) -> list[Task]:
    """The program's backward as tasks (module docstring, "Backward"), in reverse program
    order: the kernels after the last site, then per site the epilogue's backward, the
    row-parallel GEMM's dX and dW (no collective), the kernels before the site (its
    column GEMMs among them) and the all-reduces of the column GEMMs' input gradients,
    which the next task waits for. Without `collectives` those are left out.

    `planned`: the backward of the program `tp_program(..., planned, backward=True)`
    rewrites for training instead: per site, the kernels before it other than its column
    GEMMs, then each column GEMM (last first) as its dX in the site's chunks, each slice's
    all-reduce issued after it (overlapping the next slice and dW), then its dW; the next
    site's backward waits for the all-reduces."""
    if len(c.backward_gemm_s) != len(c.all_reduce_bytes):
        raise ModelSpecError("these costs have no backward: price them with graph_costs")
    if planned is not None and len(c.column_backward) != len(c.all_reduce_bytes):
        raise ModelSpecError("these costs have no column backward: price them with graph_costs")
    ds = per_site(planned, len(c.all_reduce_bytes)) if planned is not None else ()
    tasks: list[Task] = []

    def add(name: str, stream: str, dur: float, deps: tuple[int, ...], host_s: float) -> int:
        tasks.append(Task(f"issue {name}", HOST, host_s))
        tasks.append(Task(name, stream, dur, (*deps, len(tasks) - 1)))
        return len(tasks) - 1

    f, host = BACKWARD_FACTOR, c.eager_op_host_s
    prev: tuple[int, ...] = ()
    if c.segment_ops[-1]:
        prev = (add("ops after (bwd)", COMPUTE, f * c.segment_s[-1], prev,
                    f * c.segment_ops[-1] * host),)  # fmt: skip
    for i in reversed(range(len(c.all_reduce_bytes))):
        if c.epilogue_ops[i]:
            dur, ops = f * c.epilogue_s[(i, False)], f * c.epilogue_ops[i]
            prev = (add(f"epilogue {i} (bwd)", COMPUTE, dur, prev, ops * host),)
        prev = (add(f"gemm {i} dX dW", COMPUTE, c.backward_gemm_s[i], prev, 2 * host),)
        if ds:
            prev = _planned_column_backward(
                c, i, ds[i].chunks, prev, add, collectives, all_reduce_s
            )
            continue
        if c.segment_ops[i]:
            dur, ops = f * c.segment_s[i], f * c.segment_ops[i]
            prev = (add(f"ops before {i} (bwd)", COMPUTE, dur, prev, ops * host),)
        if collectives:
            ars = [
                add(
                    f"all_reduce d input {i}[{j}]",
                    COMM,
                    all_reduce_s(b),
                    prev,
                    c.collective_call_host_s,
                )
                for j, b in enumerate(c.column_grad_bytes[i])
            ]
            prev = (*prev, *ars)
    return tasks


def _planned_column_backward(
    c: GraphCosts,
    i: int,
    chunks: int,
    prev: tuple[int, ...],
    add: Callable[..., int],
    collectives: bool,
    all_reduce_s: Callable[[int], float],
) -> tuple[int, ...]:
    """Site i's kernels before it and its column GEMMs' chunked backward (backward_tasks)."""
    f, host = BACKWARD_FACTOR, c.eager_op_host_s
    cols = c.column_backward[i]
    rest_s = max(0.0, c.segment_s[i] - sum(col.forward_s for col in cols))
    rest_ops = max(0, c.segment_ops[i] - len(cols))
    if rest_ops:
        prev = (add(f"ops before {i} (bwd)", COMPUTE, f * rest_s, prev, f * rest_ops * host),)
    ars: list[int] = []
    for j, col in reversed(list(enumerate(cols))):
        k = chunks if chunks in col.dx_s else 1
        for m in range(k):
            dx = add(f"column {i}.{j} dX[{m}]", COMPUTE, col.dx_s[k], prev, host)
            if collectives:
                t = all_reduce_s(col.grad_bytes // k)
                ars.append(add(f"all_reduce d input {i}.{j}[{m}]", COMM, t, (dx,),
                               c.collective_call_host_s))  # fmt: skip
            prev = (dx,)
        prev = (add(f"column {i}.{j} dW", COMPUTE, col.dw_s, prev, host),)
    return (*prev, *ars)


def predict_backward(
    c: GraphCosts, d: Decision, all_reduce_s: Callable[[int], float], planned: bool = False
) -> Prediction:
    """The backward's prediction: the unplanned program's (the same for every decision;
    `d` names the forward decision it goes with), or with `planned` the backward of the
    program rewritten for training with `d` (its column GEMMs' input gradients chunked)."""
    p = d if planned else None
    full = schedule(backward_tasks(c, all_reduce_s, planned=p))
    comp = schedule(backward_tasks(c, all_reduce_s, collectives=False, planned=p))
    exposed = max(0.0, full.makespan_s - comp.makespan_s)
    return Prediction(d, full.makespan_s, comp.makespan_s, full.t_comm_s, exposed, full)


def predict_graph(c: GraphCosts, d: Decision, all_reduce_s: Callable[[int], float]) -> Prediction:
    full = schedule(graph_tasks(c, d, all_reduce_s))
    comp = schedule(graph_tasks(c, d, all_reduce_s, collectives=False))
    exposed = max(0.0, full.makespan_s - comp.makespan_s)
    return Prediction(d, full.makespan_s, comp.makespan_s, full.t_comm_s, exposed, full)


# ---- realization ----------------------------------------------------------------------
def _chunk_site(gm: fx.GraphModule, site: TPSite, chunks: int, trainable: bool) -> None:
    nodes = {n.name: n for n in gm.graph.nodes}
    gemm, wait = nodes[site.gemm], nodes[site.wait]
    with gm.graph.inserting_before(wait):
        args = (site.kind, chunks, site.group_name, *gemm.args)
        kwargs = {"trainable": True} if trainable else {}
        new = gm.graph.call_function(row_parallel_chunks, args, kwargs)
        new.meta = dict(gemm.meta)
        last = new
        for name in site.reshapes:  # the same reshapes, now of the reduced sum
            last = gm.graph.node_copy(nodes[name], lambda a, g=gemm, r=last: r if a is g else a)
            gemm = nodes[name]
    wait.replace_all_uses_with(last)
    for name in (site.wait, site.all_reduce, *reversed(site.reshapes), site.gemm):
        gm.graph.erase_node(nodes[name])


def _column_site(gm: fx.GraphModule, site: TPSite, chunks: int) -> None:
    """Site's column-parallel GEMMs as `column_parallel_gemm`: their input's gradient
    all-reduced over `chunks` slices (1 where their tokens do not split so)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for name in site.column:
        node = nodes[name]
        kind = _op(node)
        if node.kwargs:
            raise ModelSpecError(
                f"column-parallel GEMM {name} has keyword arguments {dict(node.kwargs)}: its "
                "backward is not rewritten for them"
            )
        val = node.meta.get("val")
        rows = int(val.numel() // val.shape[-1]) if isinstance(val, torch.Tensor) else 0
        k = chunks if rows and rows % chunks == 0 else 1
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(
                column_parallel_gemm, (kind, k, site.group_name, *node.args)
            )
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)


def _fuse_epilogue(gm: fx.GraphModule, site: TPSite, compile_epilogue: bool) -> None:
    """Site's epilogue as one submodule, `tp_epilogue_<its row-parallel GEMM>`."""
    nodes = {n.name: n for n in gm.graph.nodes}
    members = [nodes[n] for n in site.epilogue]
    inside = set(members)
    inputs = list(dict.fromkeys(a for n in members for a in n.all_input_nodes if a not in inside))
    outputs = [n for n in members if any(u not in inside for u in n.users)]
    sub = fx.Graph()
    env = {a: sub.placeholder(f"in_{j}") for j, a in enumerate(inputs)}
    for n in members:
        env[n] = sub.node_copy(n, env.__getitem__)
    sub.output(tuple(env[o] for o in outputs))
    unit: torch.nn.Module = fx.GraphModule(torch.nn.Module(), sub)
    if compile_epilogue:
        unit = torch.compile(unit, dynamic=False)  # type: ignore[assignment]
    name = f"tp_epilogue_{site.gemm}"
    gm.add_submodule(name, unit)
    with gm.graph.inserting_after(members[-1]):
        call = gm.graph.call_module(name, tuple(inputs))
    with gm.graph.inserting_after(call):
        for j, o in enumerate(outputs):
            item = gm.graph.call_function(_item, (call, j))
            o.replace_all_uses_with(
                item, delete_user_cb=lambda u: u not in inside and u is not call
            )
    for n in reversed(members):
        gm.graph.erase_node(n)


def _item(values: tuple[torch.Tensor, ...], j: int) -> torch.Tensor:
    return values[j]


def _stable_sort(graph: fx.Graph) -> None:
    """Reorder `graph` topologically, keeping the program order wherever it is legal."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    missing = {n: len(n.all_input_nodes) for n in nodes}
    ready = [index[n] for n in nodes if missing[n] == 0]
    heapq.heapify(ready)
    order: list[fx.Node] = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for u in n.users:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, index[u])
    assert len(order) == len(nodes), "the rewritten program has a cycle"
    if order[0] is not nodes[0]:
        nodes[0].prepend(order[0])
    for before, n in itertools.pairwise(order):
        before.append(n)


def tp_program(
    gm: fx.GraphModule,
    decision: Decision,
    sites: list[TPSite] | None = None,
    compile_epilogue: bool = False,
    backward: bool = False,
) -> fx.GraphModule:
    """A copy of `gm` (sharing its parameters and buffers) with `decision` applied at
    its sites (a `TPDecision` at every site, `SiteDecisions` site by site; module
    docstring); `gm` is left as it is. A program without sites comes back unchanged.

    With `backward` the copy also trains (planner.distributed.tp_autograd): each site's
    column-parallel GEMMs all-reduce their input's gradient over the site's chunks,
    overlapped with their weight gradients; the row-parallel GEMM's backward needs no
    collective. A program with collectives other than its sites' cannot be rewritten so."""
    shared = {id(t): t for t in itertools.chain(gm.parameters(), gm.buffers())}
    with warnings.catch_warnings():  # torch's pytree specs warn when copied
        warnings.simplefilter("ignore", FutureWarning)
        out = copy.deepcopy(gm, memo=shared)  # the graph copied, the weights shared
    sites = find_tp_sites(out) if sites is None else sites
    ds = per_site(decision, len(sites))
    for site, d in zip(sites, ds):
        _chunk_site(out, site, d.chunks, backward)
        if backward:
            _column_site(out, site, d.chunks)
    left = [n.name for n in out.graph.nodes if _category(n) is Category.COLLECTIVE]
    if backward and left:
        raise ModelSpecError(
            f"the program has collectives outside its column -> row sites ({left[:4]}): "
            "their gradients are not known to the rewrite; train it without planning"
        )
    for site, d in zip(sites, ds):
        if d.fuse_epilogue and site.epilogue:
            _fuse_epilogue(out, site, compile_epilogue)
    _stable_sort(out.graph)
    out.graph.lint()
    out.recompile()
    return out
