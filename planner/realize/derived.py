"""Copies of model state a realized plan holds, kept equal to the state they come from.

Some realizations run on tensors made from the model's weights at realization: a
concatenated GEMM's weight, a weight padded to aligned rows, a convolution weight in
channels-last. The plan's other state is the model's own tensors, so an update in place
(an optimizer step, `load_state_dict`, `with torch.no_grad(): w.mul_(2)`) reaches it; a copy
would go stale. Each copy records its recipe (its sources and how it is made); before each
call the plan compares the sources' version counters with those at the last making and
makes a changed copy again, into the same memory (a captured CUDA graph reads it there).

A change the version counter does not see (writing through `w.data`) is not caught.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_VERSION = operator.attrgetter("_version")


@dataclass(frozen=True)
class Recipe:
    """How a copy is made: `make(*state[s] for s in sources)`."""

    sources: tuple[str, ...]
    make: Callable[..., torch.Tensor]


def derive(
    recipes: dict[str, Recipe],
    name: str,
    sources: Sequence[str],
    make: Callable[..., torch.Tensor],
    state: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """Make the copy `name` from `state` and record its recipe in `recipes`."""
    recipes[name] = Recipe(tuple(sources), make)
    with torch.no_grad():
        return make(*(state[s].detach() for s in sources))


class DerivedState:
    """The copies of one realized plan and their sources (see the module doc)."""

    def __init__(
        self,
        state: Mapping[str, torch.Tensor],
        copies: Mapping[str, torch.Tensor],
        recipes: Mapping[str, Recipe],
    ):
        self._items: list[tuple[torch.Tensor, tuple[torch.Tensor, ...], Recipe]] = [
            (copies[n], tuple(state[s] for s in r.sources), r)
            for n, r in recipes.items()
            if n in copies
        ]
        self._sources = [t for _, srcs, _ in self._items for t in srcs]
        self._seen = self._versions()

    @classmethod
    def of_units(cls, state: Mapping[str, torch.Tensor], units: Iterable[Any]) -> DerivedState:
        """The copies of realized groups (`extra_state` and `derived` of each unit)."""
        units = list(units)
        copies = {k: v for u in units for k, v in u.extra_state.items()}
        return cls(state, copies, {k: r for u in units for k, r in u.derived.items()})

    def _versions(self) -> list[int]:
        return list(map(_VERSION, self._sources))

    def refresh(self) -> int:
        """Make again every copy whose sources changed since it was made; how many."""
        if not self._items:
            return 0
        now = self._versions()
        if now == self._seen:
            return 0
        n = 0
        i = 0
        with torch.no_grad():
            for buf, srcs, recipe in self._items:
                k = len(srcs)
                if now[i : i + k] != self._seen[i : i + k]:
                    buf.copy_(recipe.make(*(t.detach() for t in srcs)))
                    n += 1
                i += k
        self._seen = now
        return n
