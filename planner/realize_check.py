"""Numerical agreement between a realized plan and eager: dtype-aware tolerances.

A fused kernel computes in another order than eager (reductions split differently,
intermediates kept in fp32 registers instead of rounded to bf16 between kernels, SDPA
instead of an explicit softmax), so results differ by a few units in the last place of
the dtype, never by more. The table gives, per dtype, how far apart two correct answers
may be; anything further is a wrong realization and that group runs eagerly.

`atol` is relative to the reference's RMS magnitude (at least 1): layer outputs of order
10 and of order 0.1 are judged alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from planner.pytrees import flat_values


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


# dtype -> tolerance. profiling.verify re-exports this table (planner cannot import it).
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


def tolerance_for(dtype: torch.dtype | str) -> Tolerance:
    name = str(dtype).removeprefix("torch.")
    return TOLERANCES.get(name, DEFAULT_TOLERANCE)


@dataclass(frozen=True)
class Mismatch:
    """Why two outputs disagree: which output, and by how much."""

    output: int
    reason: str
    max_abs_err: float = math.nan
    bad_fraction: float = math.nan

    def __str__(self) -> str:
        if math.isnan(self.max_abs_err):
            return f"output {self.output}: {self.reason}"
        return (
            f"output {self.output}: {self.reason} (max abs err {self.max_abs_err:.3g}, "
            f"{self.bad_fraction:.2%} of elements outside tolerance)"
        )


def _flat(x: Any) -> list[Any]:
    """Every leaf of an output, whatever its structure (planner.pytrees.flat_values)."""
    return flat_values(x)


def looser(a: Tolerance, b: Tolerance) -> Tolerance:
    return a if (a.rtol, a.atol) >= (b.rtol, b.atol) else b


def compare_tensor(
    ref: torch.Tensor, got: Any, index: int = 0, at_least: str | torch.dtype | None = None
) -> Mismatch | None:
    """None when `got` matches `ref` within the tolerance of ref's dtype, or of `at_least`
    when that is looser: an fp32 value computed from bf16 inputs (`x.float()` after a bf16
    add) carries bf16 rounding, which a fused kernel that never rounds does not."""
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


def compare_outputs(
    ref: Any, got: Any, at_least: str | torch.dtype | None = None
) -> Mismatch | None:
    """Compare (nested) outputs elementwise; the first mismatch, or None. `at_least`: the
    model's compute dtype (see compare_tensor)."""
    refs, gots = _flat(ref), _flat(got)
    if len(refs) != len(gots):
        return Mismatch(0, f"{len(gots)} outputs, expected {len(refs)}")
    for i, (r, g) in enumerate(zip(refs, gots)):
        if isinstance(r, torch.Tensor):
            m = compare_tensor(r, g, i, at_least)
            if m is not None:
                return m
        elif r != g:
            return Mismatch(i, f"{g!r} != {r!r}")
    return None
