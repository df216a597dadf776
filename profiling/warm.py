"""Compiling groups ahead of the measuring process, in a pool of worker processes.

Inductor caches what it compiles on disk (the FX graph cache) under a key of the graph,
its input shapes and the compiler's configuration. A worker that exports the same model
and cuts the same group makes the same key, so when the measuring process later compiles
that group it is a cache hit (tens of milliseconds instead of seconds). Workers only
compile; the GPU is measured by one process, one unit at a time.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import torch
import torch._inductor.config as inductor_config


def _init_worker() -> None:
    torch.set_num_threads(1)
    inductor_config.compile_threads = 1  # the pool is the parallelism


class WarmPool:
    """A spawn-context process pool whose workers compile with one thread each."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run module-level `fn(*args)` in a worker (arguments must pickle)."""
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
