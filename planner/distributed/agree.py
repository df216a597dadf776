"""Ranks agreeing on the outcome of steps whose outcome decides whether collectives follow.

A program with collectives must be run by every rank of its group or by none: a rank
that failed a step (a rewrite, a compile, a check) and skips what follows would leave the
others issuing collectives alone (on gloo a "collective mismatch" abort, on NCCL a hang).
So each such step ends with the ranks exchanging its outcome, called on every rank
whatever happened there, and every rank takes the same decision from it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

# bytes of a failing rank's error carried to the others (UTF-8, cut)
ERROR_BYTES = 240


def agree_failures(
    errors: Sequence[str], group: dist.ProcessGroup | None = None
) -> list[tuple[int, str] | None]:
    """For each of this rank's `errors` ("" where that step succeeded here), its outcome as
    every rank of `group` (default: the world) takes it: None where the step succeeded on
    every rank, else the first failing rank (its global rank) and that rank's error, cut
    to `ERROR_BYTES` bytes. Every rank passes as many errors, in the same order.

    One all_gather of a fixed-size byte tensor per rank (per step a flag, then the error's
    first bytes): nothing is unpickled. On NCCL the tensor is on the rank's current GPU
    (NCCL reduces nothing else)."""
    if not errors:
        return []
    mine = torch.zeros((len(errors), 1 + ERROR_BYTES), dtype=torch.uint8)
    for i, error in enumerate(errors):
        if error:
            text = error.encode()[:ERROR_BYTES]
            mine[i, 0] = 1
            mine[i, 1 : 1 + len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    if dist.get_backend(group) == "nccl":
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    gathered = torch.stack(every).cpu()  # (ranks, steps, 1 + ERROR_BYTES)
    out: list[tuple[int, str] | None] = []
    for i in range(len(errors)):
        failed = [r for r in range(gathered.shape[0]) if int(gathered[r, i, 0])]
        if not failed:
            out.append(None)
            continue
        r = failed[0]
        raw = bytes(gathered[r, i, 1:].tolist()).rstrip(b"\0")
        rank = r if group is None else dist.get_global_rank(group, r)
        out.append((rank, raw.decode(errors="replace")))
    return out
