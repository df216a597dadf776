"""Deprecated location: the module moved to `planner.plans.cache`. Importing this name
still works and warns."""

import warnings

import planner.plans.cache as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
warnings.warn(
    "planner.cache moved to planner.plans.cache; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
