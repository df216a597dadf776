"""Measurement rows (dataset v1) as the learned cost model reads them.

profiling/collector.py writes one Parquet file per device/dtype set under `data/`, one row
per measured unit (schema: profiling/dataset.py; files: data/README.md). This module reads
those files with pyarrow (no pandas: the GPU machine and the runtime need nothing more),
keeps the rows as plain dicts, and picks the ones a model may learn from. Keeping rows as
dicts means a new column the collector adds later never breaks reading.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from planner.errors import CostModelError

DESC_PREFIX = "desc_"
# A measurement whose median is this much above its own minimum was disturbed while timed
# (another job on the machine, a clock change): it is no ground truth to learn from or to
# score against. Quiet timings sit at 1.0-1.1; on the shared 2-core CPU of the first
# dataset 25 of 176 plan rows exceed it, on the H100 36 of 1507 group rows.
MAX_NOISE = 1.5

# Columns a row must carry for the model to use it, with why.
REQUIRED_COLUMNS = (
    ("kind", "group rows train the model, plan rows score whole plans"),
    ("family", "grouped splits: rows of one model family never straddle train and test"),
    ("graph_key", "plan-choice regret compares plans of the same graph"),
    ("device", "the device spec whose roofline the correction is relative to"),
    ("dtype", "peaks depend on the dtype"),
    ("measured_median_s", "the target"),
    ("ok", "failed measurements carry no latency"),
)


@dataclass(frozen=True)
class Profiles:
    """Rows of one or more dataset files, in file order.

    `rows` are dicts keyed by column name; `sources` the files they came from;
    `data_hash` a digest of the rows' unique keys, so a model records what it saw.
    """

    rows: tuple[dict[str, Any], ...]
    sources: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def data_hash(self) -> str:
        return rows_hash(self.rows)

    def where(self, pred: Any) -> Profiles:
        return Profiles(tuple(r for r in self.rows if pred(r)), self.sources)

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows]


def rows_hash(rows: Iterable[Mapping[str, Any]]) -> str:
    """Digest of the rows' keys (or their content when a row has no key), order-free."""
    keys = sorted(str(r.get("key") or json.dumps(r, sort_keys=True, default=str)) for r in rows)
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def load_profiles(paths: str | Path | Sequence[str | Path]) -> Profiles:
    """Read dataset-v1 Parquet files; rows whose `key` was already seen are skipped."""
    if isinstance(paths, str | Path):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise CostModelError(
                f"profile dataset {path} does not exist; collect one with "
                "`fusion-plan collect --out data/<device>_profiles.parquet` or pass --data"
            )
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise CostModelError(f"{path} is not a readable Parquet dataset ({e})") from e
        missing = [c for c, _ in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise CostModelError(
                f"{path} lacks column(s) {missing} of the dataset-v1 schema (expected "
                f"{[c for c, _ in REQUIRED_COLUMNS]}); re-collect with profiling/collector.py"
            )
        for r in table.to_pylist():
            k = r.get("key")
            if k is not None:
                if k in seen:
                    continue
                seen.add(k)
            rows.append(r)
    return Profiles(tuple(rows), tuple(str(p) for p in paths))


def data_paths(values: Sequence[str]) -> list[str]:
    """The dataset files of a repeatable `--data` option whose values may each name several
    files separated by commas ("a.parquet,b.parquet"), in the order given."""
    return [p.strip() for v in values for p in str(v).split(",") if p.strip()]


def load_device_profiles(paths: Sequence[str | Path], device: str) -> Profiles:
    """load_profiles of `paths`, every one of which must hold rows of `device` (the rows of
    other devices a file also holds are left out by the callers, which select by device);
    a file without any is named, since it was passed by mistake."""
    profiles = load_profiles(paths)  # says which file is missing or unreadable
    for p in paths:
        devices = sorted(
            {str(d) for d in pq.read_table(p, columns=["device"])["device"].to_pylist()}
        )
        if device not in devices:
            raise CostModelError(
                f"{p} holds no rows of {device!r} (its rows are of {devices}); pass files "
                f"measured on {device!r} to --data, or the --device they were measured on"
            )
    return profiles


def descriptor_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `planner.features.group_descriptor` dict stored in a row's desc_* columns."""
    return {k[len(DESC_PREFIX) :]: v for k, v in row.items() if k.startswith(DESC_PREFIX)}


def is_usable(row: Mapping[str, Any], kind: str = "group", max_noise: float = MAX_NOISE) -> bool:
    """A row the model may learn from or be scored on: it ran, has a real latency, and
    was not disturbed while timed (median / min <= max_noise)."""
    m = row.get("measured_median_s")
    if not (
        row.get("kind") == kind
        and bool(row.get("ok"))
        and isinstance(m, int | float)
        and math.isfinite(m)
        and m > 0
    ):
        return False
    lo = row.get("measured_min_s")
    return not (isinstance(lo, int | float) and lo > 0 and m / lo > max_noise)


def noisy_rows(profiles: Profiles, kind: str, device: str | None = None) -> int:
    """How many rows that ran were dropped as disturbed (for the report)."""
    return sum(
        1
        for r in profiles.rows
        if r.get("kind") == kind
        and (device is None or r.get("device") == device)
        and is_usable(r, kind, max_noise=math.inf)
        and not is_usable(r, kind)
    )


def group_rows(
    profiles: Profiles, device: str | None = None, max_noise: float = MAX_NOISE
) -> list[dict[str, Any]]:
    """Usable kind="group" rows (of `device` when given) whose group does some work."""
    return [
        r
        for r in profiles.rows
        if is_usable(r, "group", max_noise)
        and (device is None or r.get("device") == device)
        and (r.get("desc_n_kernels") or 0) > 0
    ]


def plan_timing(row: Mapping[str, Any]) -> str:
    """How a plan row was timed: "kernels" (collector version 3 on GPU: the plan's kernels
    as copies in one CUDA graph, with whole calls kept in `call_median_s`) or "call" (whole
    calls from the host: CPU rows, older GPU rows, a plan whose kernels would not capture)."""
    call = row.get("call_median_s")
    if isinstance(call, float) and math.isfinite(call) and call != row.get("measured_median_s"):
        return "kernels"
    return "call"


def plan_rows(
    profiles: Profiles, device: str | None = None, max_noise: float = MAX_NOISE
) -> list[dict[str, Any]]:
    """Usable kind="plan" rows (of `device` when given).

    Plans of one device are compared with each other (error, regret), so they must be
    timed one way: where a device has plan rows timed as kernels, its rows timed as whole
    calls (from an older dataset beside it) are left out. A whole call adds the host's
    share, which jitters (docs/design_notes.md)."""
    usable = [
        r
        for r in profiles.rows
        if is_usable(r, "plan", max_noise) and (device is None or r.get("device") == device)
    ]
    as_kernels = {r.get("device") for r in usable if plan_timing(r) == "kernels"}
    return [r for r in usable if r.get("device") not in as_kernels or plan_timing(r) == "kernels"]


def plan_groups(row: Mapping[str, Any]) -> list[list[int]]:
    """The groups of a plan row: its `nodes` column is a JSON list of node-index lists."""
    nodes = row.get("nodes")
    groups = json.loads(nodes) if isinstance(nodes, str) else nodes
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise CostModelError(
            f"plan row {row.get('key')} has nodes={nodes!r}; expected a JSON list of groups "
            "(lists of node indices)"
        )
    return groups
