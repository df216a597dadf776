"""A Plan's recorded tensor-parallel decision applied to a captured rank program, verified
against the unplanned program on every rank, and narrowed to the sites that pass.

`realize_tp(captured, plan)` finds the program's column -> row sites
(planner.distributed.tp_graph) and checks that they are the sites the plan recorded
(`Plan.tensor_parallel`; else the unplanned program runs). It rewrites a copy of the
program with `tp_graph.tp_program` (each site's GEMM over `chunks` token slices with an
asynchronous all-reduce per slice, the epilogue as one unit when `fuse_epilogue`; both per
site) and checks it: the rewritten and the unplanned program run on the capture's example
inputs (or `inputs`), and every output of the rewritten one must equal the unplanned
program's within `TOLERANCE` of the output's largest value.

Where that whole-program check fails (a mismatch, or a rewrite or a run that raised, on
any rank), only the sites responsible fall back:

1. each site's decision is rewritten and checked alone, the other sites as captured;
2. the program with the decisions of the sites that passed alone is rewritten and checked
   once more as a whole, and runs if it passes;
3. else (or when no site passed alone, or every site did) every site falls back: the
   unplanned program runs.

A realization so costs at most one whole-program check, one check per site and a second
whole-program check; each check runs its rewritten program once, against the unplanned
program's outputs of one run. A site whose tokens do not split into its chunks falls back
without a check.

Every outcome is agreed by the ranks before anything depends on it
(planner.distributed.agree: one all_gather of fixed-size bytes over the sites' process
group, per outcome a flag and the failing rank's reason, nothing unpickled): the
rewrites before the rewritten program runs, each check before the next step is chosen.
So all ranks run the same programs, issue the same collectives and keep the same sites: a
site that fails on one rank falls back on every rank. A `TPRealizeWarning` names each site
that fell back and why (on the other ranks the failing rank's reason, as "on rank N:
..."). The rewritten program runs forward only (tp_graph.row_parallel_chunks).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

from planner.distributed.agree import agree_failures
from planner.distributed.tp_autograd import group_of
from planner.distributed.tp_graph import Decision, SiteDecisions, TPSite, find_tp_sites, tp_program
from planner.distributed.tp_plan import TPDecision
from planner.errors import PlanError
from planner.ir.capture import Captured
from planner.plans.plan import Plan

# the largest |planned - unplanned| allowed, relative to max(1, max |unplanned|)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-2, torch.bfloat16: 3e-2}


class TPRealizeWarning(UserWarning):
    """Sites of a recorded tensor-parallel decision were not applied: they run as captured."""


class RealizedTP(nn.Module):
    """The program a Plan's tensor-parallel decision realizes: the rewritten program when
    `applied` (the decision at every site the plan records but those in `fell_back`), else
    the unplanned one. `fell_back`: (the site's row-parallel GEMM, why) for each site left
    as captured; `reason`: why not every site was applied ("" when `complete`). Called like
    the captured program's module, on the same ranks."""

    static_shapes = True  # the sites' token counts are the capture's

    def __init__(
        self,
        program: nn.Module,
        applied: bool,
        reason: str,
        decision: Decision,
        fell_back: tuple[tuple[str, str], ...] = (),
    ):
        super().__init__()
        self.program, self.applied, self.reason, self.decision = program, applied, reason, decision
        self.fell_back = fell_back

    @property
    def complete(self) -> bool:
        """Whether every site runs as the plan decided."""
        return self.applied and not self.fell_back

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)


def _max_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max(1, max |ref|) over the outputs' tensors (inf where the
    structures or shapes differ)."""
    a, spec_a = pytree.tree_flatten(got)
    b, spec_b = pytree.tree_flatten(ref)
    if spec_a != spec_b:
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if not isinstance(y, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor) or x.shape != y.shape:
            return float("inf")
        if y.numel():
            scale = max(1.0, float(y.abs().max()))
            worst = max(worst, float((x.float() - y.float()).abs().max()) / scale)
    return worst


def _tolerance(outputs: Any) -> float:
    dtypes = [t.dtype for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
    return max((TOLERANCE.get(d, 3e-2) for d in dtypes), default=1e-5)


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


class _NoAgreement(Exception):
    """The ranks' agreement itself failed: nothing that needs every rank may run."""


class _Checks:
    """The steps of `realize_tp` on one rank (module docstring). Every rank calls them in
    the same order whatever happened on it, so each issues the same collectives."""

    def __init__(
        self,
        gm: fx.GraphModule,
        args: tuple[Any, ...],
        sites: list[TPSite],
        ds: tuple[TPDecision, ...],
        rewrite: Callable[..., Any],
        compile_epilogue: bool,
        verify: bool,
    ):
        self.gm, self.args, self.sites, self.ds = gm, args, sites, ds
        self.rewrite, self.compile_epilogue, self.verify = rewrite, compile_epilogue, verify
        self.reference: Any = None

    def agreed(self, reasons: list[str]) -> list[str]:
        """Each of this rank's `reasons` ("" = passed here) as every rank takes it: this
        rank's own, else the first failing rank's as "on rank N: ...", else ""."""
        try:
            failed = agree_failures(reasons, group_of(self.sites[0].group_name))
        except Exception as e:
            raise _NoAgreement(f"the ranks could not agree: {_failure(e)}") from e
        return [
            mine or (f"on rank {f[0]}: {f[1]}" if f else "") for mine, f in zip(reasons, failed)
        ]

    def run_reference(self) -> str:
        """Runs the unplanned program once for every check; why it failed ("" = it ran)."""
        try:
            with torch.no_grad():
                self.reference = self.gm(*self.args)
        except Exception as e:
            return _failure(e)
        return ""

    def rewritten(self, idx: list[int]) -> tuple[Any, str]:
        """The program with the decisions of sites `idx` (the others as captured), and why
        it could not be rewritten ("" = it was)."""
        decision = SiteDecisions(tuple(self.ds[i] for i in idx))
        try:
            return self.rewrite(
                self.gm, decision, [self.sites[i] for i in idx], self.compile_epilogue
            ), ""
        except Exception as e:
            return None, _failure(e)

    def mismatch(self, program: Any) -> str:
        """Why `program`'s outputs are not the unplanned program's ("" = they are)."""
        try:
            with torch.no_grad():
                got = program(*self.args)
        except Exception as e:
            return _failure(e)
        err, tol = _max_error(got, self.reference), _tolerance(self.reference)
        if err <= tol:
            return ""
        return f"its outputs differ from the unplanned program's by {err:.3g} (> {tol:g})"

    def whole(self, idx: list[int]) -> tuple[Any, str]:
        """The program with the decisions of sites `idx`, checked: (it, "") or (None, why),
        as every rank takes it."""
        program, reason = self.rewritten(idx)
        # agreed before it runs: a rank whose rewrite failed runs nothing, and must not
        # leave the others issuing the program's collectives alone
        (reason,) = self.agreed([reason])
        if not reason and self.verify:
            (reason,) = self.agreed([self.mismatch(program)])
        return (None, reason) if reason else (program, "")

    def each(self, idx: list[int]) -> list[str]:
        """Why each site of `idx` fails its check alone, the other sites as captured ("" =
        it passes), as every rank takes it: every rewrite agreed, then every run."""
        made = [self.rewritten([i]) for i in idx]
        reasons = self.agreed([why for _, why in made])
        if self.verify:
            runs = [why or self.mismatch(p) for (p, _), why in zip(made, reasons)]
            reasons = self.agreed(runs)
        return reasons


def _narrowed(checks: _Checks, local: list[str]) -> tuple[Any, dict[int, str], str]:
    """`realize_tp`'s steps (module docstring): the program with the sites that passed (None:
    the unplanned program runs), why each other site fell back (by site index), and why
    no site was applied ("" when some was)."""
    first = checks.run_reference() if checks.verify else ""
    failed, *local = checks.agreed([first, *local])
    if failed:
        return None, {}, f"the unplanned program failed: {failed}"
    why = {i: r for i, r in enumerate(local) if r}
    todo = [i for i in range(len(checks.sites)) if i not in why]
    if not todo:
        return None, why, "no site's decision applies"
    program, whole = checks.whole(todo)
    if program is not None:
        return program, why, ""
    alone = checks.each(todo) if len(todo) > 1 else [whole]  # one site: it was alone
    why |= {i: r for i, r in zip(todo, alone) if r}
    kept = [i for i in todo if i not in why]
    if not kept:
        return None, why, f"no site passed alone (the whole program: {whole})"
    if kept == todo:
        return None, why, f"every site passed alone, but not together: {whole}"
    program, again = checks.whole(kept)
    if program is None:
        return None, why, f"the sites that passed alone failed together: {again}"
    return program, why, ""


def realize_tp(
    captured: Captured,
    plan: Plan,
    *,
    inputs: tuple[Any, ...] | None = None,
    compile_epilogue: bool | None = None,
    verify: bool = True,
    rewrite: Callable[..., fx.GraphModule] = tp_program,
) -> RealizedTP:
    """`plan`'s tensor-parallel decision on `captured`, at the sites that pass their checks
    (module docstring: at most one whole-program check, one check per site and one more
    whole-program check). Call it on every rank of the program's group, each with its own
    capture. `compile_epilogue` (default: on CUDA inputs) compiles a fused epilogue with
    Inductor; without `verify` only the rewrites are checked. `rewrite` replaces
    `tp_program` (tests inject wrong programs with it)."""
    choice = plan.tensor_parallel
    if choice is None:
        raise PlanError("the plan records no tensor-parallel decision")
    ds = tuple(TPDecision(k, f) for k, f in zip(choice.chunks, choice.fuse_epilogue))
    decision: Decision = ds[0] if choice.uniform else SiteDecisions(ds)
    gm = captured.program.module()
    args = tuple(captured.example_inputs if inputs is None else inputs)

    def unplanned(reason: str, fell_back: tuple[tuple[str, str], ...] = ()) -> RealizedTP:
        warnings.warn(
            f"tensor-parallel decision {choice.label} not applied, the unplanned program "
            f"runs instead: {reason}",
            TPRealizeWarning,
            stacklevel=3,
        )
        return RealizedTP(gm, False, reason, decision, fell_back)

    sites = find_tp_sites(gm)
    found = tuple(s.gemm for s in sites)
    if found != choice.sites or not sites:
        return unplanned(
            f"the plan's sites {list(choice.sites)} are not the program's {list(found)}"
        )
    local = [
        f"its {s.rows} tokens do not split into {d.chunks} chunks" if s.rows % d.chunks else ""
        for s, d in zip(sites, ds)
    ]
    if compile_epilogue is None:
        compile_epilogue = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    checks = _Checks(gm, args, sites, ds, rewrite, compile_epilogue, verify)
    try:
        program, why, none = _narrowed(checks, local)
    except _NoAgreement as e:
        return unplanned(str(e))
    per_site = "; ".join(f"site {sites[i].gemm}: {r}" for i, r in sorted(why.items()))
    if program is None:
        fell_back = tuple((s.gemm, why.get(i, none)) for i, s in enumerate(sites))
        return unplanned(f"{none}; {per_site}" if per_site else none, fell_back)
    fell_back = tuple((sites[i].gemm, r) for i, r in sorted(why.items()))
    if fell_back:
        kept = [s.gemm for i, s in enumerate(sites) if i not in why]
        reason = f"sites {[g for g, _ in fell_back]} run as captured: {per_site}"
        warnings.warn(
            f"tensor-parallel decision {choice.label} applied at sites {kept} only; {reason}",
            TPRealizeWarning,
            stacklevel=2,
        )
        return RealizedTP(program, True, reason, decision, fell_back)
    return RealizedTP(program, True, "", decision)
