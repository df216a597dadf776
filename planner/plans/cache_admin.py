"""Plan-cache maintenance: prune, export, import (what `fusion-plan cache` does).

Kept apart from planner/plans/cache.py, whose lookups and stores are what tuning jobs and the
runtime use; these act on many entries at once and are run by people. `PlanCache`
inherits them, so they are called as `cache.prune(...)`, `cache.export_records()`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import planner.plans.cache_sql as sql
from planner.errors import CacheError, FusionPlannerError, PlanError
from planner.plans.buckets import BucketSpec, exact_key
from planner.plans.plan import SCHEMA_VERSION, Plan, now_iso

log = logging.getLogger(__name__)

EXPORT_FORMAT = "fusion-planner-plan-cache-export"
MAX_AGE_S = 100 * 365 * 86400.0  # prune --older-than: ages past a century are typos


class CacheAdmin:
    """Bulk operations of `planner.plans.cache.PlanCache` (a mixin: it uses the cache's `db`,
    `_current_params`, `clear_l1` and history-id helper)."""

    db: sql.Store

    def _current_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def clear_l1(self) -> None:
        raise NotImplementedError

    def prune(
        self,
        *,
        stale: bool = False,
        older_than_s: float | None = None,
        model_key: str | None = None,
        device_fp: str | None = None,
        queue: str = "none",
        history: bool = False,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Delete entries: stale ones, ones not updated for `older_than_s`, or all of one
        model/device (when only those filters are given). `queue`: also drop "tuned" or
        "all" queue rows; `history`: also drop history rows of the same filters."""
        if queue not in ("none", "tuned", "all"):
            raise CacheError(f"queue must be none, tuned or all, got {queue!r}")
        cutoff = None
        if older_than_s is not None:
            if (
                isinstance(older_than_s, bool)
                or not isinstance(older_than_s, int | float)
                or not math.isfinite(older_than_s)
                or not 0 <= older_than_s <= MAX_AGE_S
            ):
                raise CacheError(
                    f"older-than must be a finite age between 0 and {MAX_AGE_S / 86400:.0f} "
                    f"days, got {older_than_s / 86400 if isinstance(older_than_s, int | float) else older_than_s!r} days"
                )
            cutoff = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - older_than_s))
        where, params = sql.where_clause(model_key=model_key, device_fp=device_fp)
        conds = [where.removeprefix(" WHERE ")] if where else []
        if stale:
            conds.append(sql.STALE_WHERE)
            params.update(self._current_params())
        if cutoff:
            conds.append("updated_at < :cutoff")
            params["cutoff"] = cutoff
        if not (conds or queue != "none"):
            raise CacheError(
                "prune needs something to select: --stale, --older-than, --model, --device "
                "or --queue (refusing to empty the whole cache by accident)"
            )
        plan_where = " WHERE " + " AND ".join(f"({c})" for c in conds) if conds else None
        hist_where = plan_where.replace("fp_plans.", "fp_history.") if plan_where else None
        qwhere, qparams = sql.where_clause(
            model_key=model_key, device_fp=device_fp, status="tuned" if queue == "tuned" else None
        )
        stmts: list[tuple[str, str, Mapping[str, Any]]] = []
        if plan_where:
            stmts.append(("plans", f"fp_plans{plan_where}", params))
            if history:
                stmts.append(("history", f"fp_history{hist_where}", params))
        if queue != "none":
            stmts.append(("queue", f"fp_queue{qwhere}", qparams))
        if dry_run:
            return {
                name: int(self.db.execute(f"SELECT COUNT(*) AS n FROM {tail}", p)[0]["n"])
                for name, tail, p in stmts
            }
        counts = self.db.write([(f"DELETE FROM {tail}", p) for _, tail, p in stmts])
        self.clear_l1()
        return {name: n for (name, _, _), n in zip(stmts, counts)}

    def export_records(self) -> dict[str, Any]:
        """Everything in the cache as one JSON-able document (plans as JSON, not pickle)."""
        cols = ", ".join(sql.PLAN_COLUMNS)
        plans = _decoded(
            self.db.execute(f"SELECT {cols} FROM fp_plans ORDER BY model_key, bucket_key"),
            "plan_json",
            "plan",
        )
        specs = _decoded(
            self.db.execute("SELECT model_key, device_fp, spec_json, updated_at FROM fp_specs"),
            "spec_json",
            "spec",
        )
        cols = ", ".join(sql.QUEUE_COLUMNS)
        queue = _decoded(
            self.db.execute(f"SELECT {cols} FROM fp_queue ORDER BY model_key, shape_key"),
            "shapes_json",
            "shapes",
        )
        return export_document(plans, specs, queue)

    def import_records(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Merge an `export_records` document: plans by the same better-wins rule as
        `store`, specs replaced, queue counts added.

        Every record is checked first (`validate_export`); a malformed one refuses the
        whole import with a CacheError listing what is wrong, and nothing is written.
        Plans of another plan schema are skipped and counted as rejected. The rest is
        applied in one transaction: all of it lands, or none."""
        checked = validate_export(data)
        cur = self._current_params()
        stmts: list[tuple[str, Mapping[str, Any]]] = []
        for row in checked.plans:
            stmts.append((sql.UPSERT_PLAN, {**row, **cur, "always": 0}))
            stmts.append((sql.INSERT_HISTORY, {**row, "id": sql.history_id()}))
        stmts += [(sql.UPSERT_SPEC, p) for p in checked.specs]
        stmts += [(sql.UPSERT_QUEUE, p) for p in checked.queue]
        counts = self.db.write(stmts) if stmts else []
        stored = sum(1 for n in counts[: 2 * len(checked.plans) : 2] if n > 0)
        self.clear_l1()
        return {
            "stored": stored,
            "kept_existing": len(checked.plans) - stored,
            "rejected": checked.rejected,
            "specs": len(checked.specs),
            "queue": len(checked.queue),
        }


def export_document(
    plans: list[dict[str, Any]] | None = None,
    specs: list[dict[str, Any]] | None = None,
    queue: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An export document (what `cache export` writes and `cache import` reads)."""
    return {
        "format": EXPORT_FORMAT,
        "schema": sql.CACHE_SCHEMA,
        "exported_at": now_iso(),
        "plans": plans or [],
        "specs": specs or [],
        "queue": queue or [],
    }


def plan_record(plan: Plan, bucket_key: str, *, label: str = "") -> dict[str, Any]:
    """A plan as an export record for `bucket_key` ("bucket:[...]" or "exact:[...]")."""
    now = now_iso()
    return {
        "model_key": plan.structure_key,
        "device_fp": plan.device_fingerprint,
        "bucket_key": bucket_key,
        "plan": plan.to_json(),
        "plan_id": plan.graph_key,
        "predicted_s": plan.predicted_s,
        "measured_s": plan.measured_s,
        "torch_version": plan.versions.get("torch", ""),
        "cost_model": plan.cost_model,
        "schema_version": int(plan.versions.get("planner_schema", SCHEMA_VERSION)),
        "label": label,
        "created_at": plan.created_at or now,
        "updated_at": now,
    }


def spec_record(model_key: str, device_fp: str, spec: BucketSpec) -> dict[str, Any]:
    """A bucket spec as an export record."""
    return {
        "model_key": model_key,
        "device_fp": device_fp,
        "spec": spec.to_json(),
        "updated_at": now_iso(),
    }


def _decoded(rows: list[dict[str, Any]], column: str, key: str) -> list[dict[str, Any]]:
    """Rows with their JSON `column` decoded under `key`; a row whose JSON does not parse
    is left out of the export with a warning (an import would refuse it anyway)."""
    out = []
    for r in rows:
        try:
            r[key] = json.loads(r.pop(column))
        except (TypeError, ValueError) as e:
            log.warning("export: left out an unreadable row of %s (%s)", r.get("model_key"), e)
            continue
        out.append(r)
    return out


# ---- checking records ---------------------------------------------------------------------
_TEXT_PLAN_COLUMNS = tuple(
    c
    for c in sql.PLAN_COLUMNS
    if c not in ("plan_json", "predicted_s", "measured_s", "schema_version")
)
_TEXT_QUEUE_COLUMNS = ("model_key", "device_fp", "shape_key", "bucket_key", "label")
_TIME_QUEUE_COLUMNS = ("first_seen", "last_seen")


@dataclass(frozen=True)
class CheckedExport:
    """An export document's rows, checked and ready for the SQL statements."""

    plans: list[dict[str, Any]]
    specs: list[dict[str, Any]]
    queue: list[dict[str, Any]]
    rejected: int  # plans of another plan schema, skipped


def check_seconds(value: Any, what: str, *, positive: bool) -> None:
    """A latency field: None, or a finite number (> 0 when `positive`, else >= 0)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CacheError(f"{what} must be a number of seconds or null, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise CacheError(f"{what} must be a finite number of seconds {need}, got {value!r}")


def check_plan(plan: Plan) -> None:
    """A plan's own consistency: its groups partition the nodes 0..n-1 (each node in
    exactly one group), and its latencies are finite (a measured one > 0). A plan that
    fails would claim a hit and then fail to apply."""
    seen: set[int] = set()
    total = 0
    for g in plan.groups:
        if not g.nodes:
            raise PlanError("a plan group is empty")
        for n in g.nodes:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise PlanError(f"a plan group holds {n!r}, not a node index")
            seen.add(n)
        total += len(g.nodes)
    if not plan.groups:
        raise PlanError("the plan has no groups")
    if total != len(seen) or seen != set(range(total)):
        raise PlanError(
            f"the plan's groups do not partition nodes 0..{total - 1} (indices repeated "
            f"or out of range, largest {max(seen)})"
        )
    if not isinstance(plan.structure_key, str) or not plan.structure_key:
        raise PlanError("the plan has no structure_key")
    check_seconds(plan.predicted_s, "predicted_s", positive=False)
    check_seconds(plan.measured_s, "measured_s", positive=True)


def check_shapes(shapes: Any) -> None:
    """A queued input signature: a list of shapes, each a list of sizes >= 0."""
    if not isinstance(shapes, list) or not all(isinstance(s, list) for s in shapes):
        raise CacheError(f"shapes must be a list of lists of sizes, got {shapes!r}")
    for s in shapes:
        for d in s:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise CacheError(f"shapes must hold sizes (integers >= 0), got {shapes!r}")


def _plan_row(rec: Any) -> dict[str, Any] | None:
    """The fp_plans row of an export record (None: another plan schema, skipped)."""
    if not isinstance(rec, dict):
        raise CacheError(f"a plan record must be an object, got {type(rec).__name__}")
    missing = [c for c in (*_TEXT_PLAN_COLUMNS, "schema_version", "plan") if c not in rec]
    if missing:
        raise CacheError(f"missing {', '.join(missing)}")
    for c in _TEXT_PLAN_COLUMNS:
        if not isinstance(rec[c], str):
            raise CacheError(f"{c} must be text, got {rec[c]!r}")
    if isinstance(rec["schema_version"], bool) or not isinstance(rec["schema_version"], int):
        raise CacheError(f"schema_version must be an integer, got {rec['schema_version']!r}")
    for c in ("predicted_s", "measured_s"):
        check_seconds(rec.get(c), c, positive=c == "measured_s")
    if not rec["bucket_key"].startswith(("exact:[", "bucket:[")):
        raise CacheError(
            f"bucket_key must be exact:[...] or bucket:[...], got {rec['bucket_key']!r}"
        )
    data = rec["plan"]
    if not isinstance(data, dict):
        raise CacheError(f"plan must be an object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA_VERSION:
        return None
    try:
        plan = Plan.from_json(data)
        check_plan(plan)
    except (TypeError, ValueError, AttributeError, FusionPlannerError) as e:
        raise CacheError(f"plan: {e}") from e
    if plan.structure_key != rec["model_key"]:
        raise CacheError(
            f"model_key {rec['model_key']!r} is not the plan's structure_key {plan.structure_key!r}"
        )
    if plan.measured_s != rec.get("measured_s"):
        raise CacheError(
            f"measured_s {rec.get('measured_s')!r} differs from the plan's {plan.measured_s!r}"
        )
    row = {c: rec.get(c) for c in sql.PLAN_COLUMNS if c != "plan_json"}
    row["plan_json"] = json.dumps(data, sort_keys=True)
    return row


def _spec_row(rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise CacheError(f"a spec record must be an object, got {type(rec).__name__}")
    for c in ("model_key", "device_fp", "updated_at"):
        if not isinstance(rec.get(c), str):
            raise CacheError(f"{c} must be text, got {rec.get(c)!r}")
    if not isinstance(rec.get("spec"), dict):
        raise CacheError(f"spec must be an object, got {rec.get('spec')!r}")
    try:
        BucketSpec.from_json(rec["spec"])
    except (TypeError, ValueError, FusionPlannerError) as e:
        raise CacheError(f"spec: {e}") from e
    return {
        "model_key": rec["model_key"],
        "device_fp": rec["device_fp"],
        "updated_at": rec["updated_at"],
        "spec_json": json.dumps(rec["spec"], sort_keys=True),
    }


def _queue_row(rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise CacheError(f"a queue record must be an object, got {type(rec).__name__}")
    for c in (*_TEXT_QUEUE_COLUMNS, *_TIME_QUEUE_COLUMNS):
        if not isinstance(rec.get(c), str):
            raise CacheError(f"{c} must be text, got {rec.get(c)!r}")
    count = rec.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CacheError(f"count must be an integer >= 1, got {count!r}")
    if rec.get("status") not in ("pending", "tuned"):
        raise CacheError(f"status must be pending or tuned, got {rec.get('status')!r}")
    check_shapes(rec.get("shapes"))
    if exact_key(rec["shapes"]) != rec["shape_key"]:
        raise CacheError(f"shape_key {rec['shape_key']!r} does not match shapes {rec['shapes']}")
    params = {c: rec[c] for c in sql.QUEUE_COLUMNS if c != "shapes_json"}
    params["shapes_json"] = json.dumps(rec["shapes"])
    return params


def validate_export(data: Any) -> CheckedExport:
    """Check a whole export document; a CacheError names every bad record (up to 10)."""
    if (
        not isinstance(data, Mapping)
        or data.get("format") != EXPORT_FORMAT
        or data.get("schema") != sql.CACHE_SCHEMA
    ):
        got = data if not isinstance(data, Mapping) else data.get("format")
        schema = data.get("schema") if isinstance(data, Mapping) else None
        raise CacheError(
            f"not a plan-cache export of schema {sql.CACHE_SCHEMA} (format {got!r}, schema "
            f"{schema!r}): export it again with this version's `fusion-plan cache export`"
        )
    problems: list[str] = []
    out: dict[str, list[dict[str, Any]]] = {"plans": [], "specs": [], "queue": []}
    rejected = 0
    for part, check in (("plans", _plan_row), ("specs", _spec_row), ("queue", _queue_row)):
        records = data.get(part, [])
        if not isinstance(records, list):
            problems.append(f"{part} must be a list, got {type(records).__name__}")
            continue
        for i, rec in enumerate(records):
            try:
                row = check(rec)
            except CacheError as e:
                problems.append(f"{part}[{i}]: {e}")
                continue
            if row is None:
                rejected += 1
                log.warning("import: skipped %s[%d], a plan of another plan schema", part, i)
            else:
                out[part].append(row)
    if problems:
        shown = "; ".join(problems[:10]) + (
            f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
        )
        raise CacheError(
            f"the export holds {len(problems)} malformed record(s), so nothing was imported: "
            f"{shown}"
        )
    return CheckedExport(out["plans"], out["specs"], out["queue"], rejected)
