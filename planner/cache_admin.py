"""Plan-cache maintenance: prune, export, import (what `fusion-plan cache` does).

Kept apart from planner/cache.py, whose lookups and stores are what tuning jobs and the
runtime use; these act on many entries at once and are run by people. `PlanCache`
inherits them, so they are called as `cache.prune(...)`, `cache.export_records()`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from planner import cache_sql as sql
from planner.buckets import BucketSpec
from planner.errors import CacheError, FusionPlannerError
from planner.plan import Plan, now_iso

log = logging.getLogger(__name__)

EXPORT_FORMAT = "fusion-planner-plan-cache-export"


class CacheAdmin:
    """Bulk operations of `planner.cache.PlanCache` (a mixin: it uses the cache's `db`,
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
        plans = self.db.execute(f"SELECT {cols} FROM fp_plans ORDER BY model_key, bucket_key")
        for p in plans:
            p["plan"] = json.loads(p.pop("plan_json"))
        specs = self.db.execute("SELECT model_key, device_fp, spec_json, updated_at FROM fp_specs")
        for s in specs:
            s["spec"] = json.loads(s.pop("spec_json"))
        cols = ", ".join(sql.QUEUE_COLUMNS)
        queue = self.db.execute(f"SELECT {cols} FROM fp_queue ORDER BY model_key, shape_key")
        for q in queue:
            q["shapes"] = json.loads(q.pop("shapes_json"))
        return {
            "format": EXPORT_FORMAT,
            "schema": sql.CACHE_SCHEMA,
            "exported_at": now_iso(),
            "plans": plans,
            "specs": specs,
            "queue": queue,
        }

    def import_records(self, data: Mapping[str, Any]) -> dict[str, int]:
        """Merge an `export_records` document: plans by the same better-wins rule as
        `store`, specs replaced, queue counts added. Unreadable plans are rejected."""
        if data.get("format") != EXPORT_FORMAT or data.get("schema") != sql.CACHE_SCHEMA:
            raise CacheError(
                f"not a plan-cache export of schema {sql.CACHE_SCHEMA} (format "
                f"{data.get('format')!r}, schema {data.get('schema')!r}): export it again "
                "with this version's `fusion-plan cache export`"
            )
        counts = {"stored": 0, "kept_existing": 0, "rejected": 0, "specs": 0, "queue": 0}
        cur = self._current_params()
        for rec in data.get("plans", []):
            try:
                Plan.from_json(rec["plan"])
                row = {c: rec[c] for c in sql.PLAN_COLUMNS if c != "plan_json"}
                row["plan_json"] = json.dumps(rec["plan"], sort_keys=True)
            except (KeyError, TypeError, FusionPlannerError) as e:
                counts["rejected"] += 1
                log.warning("import: rejected a plan record (%s)", e)
                continue
            won = self.db.write([(sql.UPSERT_PLAN, {**row, **cur, "always": 0})])[0] > 0
            hist = {**row, "id": sql.history_id(), "won": int(won)}
            self.db.write([(sql.INSERT_HISTORY, hist)])
            counts["stored" if won else "kept_existing"] += 1
        for s in data.get("specs", []):
            BucketSpec.from_json(s["spec"])  # validate before storing
            params = {**s, "spec_json": json.dumps(s["spec"], sort_keys=True)}
            params.pop("spec")
            self.db.write([(sql.UPSERT_SPEC, params)])
            counts["specs"] += 1
        for q in data.get("queue", []):
            params = {c: q[c] for c in sql.QUEUE_COLUMNS if c != "shapes_json"}
            params["shapes_json"] = json.dumps(q["shapes"])
            self.db.write([(sql.UPSERT_QUEUE, params)])
            counts["queue"] += 1
        self.clear_l1()
        return counts
