"""The project's exceptions: one root, one subclass per stage that can fail.

Messages say what was expected, what came, and what to do about it.
"""

from __future__ import annotations


def first_line(text: object, limit: int = 300) -> str:
    """The first line of `text` (an exception's message, say), stripped, cut to `limit`
    characters: "" for an empty message."""
    lines = str(text).strip().splitlines()
    return lines[0][:limit] if lines else ""


class FusionPlannerError(Exception):
    """Root of every error this project raises on purpose."""


class CaptureError(FusionPlannerError):
    """A model could not be turned into an OpGraph (torch.export failed, bad inputs)."""


class ModelSpecError(FusionPlannerError):
    """A `--model` / `--shape` specification could not be resolved."""


class DeviceSpecError(FusionPlannerError):
    """An unknown device name, or a device-spec file that does not parse."""


class LegalityError(FusionPlannerError):
    """A partition breaks a fusion rule; `.reasons` lists every broken rule."""

    def __init__(self, message: str, reasons: tuple[str, ...] = ()):
        super().__init__(message)
        self.reasons = reasons


class PlanError(FusionPlannerError):
    """A plan does not fit the graph it is applied to, or could not be realized."""


class CacheError(FusionPlannerError):
    """The plan cache is unreadable, corrupt, or from a foreign schema."""


class CostModelError(FusionPlannerError):
    """A cost model was used before it was fitted, or loaded for the wrong setting."""


class CostModelInputError(CostModelError, ValueError):
    """A cost model was given data it cannot use (wrong shape, NaN/inf, sparse, complex):
    also a ValueError, which is what scikit-learn's callers catch."""


class NotFittedCostModelError(CostModelError, ValueError, AttributeError):
    """A cost model was asked to predict before it was fitted: also the ValueError and
    AttributeError that scikit-learn's NotFittedError is."""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` is an allocation failure (host or device memory), not a bug: the
    model at the sizes asked for does not fit the machine."""
    if isinstance(e, MemoryError):
        return True
    text = str(e).lower()
    return any(m in text for m in ("can't allocate memory", "out of memory", "tried to allocate"))
