"""Deprecated location: the module moved to `planner.plans.buckets`. Importing this name
still works and warns."""

import warnings

import planner.plans.buckets as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
warnings.warn(
    "planner.buckets moved to planner.plans.buckets; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
