"""Distributed operators: collectives as ops, their α-β costs per algorithm and link,
the compute/communication overlap of a plan, pipeline bubbles and NUMA placement.

The formulas and what is measured are in docs/distributed.md.
"""

from planner.distributed.comm_cost import (
    Algorithm,
    CollectiveKind,
    bubble_fraction,
    collective_time_s,
)
from planner.distributed.links import LINKS, AlphaBeta, LinkSpec, get_link

__all__ = [
    "LINKS",
    "Algorithm",
    "AlphaBeta",
    "CollectiveKind",
    "LinkSpec",
    "bubble_fraction",
    "collective_time_s",
    "get_link",
]
