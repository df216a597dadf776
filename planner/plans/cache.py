"""The plan cache: tuned plans per (model, device, shape bucket), for offline jobs and the runtime.

Key = (model key, device fingerprint, bucket key):
- model key: `OpGraph.structure_key`, the model without its activation shapes, so one
  model at every shape shares it (planner/ir/graph.py);
- device fingerprint: `planner.hardware.device_fingerprint()`, the physical device kind;
- bucket key: "exact:[8,300,768]" for one input signature, or "bucket:[8,257-512,768]"
  for a shape bucket of `planner.plans.buckets`.
Value = a `planner.plans.plan.Plan` as JSON (never pickle) with its predicted and measured
latency, versions (torch, plan schema, cost model) and timestamps.

Two levels: L1 is an in-process LRU (bounded, with a short time-to-live so plans tuned by
another process show up, and short-lived negative entries so a miss does not hit the
database on every call); L2 is SQL (`planner.plans.cache_sql`: a SQLite file by default, any
SQLAlchemy URL for a fleet).

Lookup order (docs/architecture.md): the exact shape, then its bucket, then the default plan. A
lookup never raises: a broken database is reported once and reads as a miss. Entries
made under another torch or plan schema (or, when the cache pins one, another cost
model) are not trusted: lookups skip them, `prune(stale=True)` removes them, and a
current plan always replaces a stale one.

Misses can be recorded into the tuning queue (`record_miss`): the shapes the next
offline job should tune, with counts that also serve as the shape histogram for learned
buckets (`shape_histogram`, `planner.plans.buckets.learn_edges`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import planner.plans.cache_sql as sql
from planner.errors import CacheError, FusionPlannerError, PlanError
from planner.hardware import device_fingerprint
from planner.plans.buckets import Bucket, BucketSpec, exact_key
from planner.plans.cache_admin import CacheAdmin, check_plan, check_shapes, plan_record
from planner.plans.cache_sql import CacheWarning, ReopeningStore, Store, open_store
from planner.plans.plan import SCHEMA_VERSION, Plan, now_iso, versions

log = logging.getLogger(__name__)

EXACT, BUCKET, DEFAULT = "exact", "bucket", "default"

__all__ = [
    "CacheEntry",
    "CacheWarning",
    "LookupResult",
    "PlanCache",
    "QueueItem",
    "StoreOutcome",
]


# ---- records ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheEntry:
    """One stored plan and the columns it is found and judged by."""

    model_key: str
    device_fp: str
    bucket_key: str  # "exact:[...]" or "bucket:[...]"
    plan: Plan
    predicted_s: float | None
    measured_s: float | None
    torch_version: str
    cost_model: str
    schema_version: int
    label: str
    created_at: str
    updated_at: str

    @property
    def id(self) -> str:
        """A short stable id for people (`fusion-plan cache show <id>`)."""
        return entry_id(self.model_key, self.device_fp, self.bucket_key)

    @property
    def scope(self) -> str:
        return self.bucket_key.split(":", 1)[0]

    def stale_reason(self, torch_version: str, cost_model: str = "") -> str | None:
        """Why this entry is not trusted under `torch_version` / `cost_model`, or None."""
        if self.schema_version != SCHEMA_VERSION:
            return f"plan schema {self.schema_version} (this code: {SCHEMA_VERSION})"
        if self.torch_version != torch_version:
            return f"torch {self.torch_version} (running {torch_version})"
        if cost_model and self.cost_model != cost_model:
            return f"cost model {self.cost_model} (pinned {cost_model})"
        return None


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What a lookup found. `plan` is None on a miss: run the default plan."""

    plan: Plan | None
    source: str  # "exact" | "bucket" | "default"
    bucket: Bucket | None  # the bucket of the looked-up shapes (None: outside every bucket)
    entry: CacheEntry | None = None

    @property
    def hit(self) -> bool:
        return self.plan is not None


@dataclass(frozen=True)
class StoreOutcome:
    stored: bool  # False: the cache already held a better plan for this key (kept)
    entry_id: str
    bucket_key: str


@dataclass(frozen=True)
class QueueItem:
    """A shape the runtime met without a tuned plan: work for the next offline job."""

    model_key: str
    device_fp: str
    shapes: tuple[tuple[int, ...], ...]
    bucket_key: str  # the bucket under the runtime's spec ("" when outside every bucket)
    label: str
    count: int
    status: str  # "pending" | "tuned"
    first_seen: str
    last_seen: str


def entry_id(model_key: str, device_fp: str, bucket_key: str) -> str:
    return hashlib.sha256(f"{model_key}|{device_fp}|{bucket_key}".encode()).hexdigest()[:10]


# ---- the cache --------------------------------------------------------------------------
class PlanCache(CacheAdmin):
    """L1 (in-process LRU) over L2 (SQL). See the module docstring for keys and rules.

    Thread-safe within a process; each process opens its own (connections are per
    process). `cost_model` pins the cost model ("name/version") entries must have been
    made under; empty accepts any. `url`: None for the default SQLite file, a path,
    sqlite:///path or another SQLAlchemy URL. `read_only`: never create, set aside or write
    (commands that only read). `reopen`: open the database on first use and again after a
    failure, never raising here (the runtime's shared caches; planner.plans.cache_sql.ReopeningStore).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        cost_model: str = "",
        l1_size: int = 4096,
        l1_ttl_s: float = 300.0,
        negative_ttl_s: float = 5.0,
        on_corrupt: str = "set_aside",
        read_only: bool = False,
        reopen: bool = False,
        store: Store | None = None,
    ):
        if store is None and reopen:
            store = ReopeningStore(url, on_corrupt=on_corrupt)
        self.db: Store = store or open_store(url, on_corrupt=on_corrupt, read_only=read_only)
        self.cost_model = cost_model
        self.torch_version = versions()["torch"]
        self.l1_size, self.l1_ttl_s, self.negative_ttl_s = l1_size, l1_ttl_s, negative_ttl_s
        self._l1: OrderedDict[tuple[str, str, str], tuple[float, CacheEntry | None]] = OrderedDict()
        self._specs: dict[tuple[str, str], tuple[float, BucketSpec | None]] = {}
        self._exacts: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        # Whole lookups by (model, device, shapes, spec): a repeated shape costs one dict
        # probe. Same bounds and time-to-live as the per-key L1; cleared on every write.
        self._memo: OrderedDict[tuple[Any, ...], tuple[float, LookupResult]] = OrderedDict()
        self._bucket_results: dict[tuple[str, str, str], LookupResult] = {}
        self._lock = threading.Lock()
        self._device_fp: str | None = None
        self._warned: set[str] = set()
        self.stats = {"l1_hits": 0, "l2_reads": 0, "misses": 0, "stale": 0, "errors": 0}

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def writable(self) -> bool:
        """False for a cache opened read-only or on a read-only file or directory."""
        return bool(getattr(self.db, "writable", True))

    @property
    def device_fp(self) -> str:
        """This machine's device fingerprint (computed once)."""
        if self._device_fp is None:
            self._device_fp = device_fingerprint()
        return self._device_fp

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> PlanCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --
    def store_plan(
        self,
        plan: Plan,
        bucket: Bucket,
        *,
        device_fp: str | None = None,
        label: str = "",
        replace: str = "better",
    ) -> StoreOutcome:
        """Store `plan` for every shape of `bucket` (the tuning job's call). Queued shapes
        it covers are marked tuned: those queued under this bucket's key, and those whose
        shapes it holds (the runtime queues a miss under its own default bucket, which
        need not be the one tuned)."""
        return self._store(
            plan, f"{BUCKET}:{bucket.key}", bucket.key, device_fp, label, replace, bucket=bucket
        )

    store = store_plan  # the short name: cache.store(plan, bucket)

    def store_exact(
        self,
        plan: Plan,
        shapes: Sequence[Sequence[int]],
        *,
        device_fp: str | None = None,
        label: str = "",
        replace: str = "better",
    ) -> StoreOutcome:
        """Store `plan` for exactly the input signature `shapes` (checked before buckets)."""
        ek = exact_key(shapes)
        return self._store(plan, f"{EXACT}:{ek}", "", device_fp, label, replace, shape_key=ek)

    def _store(
        self,
        plan: Plan,
        bucket_key: str,
        queue_bucket: str,
        device_fp: str | None,
        label: str,
        replace: str,
        shape_key: str = "",
        bucket: Bucket | None = None,
    ) -> StoreOutcome:
        if replace not in ("better", "always"):
            raise CacheError(f"replace must be 'better' or 'always', got {replace!r}")
        dev = device_fp or plan.device_fingerprint
        if not dev:
            raise CacheError(
                "the plan has no device fingerprint and none was given: plans are cached "
                "per physical device; pass device_fp=planner.hardware.device_fingerprint()"
            )
        if not plan.structure_key:
            raise CacheError("the plan has no structure_key: make it with Plan.from_partition")
        try:
            check_plan(plan)  # a plan that would claim a hit and then not apply is refused
        except FusionPlannerError as e:
            raise CacheError(f"refusing to store an inconsistent plan: {e}") from e
        record = plan_record(plan, bucket_key, label=label)  # the same fields an export has
        row = {
            **{k: v for k, v in record.items() if k != "plan"},
            "device_fp": dev,
            "plan_json": json.dumps(record["plan"], sort_keys=True),
        }
        cur = self._current_params()
        upsert = {**row, **cur, "always": int(replace == "always")}
        hist = {**row, "id": sql.history_id()}
        queue = {"model_key": plan.structure_key, "device_fp": dev}
        if shape_key:
            marks = [(sql.MARK_QUEUE_SHAPE, {**queue, "shape_key": shape_key})]
        else:
            marks = [(sql.MARK_QUEUE_BUCKET, {**queue, "bucket_key": queue_bucket})]
            if bucket is not None:
                marks += self._held_marks(queue, bucket)
        # One transaction: the plan, its history row and the queue marks land together.
        writes = [(sql.UPSERT_PLAN, upsert), (sql.INSERT_HISTORY, hist), *marks]
        won = self.db.write(writes)[0] > 0
        self._forget(plan.structure_key, dev, bucket_key)
        return StoreOutcome(won, entry_id(plan.structure_key, dev, bucket_key), bucket_key)

    def _held_marks(self, queue: dict[str, str], bucket: Bucket) -> list[tuple[str, dict]]:
        """Statements marking tuned the pending shapes of `queue`'s model that `bucket`
        holds; none when the queue cannot be read now (a read does not wait for a server
        that is down, the store's write does: those rows stay pending)."""
        try:
            held = self.tuning_queue(model_key=queue["model_key"], device_fp=queue["device_fp"])
        except CacheError:
            return []
        return [
            (sql.MARK_QUEUE_SHAPE, {**queue, "shape_key": exact_key(q.shapes)})
            for q in held
            if bucket.contains(q.shapes)
        ]

    def set_bucket_spec(
        self, model_key: str, spec: BucketSpec, device_fp: str | None = None
    ) -> None:
        """Record how `model_key` is bucketed, so the runtime buckets shapes the same way."""
        dev = device_fp or self.device_fp
        params = {
            "model_key": model_key,
            "device_fp": dev,
            "spec_json": json.dumps(spec.to_json(), sort_keys=True),
            "updated_at": now_iso(),
        }
        self.db.write([(sql.UPSERT_SPEC, params)])
        with self._lock:
            self._specs.pop((model_key, dev), None)
            self._memo.clear()

    def record_miss(
        self,
        model_key: str,
        shapes: Sequence[Sequence[int]],
        *,
        device_fp: str | None = None,
        bucket: Bucket | None = None,
        label: str = "",
        count: int = 1,
    ) -> None:
        """Queue `shapes` of `model_key` for the next tuning job (count adds up)."""
        now = now_iso()
        shp = [[int(d) for d in s] for s in shapes]
        params = {
            "model_key": model_key,
            "device_fp": device_fp or self.device_fp,
            "shape_key": exact_key(shp),
            "bucket_key": bucket.key if bucket else "",
            "shapes_json": json.dumps(shp),
            "label": label,
            "count": count,
            "status": "pending",
            "first_seen": now,
            "last_seen": now,
        }
        self.db.write([(sql.UPSERT_QUEUE, params)])

    # -- reading --
    def get(self, model_key: str, device_fp: str, bucket_key: str) -> CacheEntry | None:
        """The trusted entry for one key (L1, then L2), or None."""
        k = (model_key, device_fp, bucket_key)
        now = time.monotonic()
        with self._lock:
            item = self._l1.get(k)
            if item is not None and item[0] > now:
                self._l1.move_to_end(k)
                self.stats["l1_hits"] += 1
                return item[1]
        self.stats["l2_reads"] += 1
        params = {"model_key": model_key, "device_fp": device_fp, "bucket_key": bucket_key}
        rows = self.db.execute(sql.SELECT_PLANS_BY_KEYS, params)
        entry = self._trusted(rows[0]) if rows else None
        ttl = self.l1_ttl_s if entry is not None else self.negative_ttl_s
        with self._lock:
            self._l1[k] = (now + ttl, entry)
            self._l1.move_to_end(k)
            while len(self._l1) > self.l1_size:
                self._l1.popitem(last=False)
        return entry

    def bucket_spec(self, model_key: str, device_fp: str | None = None) -> BucketSpec | None:
        """The bucket spec the tuning job recorded for `model_key` on this device, if any."""
        dev = device_fp or self.device_fp
        now = time.monotonic()
        with self._lock:
            item = self._specs.get((model_key, dev))
        if item is not None and item[0] > now:
            return item[1]
        try:
            rows = self.db.execute(sql.SELECT_SPEC, {"model_key": model_key, "device_fp": dev})
        except Exception as e:  # the runtime asks this on its first call: never raise
            self.stats["errors"] += 1
            self._warn_once("spec-read", f"plan cache {self.url} unreadable ({e}); no bucket spec")
            return None  # not remembered: asked again, a cache that came back answers
        spec = None
        if rows:
            try:
                spec = BucketSpec.from_json(json.loads(rows[0]["spec_json"]))
            except (ValueError, TypeError, FusionPlannerError) as e:
                self._warn_once("spec", f"ignoring an unreadable bucket spec for {model_key}: {e}")
        ttl = self.l1_ttl_s if spec is not None else self.negative_ttl_s
        with self._lock:
            self._specs[(model_key, dev)] = (now + ttl, spec)
        return spec

    def _exact_keys(self, model_key: str, dev: str) -> frozenset[str]:
        """The exact-shape keys stored for a model (usually none): a new shape's exact
        probe is then a set lookup, not a query. Cached like the spec."""
        now = time.monotonic()
        with self._lock:
            item = self._exacts.get((model_key, dev))
        if item is not None and item[0] > now:
            return item[1]
        rows = self.db.execute(sql.SELECT_EXACT_KEYS, {"model_key": model_key, "device_fp": dev})
        keys = frozenset(r["bucket_key"] for r in rows)
        with self._lock:
            self._exacts[(model_key, dev)] = (now + self.l1_ttl_s, keys)
        return keys

    def lookup(
        self,
        model_key: str,
        shapes: Sequence[Sequence[int]],
        device_fp: str | None = None,
        *,
        spec: BucketSpec | None = None,
    ) -> LookupResult:
        """Exact shape, then bucket, then default (plan None). Never raises on a bad cache.

        `spec` buckets the shapes; without one, the spec recorded for the model is used.
        """
        dev = device_fp or self.device_fp
        memo_key = (model_key, dev, tuple(map(tuple, shapes)), spec)
        now = time.monotonic()
        with self._lock:
            item = self._memo.get(memo_key)
            if item is not None and item[0] > now:
                self._memo.move_to_end(memo_key)
                self.stats["l1_hits"] += 1
                return item[1]
        result = self._lookup(model_key, shapes, dev, spec)
        ttl = self.l1_ttl_s if result.hit else self.negative_ttl_s
        with self._lock:
            self._memo[memo_key] = (now + ttl, result)
            while len(self._memo) > self.l1_size:
                self._memo.popitem(last=False)
        return result

    def _lookup(
        self,
        model_key: str,
        shapes: Sequence[Sequence[int]],
        dev: str,
        spec: BucketSpec | None,
    ) -> LookupResult:
        bucket: Bucket | None = None
        try:
            exacts = self._exact_keys(model_key, dev)  # usually empty: no key to build
            if exacts and (ek := f"{EXACT}:{exact_key(shapes)}") in exacts:
                entry = self.get(model_key, dev, ek)
                if entry is not None:
                    return LookupResult(entry.plan, EXACT, None, entry)
            spec = spec or self.bucket_spec(model_key, dev)
            bucket = spec.bucket_of(shapes) if spec is not None else None
            if bucket is not None:
                entry = self.get(model_key, dev, f"{BUCKET}:{bucket.key}")
                if entry is not None:
                    return self._bucket_result(model_key, dev, bucket, entry)
        except Exception as e:  # a lookup must never take the model down
            self.stats["errors"] += 1
            self._warn_once(
                "lookup", f"plan cache {self.url} unreadable ({e}); using default plans"
            )
        self.stats["misses"] += 1
        return LookupResult(None, DEFAULT, bucket, None)

    def _bucket_result(
        self, model_key: str, dev: str, bucket: Bucket, entry: CacheEntry
    ) -> LookupResult:
        """One (immutable) result per cached bucket entry, shared by every shape of the
        bucket: remembering a new shape then keeps only its memo key alive. Fewer objects
        kept per lookup means fewer garbage collections landing inside lookups (the
        new-shape tail in benchmarks/lookup_latency.py)."""
        k = (model_key, dev, bucket.key)
        with self._lock:
            got = self._bucket_results.get(k)
            if got is not None and got.entry is entry:
                return got
            if len(self._bucket_results) >= self.l1_size:
                self._bucket_results.clear()
            self._bucket_results[k] = got = LookupResult(entry.plan, BUCKET, bucket, entry)
            return got

    def entries(
        self,
        *,
        model_key: str | None = None,
        device_fp: str | None = None,
        include_stale: bool = True,
    ) -> list[CacheEntry]:
        """Stored entries (for the CLI and reports), sorted by model, device, bucket."""
        where, params = sql.where_clause(model_key=model_key, device_fp=device_fp)
        cols = ", ".join(sql.PLAN_COLUMNS)
        rows = self.db.execute(
            f"SELECT {cols} FROM fp_plans{where} ORDER BY model_key, device_fp, bucket_key",
            params,
        )
        out = [e for r in rows if (e := self._parse(r)) is not None]
        if not include_stale:
            out = [e for e in out if self.stale_reason(e) is None]
        return out

    def history(self, model_key: str, device_fp: str, bucket_key: str) -> list[dict[str, Any]]:
        """Every plan ever offered for one key, oldest first, with whether it won."""
        params = {"model_key": model_key, "device_fp": device_fp, "bucket_key": bucket_key}
        return self.db.execute(
            "SELECT id, plan_id, predicted_s, measured_s, torch_version, cost_model, label, "
            "updated_at, won FROM fp_history WHERE model_key = :model_key AND "
            "device_fp = :device_fp AND bucket_key = :bucket_key ORDER BY id",
            params,
        )

    def tuning_queue(
        self,
        *,
        model_key: str | None = None,
        device_fp: str | None = None,
        status: str | None = "pending",
    ) -> list[QueueItem]:
        """Queued shapes, most frequent first (what the next `fusion-plan tune` reads)."""
        where, params = sql.where_clause(model_key=model_key, device_fp=device_fp, status=status)
        cols = ", ".join(sql.QUEUE_COLUMNS)
        rows = self.db.execute(
            f"SELECT {cols} FROM fp_queue{where} ORDER BY count DESC, shape_key", params
        )
        out = []
        for r in rows:
            try:
                shapes = json.loads(r["shapes_json"])
                check_shapes(shapes)
                out.append(
                    QueueItem(
                        str(r["model_key"]),
                        str(r["device_fp"]),
                        tuple(tuple(int(d) for d in s) for s in shapes),
                        str(r["bucket_key"]),
                        str(r["label"]),
                        int(r["count"]),
                        str(r["status"]),
                        str(r["first_seen"]),
                        str(r["last_seen"]),
                    )
                )
            except (ValueError, TypeError, FusionPlannerError) as e:
                self._warn_once(
                    f"queue:{r.get('shape_key')}",
                    f"ignoring an unreadable tuning-queue row {r.get('shape_key')!r} of "
                    f"{r.get('model_key')}: {e} (drop it with `fusion-plan cache prune --queue`)",
                )
        return out

    def pending_buckets(
        self, model_key: str, spec: BucketSpec, device_fp: str | None = None
    ) -> list[tuple[Bucket, int]]:
        """Buckets of `spec` holding queued (pending) shapes of `model_key`, busiest
        first, with how often their shapes were met: what a tuning job should tune next.
        Queued shapes outside every bucket of `spec` are left out (widen the spec)."""
        found: dict[str, tuple[Bucket, int]] = {}
        for q in self.tuning_queue(model_key=model_key, device_fp=device_fp):
            b = spec.bucket_of(q.shapes)
            if b is not None:
                found[b.key] = (b, found.get(b.key, (b, 0))[1] + q.count)
        return sorted(found.values(), key=lambda bc: (-bc[1], bc[0].key))

    def shape_histogram(
        self, model_key: str, input: int, axis: int, device_fp: str | None = None
    ) -> dict[int, int]:
        """Observed sizes of `shapes[input][axis]` -> count, from the tuning queue (all
        statuses): the histogram `planner.plans.buckets.learn_edges` fits buckets to."""
        hist: dict[int, int] = {}
        for q in self.tuning_queue(model_key=model_key, device_fp=device_fp, status=None):
            if input < len(q.shapes) and axis < len(q.shapes[input]):
                size = q.shapes[input][axis]
                hist[size] = hist.get(size, 0) + q.count
        return hist

    def stale_reason(self, entry: CacheEntry) -> str | None:
        return entry.stale_reason(self.torch_version, self.cost_model)

    def clear_l1(self) -> None:
        with self._lock:
            self._l1.clear()
            self._specs.clear()
            self._exacts.clear()
            self._memo.clear()
            self._bucket_results.clear()

    # -- internals --
    def _current_params(self) -> dict[str, Any]:
        return {
            "cur_torch": self.torch_version,
            "cur_schema": SCHEMA_VERSION,
            "cur_cost_model": self.cost_model,
        }

    def _parse(self, row: Mapping[str, Any]) -> CacheEntry | None:
        """The entry of a row, or None (with a warning, once) when the row is unreadable:
        a broken row is never served, and never takes a listing or a lookup down."""
        try:
            data = json.loads(row["plan_json"])
            if not isinstance(data, dict):
                raise PlanError(f"plan_json holds a JSON {type(data).__name__}, not an object")
            plan = Plan.from_json(data)
            check_plan(plan)
            return CacheEntry(
                row["model_key"],
                row["device_fp"],
                row["bucket_key"],
                plan,
                row["predicted_s"],
                row["measured_s"],
                row["torch_version"],
                row["cost_model"],
                int(row["schema_version"]),
                row["label"],
                row["created_at"],
                row["updated_at"],
            )
        except (ValueError, TypeError, KeyError, AttributeError, FusionPlannerError) as e:
            self._warn_once(
                f"parse:{row.get('model_key')}:{row.get('bucket_key')}",
                f"ignoring an unreadable plan for {row.get('model_key')} "
                f"{row.get('bucket_key')}: {e}",
            )
            return None

    def _trusted(self, row: Mapping[str, Any]) -> CacheEntry | None:
        entry = self._parse(row)
        if entry is None:
            return None
        reason = self.stale_reason(entry)
        if reason is not None:
            self.stats["stale"] += 1
            log.debug("ignoring stale plan %s: made under %s", entry.id, reason)
            return None
        return entry

    def _forget(self, model_key: str, device_fp: str, bucket_key: str) -> None:
        with self._lock:
            self._l1.pop((model_key, device_fp, bucket_key), None)
            self._exacts.pop((model_key, device_fp), None)
            self._memo.clear()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, CacheWarning, stacklevel=3)
            log.warning(message)
