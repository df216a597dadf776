"""Numerical agreement between a realized plan and eager, judged against a higher-precision
reference (docs/accuracy.md).

    high = run_in_high_precision(gm, args, torch.bfloat16)   # planner.realize.reference
    bad = compare_outputs(eager_outs, plan_outs, torch.bfloat16, high=high.values)
    bad, against = check_callable(plan_fn, eager_module, args)  # any callable vs eager

The rule, per floating output (`compare_tensor`): with `ref` the eager result in the
model's dtype, `got` the plan's and `high` the same program run in fp64 (inputs and
parameters upcast, integer inputs unchanged, float casts inside the program lifted),

    rmse(got, high) <= multiplier * rmse(ref, high) + floor

where multiplier is 3 for 16-bit floats and 2 otherwise (torch._dynamo's `same`) and
floor is one unit of roundoff of the dtype at the output's RMS magnitude
(`eps(dtype) * rms(high)`), plus float32's smallest normal number (a kernel that flushes
subnormal values to zero). The plan may be as far from the truth as eager is, with room
for noise, however deep the model and however coarse the dtype; a wrong kernel (a dropped
bias, a wrong scale, a swapped operand) is many times further off. Non-finite values are
accepted only where eager has them too; integer and bool outputs must be equal.

Without a reference (an fp64 model has no higher precision to compare against; a program
that fails to run at all in high precision) the fixed per-dtype table `TOLERANCES` decides,
as an elementwise `isclose`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from planner.ir.pytrees import flat_values
from planner.realize.reference import HighRun, run_module_in_high_precision


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


# dtype -> tolerance, used only where no higher-precision reference exists (module doc).
# profiling.verify re-exports this table (planner cannot import it).
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-7, "reordered sums only; 2^-52 epsilon"),
    "float32": Tolerance(
        1e-3, 1e-3, "reordered reductions and SDPA vs explicit softmax give ~1e-6 relative"
    ),
    "float16": Tolerance(
        1e-2, 1e-2, "eps 2^-10: a fused kernel rounds once where eager rounds every op"
    ),
    "bfloat16": Tolerance(
        5e-2, 5e-2, "eps 2^-7: a few ulps of rounding between eager kernels, compounded"
    ),
}
DEFAULT_TOLERANCE = TOLERANCES["float32"]

# The reference rule's constants (docs/accuracy.md says why these values).
LOW_PRECISION_MULTIPLIER = 3.0  # fp16 / bf16 outputs or models
MULTIPLIER = 2.0  # fp32
FLOOR_ULPS = 1.0  # units of roundoff at the output's RMS magnitude
# Values below float32's smallest normal number may be flushed to zero by a compiled
# kernel (flush-to-zero arithmetic), where eager keeps them as subnormals: an absolute
# error of at most that much per element is the kernel's arithmetic, not a wrong kernel.
FLUSH_FLOOR = torch.finfo(torch.float32).tiny

_CHUNK = 1 << 22  # elements per step when reducing errors over large outputs


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    name = str(dtype).removeprefix("torch.")
    return TOLERANCES.get(name, DEFAULT_TOLERANCE)


def _dtype(d: torch.dtype | str | None) -> torch.dtype | None:
    if d is None or isinstance(d, torch.dtype):
        return d
    return getattr(torch, str(d).removeprefix("torch."), None)


@dataclass(frozen=True)
class Mismatch:
    """Why two outputs disagree: which output, and by how much.

    Reference rule: `plan_err` / `eager_err` are RMS errors against the high-precision
    reference and `allowed` the bound plan_err had to stay under. Fixed table: the largest
    absolute error and the fraction of elements outside the tolerance.
    """

    output: int
    reason: str
    max_abs_err: float = math.nan
    bad_fraction: float = math.nan
    plan_err: float = math.nan
    eager_err: float = math.nan
    allowed: float = math.nan

    def __str__(self) -> str:
        if math.isnan(self.max_abs_err) or not math.isnan(self.plan_err):
            return f"output {self.output}: {self.reason}"
        return (
            f"output {self.output}: {self.reason} (max abs err {self.max_abs_err:.3g}, "
            f"{self.bad_fraction:.2%} of elements outside tolerance)"
        )


def _flat(x: Any) -> list[Any]:
    """Every leaf of an output, whatever its structure (planner.ir.pytrees.flat_values)."""
    return flat_values(x)


def short_reason(reason: str, limit: int = 120) -> str:
    """One line of at most `limit` characters (for tables)."""
    line = " ".join(str(reason).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def looser(a: Tolerance, b: Tolerance) -> Tolerance:
    return a if (a.rtol, a.atol) >= (b.rtol, b.atol) else b


def _low_precision(d: torch.dtype | None) -> bool:
    return d is not None and d.is_floating_point and torch.finfo(d).bits <= 16


def _coarsest(a: torch.dtype, b: torch.dtype | None) -> torch.dtype:
    if b is None or not b.is_floating_point:
        return a
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


@dataclass
class _Sums:
    plan_sq: float = 0.0
    eager_sq: float = 0.0
    ref_sq: float = 0.0
    count: int = 0
    max_abs: float = 0.0


def _error_sums(got: torch.Tensor, ref: torch.Tensor, high: torch.Tensor) -> _Sums | str:
    """Squared errors of got and ref against high over the elements all three have finite,
    in chunks (an LM head's logits may hold 10^9 elements); a reason when a non-finite
    value of `got` is not explained by eager."""
    g, r, h = (t.detach().reshape(-1) for t in (got, ref, high))
    s = _Sums()
    for i in range(0, g.numel(), _CHUNK):
        gc = g[i : i + _CHUNK].double()
        rc = r[i : i + _CHUNK].to(gc.device).double()
        hc = h[i : i + _CHUNK].to(gc.device).double()
        gf, rf, hf = torch.isfinite(gc), torch.isfinite(rc), torch.isfinite(hc)
        bad = int((~gf & rf).sum())
        if bad:
            return f"{bad} non-finite value(s) where eager is finite"
        missing = int((gf & ~rf & ~hf).sum())
        if missing:
            return f"{missing} finite value(s) where eager and the reference are not"
        m = gf & rf & hf
        dg, dr = (gc - hc)[m], (rc - hc)[m]
        s.plan_sq += float(dg.pow(2).sum())
        s.eager_sq += float(dr.pow(2).sum())
        s.ref_sq += float(hc[m].pow(2).sum())
        s.count += int(m.sum())
        if dg.numel():
            s.max_abs = max(s.max_abs, float(dg.abs().max()))
    return s


def _compare_to_reference(
    ref: torch.Tensor, got: torch.Tensor, high: torch.Tensor, index: int, at_least: Any
) -> Mismatch | None:
    """The reference rule for one floating output (module doc)."""
    if tuple(high.shape) != tuple(ref.shape):
        return Mismatch(index, f"reference shape {tuple(high.shape)} != {tuple(ref.shape)}")
    sums = _error_sums(got, ref, high)
    if isinstance(sums, str):
        return Mismatch(index, sums)
    if sums.count == 0:
        return None
    dtype = _coarsest(ref.dtype, _dtype(at_least))
    mult = LOW_PRECISION_MULTIPLIER if _low_precision(dtype) else MULTIPLIER
    plan_err = math.sqrt(sums.plan_sq / sums.count)
    eager_err = math.sqrt(sums.eager_sq / sums.count)
    floor = FLOOR_ULPS * torch.finfo(dtype).eps * math.sqrt(sums.ref_sq / sums.count)
    allowed = mult * eager_err + floor + FLUSH_FLOOR
    if plan_err <= allowed:
        return None
    return Mismatch(
        index,
        f"rms err {plan_err:.3g} vs {str(high.dtype)[6:]} > {mult:g}x eager's "
        f"{eager_err:.3g} + {FLOOR_ULPS:g} ulp = {allowed:.3g}",
        sums.max_abs,
        plan_err=plan_err,
        eager_err=eager_err,
        allowed=allowed,
    )


def _compare_fixed(ref: torch.Tensor, got: torch.Tensor, index: int, at_least: Any) -> Any:
    """The fixed-table rule (no reference): elementwise isclose, `atol` relative to the
    reference's RMS magnitude (at least 1)."""
    tol = tolerance_for(ref.dtype)
    if at_least is not None:
        tol = looser(tol, tolerance_for(at_least))
    r = ref.detach().double()
    g = got.detach().to(r.device).double()
    finite = torch.isfinite(r)
    scale = max(1.0, float(r[finite].pow(2).mean().sqrt())) if bool(finite.any()) else 1.0
    close = torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol * scale, equal_nan=True)
    if bool(close.all()):
        return None
    diff = (g - r).abs()
    err = float(diff[finite & torch.isfinite(g)].max()) if bool(finite.any()) else math.inf
    return Mismatch(
        index,
        f"values differ beyond rtol={tol.rtol}, atol={tol.atol}x{scale:.3g}",
        err,
        float((~close).float().mean()),
    )


def compare_tensor(
    ref: torch.Tensor,
    got: Any,
    index: int = 0,
    at_least: str | torch.dtype | None = None,
    high: torch.Tensor | None = None,
) -> Mismatch | None:
    """None when `got` (the plan's value) is as accurate as `ref` (eager's): by the
    reference rule against `high` when given, else by the fixed table (module doc).

    `at_least`: the model's compute dtype. An fp32 value computed from bf16 inputs
    (`x.float()` after a bf16 add) carries bf16 rounding, so it is judged as bf16.
    Integer and bool values must be equal.
    """
    if not isinstance(got, torch.Tensor):
        return Mismatch(index, f"expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(ref.shape):
        return Mismatch(index, f"shape {tuple(got.shape)} != {tuple(ref.shape)}")
    if got.dtype != ref.dtype:
        return Mismatch(index, f"dtype {got.dtype} != {ref.dtype}")
    if ref.numel() == 0:
        return None
    if not (ref.is_floating_point() or ref.is_complex()):
        return None if torch.equal(got.cpu(), ref.cpu()) else Mismatch(index, "values differ")
    if isinstance(high, torch.Tensor) and ref.is_floating_point() and high.is_floating_point():
        return _compare_to_reference(ref, got, high, index, at_least)
    return _compare_fixed(ref, got, index, at_least)


def _same_leaf(r: Any, g: Any) -> bool:
    """Non-tensor leaves: equal where `==` answers with a bool, else of the same type
    (an opaque library object carried through)."""
    if r is g:
        return True
    try:
        eq = r == g
    except Exception:  # an object that cannot be compared: its type must match
        return type(r) is type(g)
    return eq if isinstance(eq, bool) else type(r) is type(g)


def compare_outputs(
    ref: Any,
    got: Any,
    at_least: str | torch.dtype | None = None,
    *,
    high: Any = None,
) -> Mismatch | None:
    """Compare outputs (any pytree, or flat lists of leaves) leaf by leaf; the first
    mismatch, or None. `high`: the same outputs computed in higher precision
    (planner.realize.reference); None falls back to the fixed table. `at_least`: the
    model's compute dtype (see compare_tensor)."""
    refs, gots = _flat(ref), _flat(got)
    if len(refs) != len(gots):
        return Mismatch(0, f"{len(gots)} outputs, expected {len(refs)}")
    highs = _flat(high) if high is not None else []
    if len(highs) != len(refs):
        highs = [None] * len(refs)
    for i, (r, g, h) in enumerate(zip(refs, gots, highs)):
        if isinstance(r, torch.Tensor):
            m = compare_tensor(r, g, i, at_least, h if isinstance(h, torch.Tensor) else None)
            if m is not None:
                return m
        elif isinstance(g, torch.Tensor) or not _same_leaf(r, g):
            return Mismatch(i, f"{short_reason(repr(g), 60)} != {short_reason(repr(r), 60)}")
    return None


def check_callable(
    fn: Callable[..., Any], module: Callable[..., Any], args: Sequence[Any]
) -> tuple[Mismatch | None, str]:
    """`fn` (a plan, a compiled graph) against `module` (eager) on `args` by the rule
    above, `module` run in high precision as the reference when it is an nn.Module (else
    the fixed table). Returns the first mismatch (None: agree) and what was compared
    against. A realized plan has its own `RealizedPlan.verify`, which also repairs it.
    Raises only what `module` itself raises on `args`."""
    dtype = model_dtype(module, args)
    with torch.no_grad():
        want = module(*args)
        try:
            got = fn(*args)
        except Exception as e:  # a plan that cannot run disagrees
            return Mismatch(0, f"run: {type(e).__name__}: {str(e)[:200]}"), ""
    high = (
        run_module_in_high_precision(module, args, dtype)
        if isinstance(module, torch.nn.Module)
        else HighRun(None, None, "no module to run in high precision")
    )
    return compare_outputs(want, got, dtype, high=high.values), high.describe()


def model_dtype(module: Any, args: Sequence[Any]) -> torch.dtype:
    """The coarsest floating dtype of `args` and (for a module) its parameters."""
    found = [x.dtype for x in args if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if isinstance(module, torch.nn.Module):
        found += [p.dtype for p in module.parameters() if p.is_floating_point()]
    return max(found, key=lambda d: torch.finfo(d).eps, default=torch.float32)


# ---- fresh inputs ---------------------------------------------------------------------
def fresh_inputs(example: Sequence[Any], gen: torch.Generator) -> tuple[Any, ...]:
    """New random inputs shaped like `example`: floating tensors standard normal, integer
    tensors (token ids, positions) uniform over [min, max] of the example's values (so an
    index stays in range), bool tensors (masks) and non-tensors as they are."""
    out = []
    for x in example:
        if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.dtype == torch.bool:
            out.append(x)
        elif x.is_floating_point():
            fresh = torch.randn(x.shape, generator=gen, dtype=torch.float32)
            out.append(fresh.to(device=x.device, dtype=x.dtype))
        elif x.is_complex():
            out.append(x)
        else:
            lo, hi = int(x.min()), int(x.max())
            fresh = torch.randint(lo, hi + 1, x.shape, generator=gen, dtype=torch.int64)
            out.append(fresh.to(device=x.device, dtype=x.dtype))
    return tuple(out)
