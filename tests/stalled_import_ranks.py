"""A rank function whose module takes a minute to import: ranks that never join their
group, for the start deadline of profiling.commbench.run_ranks."""

import time

time.sleep(60)


def never(rank: int, world: int) -> list[float]:
    return [float(rank), float(world)]
