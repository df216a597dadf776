"""Measurement rows (dataset v1) on disk: one Parquet file per device/dtype set under data/.

The schema (learned_cost.data reads it; files: data/README.md): one row per measured unit, a
unique `key` digest so a resumed collection skips what is already there, the raw
descriptor of the unit (`desc_*`, planner.features), the analytical prediction, the
measured statistics, and the device / versions the number was measured under.

Rows are plain dicts; the file is rewritten atomically (temporary file + rename) on each
flush, so an interrupted collection never leaves a half-written file behind, and the rows
written before the interruption are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from planner.errors import FusionPlannerError

# 3: GPU plans too are timed as their kernels' copies in one CUDA graph; a whole call from
#    the host (guards, input and output copies) is column call_median_s.
# 2: GPU groups are timed as copies back to back in one CUDA graph (profiling.timer.
#    measure_in_graph; column graph_copies); 1 timed one replay of a graph per sample.
COLLECTOR_VERSION = "3"

# Columns every row carries, with why (desc_* columns come on top, one per descriptor field).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("key", "unique digest: duplicates are skipped on resume"),
    ("kind", "'group' (one group compiled and timed alone) or 'plan' (a whole realized plan)"),
    ("model", "model spec, e.g. zoo:transformer-block"),
    ("family", "zoo name: grouped train/test splits never straddle a family"),
    ("shape", "shape parameters, e.g. B=8,S=512,D=768,H=12"),
    ("graph_key", "OpGraph.key of the captured graph"),
    ("structure_key", "OpGraph.structure_key: the model across shapes"),
    ("nodes", "JSON node indices (group rows) or JSON list of groups (plan rows)"),
    ("n_groups", "1 for group rows"),
    ("strategy", "'' for randomly sampled groups, else the strategy whose plan it came from"),
    ("realization", "inductor | sdpa | concat_gemm | eager (plan rows: the most common)"),
    ("dtype", "the model's dtype"),
    ("device", "device spec name, e.g. h100"),
    ("device_fingerprint", "which physical device kind measured it"),
    ("torch_version", "kernels change between releases"),
    ("analytical_s", "the analytical model's latency for the unit"),
    ("pred_t_compute_s", "its compute part"),
    ("pred_t_memory_s", "its memory part"),
    ("pred_t_launch_s", "its launch part"),
    ("measured_median_s", "the target; NaN when the unit did not run"),
    ("measured_p99_s", "tail latency (docs/formulas.md §15)"),
    ("measured_iqr_s", "spread"),
    ("measured_min_s", "best case"),
    ("reps", "samples behind the statistics"),
    ("stable", "whether the median settled before the timer's bounds"),
    ("compile_s", "compile time of the unit"),
    ("ok", "False when it failed to compile, run or match eager"),
    ("error", "'' when ok"),
    ("created_at", "ISO time of the measurement"),
    ("collector_version", "version of this collector"),
)


def row_key(
    graph_key: str,
    nodes: Sequence[Any],
    device_fingerprint: str,
    dtype: str,
    realization: str,
    torch_version: str,
) -> str:
    """The digest that names a measurement (nodes: indices, or groups for a plan)."""
    canon = (
        sorted(nodes)
        if nodes and not isinstance(nodes[0], list | tuple)
        else sorted(sorted(g) for g in nodes)
    )
    blob = json.dumps(
        [graph_key, canon, device_fingerprint, dtype, realization, torch_version],
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class ProfileStore:
    """The rows of one dataset file: existing rows are kept, new ones appended on flush."""

    def __init__(self, path: str | Path, resume: bool = True):
        self.path = Path(path)
        self._old: list[dict[str, Any]] = []
        self._new: list[dict[str, Any]] = []
        if self.path.exists():
            if not resume:
                raise FusionPlannerError(
                    f"{self.path} exists: pass --resume to add to it, or choose another --out"
                )
            self._old = pq.read_table(self.path).to_pylist()
        self.keys = {str(r.get("key")) for r in self._old}

    def __len__(self) -> int:
        return len(self._old) + len(self._new)

    @property
    def n_new(self) -> int:
        return len(self._new)

    def has(self, key: str) -> bool:
        return key in self.keys

    def add(self, row: Mapping[str, Any]) -> bool:
        """Add a row unless its key is already present; True when added."""
        key = str(row["key"])
        if key in self.keys:
            return False
        missing = [c for c, _ in COLUMNS if c not in row]
        if missing:
            raise FusionPlannerError(f"row lacks dataset-v1 column(s) {missing}")
        self.keys.add(key)
        self._new.append(dict(row))
        return True

    def rows(self) -> list[dict[str, Any]]:
        return self._old + self._new

    def flush(self) -> None:
        """Write every row to `path` atomically."""
        rows = self.rows()
        if not rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = table_of(rows)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.path)


def table_of(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """A pyarrow table over the union of the rows' columns (missing cells are null)."""
    rows = list(rows)
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            names.setdefault(k, None)
    cols = {}
    for name in names:
        values = [r.get(name) for r in rows]
        if any(isinstance(v, float) for v in values) and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values
        ):
            values = [None if v is None else float(v) for v in values]
        cols[name] = values
    return pa.table(cols)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    return pq.read_table(Path(path)).to_pylist()
