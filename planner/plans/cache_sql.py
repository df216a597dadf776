"""The plan cache's persistent level (L2): one SQL schema, two ways to reach a database.

- `SQLiteStore` (the default): the stdlib `sqlite3` on a file under the user's cache
  directory. Nothing to install or start, and the runtime needs nothing but torch and
  the stdlib. WAL mode (readers never block the writer), a busy timeout, `BEGIN
  IMMEDIATE` for writes (no lock upgrades, so no deadlock between two writers) and a
  retry loop: several tuning processes and readers share one file and lose no plan.
- `SQLAlchemyStore`: any SQLAlchemy URL (postgresql://... for a fleet of tuners sharing
  one cache, as Optuna's RDB storage shares one study). SQLAlchemy is imported only when
  such a URL is given: it is an optional dependency the runtime must not need.

Both run the same SQL text (`ON CONFLICT ... DO UPDATE ... WHERE` is the same in SQLite
>= 3.24 and PostgreSQL), so the rules below are written once. Tables carry an `fp_`
prefix so the cache can share a database with an Optuna study.

Writes are atomic upserts whose WHERE clause keeps the better plan (`_BETTER`), and every
offered plan is also appended to `fp_history`: two processes storing plans for one key
at once both succeed, the better plan wins, and neither record is lost.

A file that is not SQLite, is damaged, or belongs to another application is never
overwritten: it is renamed aside (`plans.sqlite.corrupt-<time>`) with a warning saying
so, and a fresh cache is created in its place. A store opened `read_only` (and one whose
file or directory cannot be written) never creates, renames or writes anything: it reads
(as an immutable file where SQLite cannot make its WAL index) and refuses writes with a
CacheError.

Every database error leaves a store as a CacheError. `ReopeningStore` opens its store on
first use and again after a failure: what the runtime reads through, so a database that
is down at start is used once it is back.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import sqlite3
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from planner.errors import CacheError
from planner.hardware import cache_dir

log = logging.getLogger(__name__)

APP_NAME = "fusion-planner-plan-cache"
CACHE_SCHEMA = 1
# SQLite header field `application_id` ("FPLC"): marks the file as ours without a query.
APPLICATION_ID = 0x46504C43
SQLITE_MAGIC = b"SQLite format 3\x00"

PLAN_COLUMNS = (
    "model_key",
    "device_fp",
    "bucket_key",
    "plan_json",
    "plan_id",
    "predicted_s",
    "measured_s",
    "torch_version",
    "cost_model",
    "schema_version",
    "label",
    "created_at",
    "updated_at",
)
QUEUE_COLUMNS = (
    "model_key",
    "device_fp",
    "shape_key",
    "bucket_key",
    "shapes_json",
    "label",
    "count",
    "status",
    "first_seen",
    "last_seen",
)

DDL = (
    "CREATE TABLE IF NOT EXISTS fp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS fp_plans (
        model_key TEXT NOT NULL, device_fp TEXT NOT NULL, bucket_key TEXT NOT NULL,
        plan_json TEXT NOT NULL, plan_id TEXT NOT NULL,
        predicted_s DOUBLE PRECISION, measured_s DOUBLE PRECISION,
        torch_version TEXT NOT NULL, cost_model TEXT NOT NULL, schema_version INTEGER NOT NULL,
        label TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        PRIMARY KEY (model_key, device_fp, bucket_key))""",
    """CREATE TABLE IF NOT EXISTS fp_history (
        id TEXT PRIMARY KEY, model_key TEXT NOT NULL, device_fp TEXT NOT NULL,
        bucket_key TEXT NOT NULL, plan_json TEXT NOT NULL, plan_id TEXT NOT NULL,
        predicted_s DOUBLE PRECISION, measured_s DOUBLE PRECISION,
        torch_version TEXT NOT NULL, cost_model TEXT NOT NULL, schema_version INTEGER NOT NULL,
        label TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        won INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS fp_specs (
        model_key TEXT NOT NULL, device_fp TEXT NOT NULL, spec_json TEXT NOT NULL,
        updated_at TEXT NOT NULL, PRIMARY KEY (model_key, device_fp))""",
    """CREATE TABLE IF NOT EXISTS fp_queue (
        model_key TEXT NOT NULL, device_fp TEXT NOT NULL, shape_key TEXT NOT NULL,
        bucket_key TEXT NOT NULL, shapes_json TEXT NOT NULL, label TEXT NOT NULL,
        count INTEGER NOT NULL, status TEXT NOT NULL,
        first_seen TEXT NOT NULL, last_seen TEXT NOT NULL,
        PRIMARY KEY (model_key, device_fp, shape_key))""",
)

# A row is "current" when made under the reader's torch and plan schema and, when the
# cache pins a cost model, under that cost model too.
_CURRENT = (
    "({t}.torch_version = :cur_torch AND {t}.schema_version = :cur_schema "
    "AND (:cur_cost_model = '' OR {t}.cost_model = :cur_cost_model))"
)
# The better of two plans for one key: a current plan beats a stale one; then a measured
# plan beats an unmeasured one; then the lower measured (else predicted) latency wins.
_BETTER = f"""(
    (:always = 1)
    OR ({_CURRENT.format(t="excluded")} AND NOT {_CURRENT.format(t="fp_plans")})
    OR (({_CURRENT.format(t="excluded")}) = ({_CURRENT.format(t="fp_plans")}) AND (
        (excluded.measured_s IS NOT NULL AND fp_plans.measured_s IS NULL)
        OR (excluded.measured_s IS NOT NULL AND excluded.measured_s < fp_plans.measured_s)
        OR (excluded.measured_s IS NULL AND fp_plans.measured_s IS NULL
            AND excluded.predicted_s < fp_plans.predicted_s)))
)"""

UPSERT_PLAN = f"""
INSERT INTO fp_plans ({", ".join(PLAN_COLUMNS)})
VALUES ({", ".join(":" + c for c in PLAN_COLUMNS)})
ON CONFLICT (model_key, device_fp, bucket_key) DO UPDATE SET
    {", ".join(f"{c} = excluded.{c}" for c in PLAN_COLUMNS[3:] if c != "created_at")}
WHERE {_BETTER}
"""
# Run in the transaction of UPSERT_PLAN, right after it: `won` is whether the stored row
# is now this offer, so the plan and its history row are written together or not at all.
INSERT_HISTORY = f"""
INSERT INTO fp_history (id, {", ".join(PLAN_COLUMNS)}, won)
VALUES (:id, {", ".join(":" + c for c in PLAN_COLUMNS)}, (
    SELECT CASE WHEN EXISTS (
        SELECT 1 FROM fp_plans WHERE model_key = :model_key AND device_fp = :device_fp
        AND bucket_key = :bucket_key AND plan_json = :plan_json AND updated_at = :updated_at
    ) THEN 1 ELSE 0 END))
"""
# A plan for a bucket (or an exact shape) answers the queued shapes it covers.
MARK_QUEUE_BUCKET = """
UPDATE fp_queue SET status = 'tuned'
WHERE model_key = :model_key AND device_fp = :device_fp AND bucket_key = :bucket_key
"""
MARK_QUEUE_SHAPE = """
UPDATE fp_queue SET status = 'tuned'
WHERE model_key = :model_key AND device_fp = :device_fp AND shape_key = :shape_key
"""
UPSERT_QUEUE = f"""
INSERT INTO fp_queue ({", ".join(QUEUE_COLUMNS)})
VALUES ({", ".join(":" + c for c in QUEUE_COLUMNS)})
ON CONFLICT (model_key, device_fp, shape_key) DO UPDATE SET
    count = fp_queue.count + excluded.count,
    last_seen = excluded.last_seen,
    bucket_key = excluded.bucket_key,
    status = CASE WHEN fp_queue.status = 'tuned' AND excluded.status = 'pending'
                  THEN 'pending' ELSE fp_queue.status END
"""
UPSERT_SPEC = """
INSERT INTO fp_specs (model_key, device_fp, spec_json, updated_at)
VALUES (:model_key, :device_fp, :spec_json, :updated_at)
ON CONFLICT (model_key, device_fp) DO UPDATE SET
    spec_json = excluded.spec_json, updated_at = excluded.updated_at
"""
SELECT_PLANS_BY_KEYS = f"""
SELECT {", ".join(PLAN_COLUMNS)} FROM fp_plans
WHERE model_key = :model_key AND device_fp = :device_fp AND bucket_key = :bucket_key
"""
SELECT_EXACT_KEYS = """
SELECT bucket_key FROM fp_plans
WHERE model_key = :model_key AND device_fp = :device_fp AND bucket_key LIKE 'exact:%'
"""
SELECT_SPEC = """
SELECT spec_json FROM fp_specs WHERE model_key = :model_key AND device_fp = :device_fp
"""
STALE_WHERE = f"NOT {_CURRENT.format(t='fp_plans')}"


class Store(Protocol):
    """What the plan cache needs from a database.

    `execute` runs one statement outside any explicit transaction (reads) and returns
    its rows as dicts; `write` runs several statements in one transaction, retrying when
    the database is busy, and returns each statement's rowcount. Implementations are
    safe to share between threads of one process; each process opens its own.
    """

    url: str

    def execute(
        self, sql: str, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]: ...

    def write(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]: ...

    def close(self) -> None: ...


def open_store(
    url: str | os.PathLike[str] | None,
    *,
    on_corrupt: str = "set_aside",
    read_only: bool = False,
) -> Store:
    """A store for `url`: None -> the default SQLite file, a path or sqlite:///path ->
    stdlib SQLite, any other SQLAlchemy URL (postgresql://...) -> SQLAlchemy.

    `read_only`: never create, set aside or write anything (for commands that only read;
    a missing file reads as an empty cache)."""
    if url is None:
        return SQLiteStore(default_path(), on_corrupt=on_corrupt, read_only=read_only)
    text = os.fspath(url)
    if text.startswith("sqlite:///"):
        path = Path(text.removeprefix("sqlite:///"))
        return SQLiteStore(path, on_corrupt=on_corrupt, read_only=read_only)
    if "://" in text:
        return SQLAlchemyStore(text)
    if text.startswith("sqlite:"):
        raise CacheError(
            f"plan cache URL {text!r} does not parse: a SQLite URL has three slashes before "
            "its path (sqlite:///relative/path or sqlite:////absolute/path), or give the path"
        )
    return SQLiteStore(Path(text), on_corrupt=on_corrupt, read_only=read_only)


def default_path() -> Path:
    """The default plan cache: plans.sqlite in the user's fusion-planner cache directory."""
    return cache_dir() / "plans.sqlite"


# ---- retries ---------------------------------------------------------------------------
def _retry(fn: Any, is_busy: Any, attempts: int = 40) -> Any:
    """Run `fn` again while the database reports itself busy (jittered backoff, ~30 s)."""
    delay = 0.002
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:
            if attempt + 1 == attempts or not is_busy(e):
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


# ---- SQLite (stdlib) -------------------------------------------------------------------
class SQLiteStore:
    """The default store: a SQLite file opened with the stdlib `sqlite3` module."""

    def __init__(
        self,
        path: Path,
        *,
        on_corrupt: str = "set_aside",
        busy_timeout_s: float = 30,
        read_only: bool = False,
    ):
        if on_corrupt not in ("set_aside", "raise"):
            raise CacheError(f"on_corrupt must be 'set_aside' or 'raise', got {on_corrupt!r}")
        self.path = Path(path).expanduser()
        self.url = f"sqlite:///{self.path}"
        self.on_corrupt = on_corrupt
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only  # asked for: never create, set aside or write
        self.read_only_reason = "opened read-only" if read_only else ""
        self.set_aside: Path | None = None  # where a bad file went, if one did
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._empty = False  # read-only over a missing or empty file: every read is empty
        self._pid = -1
        self._connect()

    @property
    def writable(self) -> bool:
        return not self.read_only_reason

    # -- opening, checking, setting aside --
    def _connect(self, tries: int = 3) -> None:
        if self.path.is_dir():
            raise CacheError(
                f"plan cache {self.path} is a directory: pass a file path, e.g. "
                f"{self.path / 'plans.sqlite'}"
            )
        if self.read_only or (why := _not_writable(self.path)):
            if not self.read_only:
                self.read_only_reason = why
                log.info("plan cache %s is read-only (%s): reading only", self.path, why)
            return self._connect_read_only()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            problem = inspect_sqlite_file(self.path)
            if problem is not None:
                self._set_aside(problem)
            conn = sqlite3.connect(
                str(self.path),
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.OperationalError) as e:
            raise CacheError(
                f"cannot open plan cache {self.path}: {e}; pass a writable --cache path"
            ) from e
        conn.row_factory = sqlite3.Row
        try:
            _retry(lambda: self._init_schema(conn), _sqlite_busy)
        except sqlite3.OperationalError as e:  # locked, read-only, no such directory ...
            conn.close()  # ... problems of access, not of the file: never set it aside
            raise CacheError(f"cannot open plan cache {self.path}: {e}") from e
        except sqlite3.DatabaseError as e:
            conn.close()
            if tries <= 1:
                raise CacheError(f"plan cache {self.path} cannot be opened: {e}") from e
            self._set_aside(str(e) if str(e).startswith("foreign") else f"corrupt ({e})")
            return self._connect(tries - 1)
        self._conn, self._pid = conn, os.getpid()

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable at checkpoints
        if conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            return _check_meta(conn, str(self.path))
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in DDL:
                conn.execute(stmt)
            conn.execute(
                "INSERT INTO fp_meta (key, value) VALUES ('app', ?), ('schema', ?) "
                "ON CONFLICT (key) DO NOTHING",
                (APP_NAME, str(CACHE_SCHEMA)),
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        _check_meta(conn, str(self.path))

    def _connect_read_only(self) -> None:
        """Open without writing anything: no WAL switch, no schema, no file set aside. A
        directory where SQLite cannot create the WAL index (`-shm`) is read as immutable."""
        self._pid = os.getpid()
        try:
            empty = self.path.stat().st_size == 0
        except FileNotFoundError:
            empty = True
        except OSError as e:
            raise CacheError(f"cannot read plan cache {self.path}: {e}") from e
        if empty:
            self._empty = True
            return
        try:
            problem = inspect_sqlite_file(self.path)
        except OSError as e:
            raise CacheError(f"cannot read plan cache {self.path}: {e}") from e
        if problem is not None:
            raise CacheError(
                f"plan cache {self.path} is {problem}; expected a fusion-planner plan cache "
                f"(schema {CACHE_SCHEMA}). It was left as it is: pass another --cache"
            )
        uri = self.path.resolve().as_uri()
        last: Exception | None = None
        for query in ("mode=ro", "mode=ro&immutable=1"):
            conn = None
            try:
                conn = sqlite3.connect(
                    f"{uri}?{query}",
                    uri=True,
                    timeout=self.busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.row_factory = sqlite3.Row
                _check_meta(conn, str(self.path))
            except sqlite3.OperationalError as e:
                last = e
                if conn is not None:
                    conn.close()
                continue
            except sqlite3.DatabaseError as e:
                if conn is not None:
                    conn.close()
                raise CacheError(
                    f"plan cache {self.path} cannot be read ({e}); it was left as it is"
                ) from e
            self._conn = conn
            return
        raise CacheError(f"cannot read plan cache {self.path}: {last}")

    def _set_aside(self, problem: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        kind = "foreign" if problem.startswith("foreign") else "corrupt"
        target = self.path.with_name(f"{self.path.name}.{kind}-{stamp}-{os.getpid()}")
        msg = (
            f"plan cache {self.path} is {problem}; expected a fusion-planner plan cache "
            f"(schema {CACHE_SCHEMA})"
        )
        if self.on_corrupt == "raise":
            raise CacheError(msg + ": move it away or pass another --cache")
        try:
            os.replace(self.path, target)
        except FileNotFoundError:
            return  # another process set it aside first
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            with contextlib.suppress(FileNotFoundError):
                os.replace(side, Path(str(target) + suffix))
        self.set_aside = target
        warnings.warn(
            f"{msg}. It was set aside as {target}; a new cache starts empty.",
            CacheWarning,
            stacklevel=4,
        )
        log.warning("%s; set aside as %s", msg, target)

    def _connection(self) -> sqlite3.Connection | None:
        if self._pid != os.getpid():  # after fork: a connection of our own
            self._conn, self._empty = None, False
            self._connect()
        if self._conn is None and not self._empty:
            self._connect()
        return self._conn

    # -- Store protocol --
    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            conn = self._connection()
            if conn is None:
                return []  # read-only over a missing file: an empty cache
            try:
                rows = _retry(
                    lambda: conn.execute(sql, dict(params or {})).fetchall(), _sqlite_busy
                )
            except sqlite3.Error as e:
                raise CacheError(f"cannot read plan cache {self.path}: {e}") from e
        return [dict(r) for r in rows]

    def write(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
        if not self.writable:
            raise CacheError(
                f"plan cache {self.path} is read-only ({self.read_only_reason}): nothing was "
                "written; pass a writable --cache"
            )

        def once() -> list[int]:
            conn = self._connection()
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            try:
                counts = [conn.execute(sql, dict(p)).rowcount for sql, p in statements]
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return counts

        with self._lock:
            try:
                return _retry(once, _sqlite_busy)
            except sqlite3.Error as e:
                if "readonly" in str(e).lower():
                    self.read_only_reason = str(e)
                raise CacheError(
                    f"cannot write plan cache {self.path}: {e}; nothing of this write was "
                    "stored (pass a writable --cache)"
                ) from e

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _not_writable(path: Path) -> str:
    """Why SQLite could not write `path` (and its `-wal`/`-shm` beside it), or ""."""
    if path.exists():
        if not os.access(path, os.W_OK):
            return "the file is not writable"
        if not os.access(path.parent, os.W_OK):
            return "its directory is not writable"
        return ""
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    return "" if os.access(anc, os.W_OK) else f"{anc} is not writable"


class CacheWarning(UserWarning):
    """The plan cache set a file aside or ignored entries; the program goes on."""


def _sqlite_busy(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def _check_meta(conn: sqlite3.Connection, where: str) -> None:
    rows = dict(conn.execute("SELECT key, value FROM fp_meta").fetchall())
    if rows.get("app") != APP_NAME or rows.get("schema") != str(CACHE_SCHEMA):
        raise sqlite3.DatabaseError(
            f"foreign (app {rows.get('app')!r}, plan-cache schema {rows.get('schema')!r} in "
            f"{where}; this code reads {CACHE_SCHEMA})"
        )


def inspect_sqlite_file(path: Path) -> str | None:
    """None when `path` is absent, empty, or a healthy plan cache of this schema; else a
    short description of what is wrong ("corrupt (...)", "foreign (...)")."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None  # just created (in WAL mode the content may still be in -wal)
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        return "corrupt (not a SQLite database: the header is wrong)"
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return None  # cannot even open it read-only: connect reports why
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id not in (0, APPLICATION_ID):
            return f"foreign (SQLite application_id {app_id:#x}, not a plan cache)"
        if app_id == 0 and tables and "fp_meta" not in tables:
            shown = ", ".join(sorted(tables)[:5])
            return f"foreign (a SQLite database of another program: tables {shown})"
        if "fp_meta" in tables:
            meta = dict(conn.execute("SELECT key, value FROM fp_meta").fetchall())
            if meta.get("app") != APP_NAME:
                return f"foreign (app {meta.get('app')!r})"
            if meta.get("schema") != str(CACHE_SCHEMA):
                return f"foreign (plan-cache schema {meta.get('schema')}, this code reads {CACHE_SCHEMA})"
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            return f"corrupt (quick_check: {check})"
    except sqlite3.OperationalError:
        return None  # locked, unreadable...: a problem of access, for connect to report
    except sqlite3.DatabaseError as e:
        return f"corrupt ({e})"
    finally:
        conn.close()
    return None


# ---- SQLAlchemy (PostgreSQL and friends) ----------------------------------------------
class SQLAlchemyStore:
    """A store on any SQLAlchemy URL whose dialect speaks `INSERT ... ON CONFLICT`
    (PostgreSQL, SQLite). The schema is created on first use; a database holding another
    schema version of the plan cache is refused with a CacheError (a server database is
    not ours to rename).

    Every database error comes out as a CacheError naming the URL (password hidden). A
    write that loses its server (a restart, a failover) is tried again for up to
    `reconnect_s`: a tuning job outlives a short outage without losing its plan. Reads are
    not retried: the runtime would rather run its default plan than wait."""

    DIALECTS = ("postgresql", "sqlite")
    CONNECT_TIMEOUT_S = 5  # PostgreSQL: a server that does not answer is down, not slow

    def __init__(self, url: str, *, reconnect_s: float = 30.0):
        try:
            # Optional dependency, imported only when a database URL is given: the runtime and
            # the GPU machine have no SQLAlchemy, and the default SQLite path needs none.
            import sqlalchemy as sa
        except ImportError as e:
            raise CacheError(
                f"plan cache URL {url!r} needs SQLAlchemy (and its database driver), which "
                "is not installed: pip install 'fusion-planner[fleet]' (sqlalchemy, "
                "psycopg), or use a SQLite path"
            ) from e
        self._sa = sa
        self.url = hide_password(url)  # for messages and listings; the engine has the rest
        self.reconnect_s = reconnect_s
        try:
            parsed = sa.engine.make_url(url)
            backend = parsed.get_backend_name()
        except Exception as e:
            raise CacheError(f"plan cache URL {url!r} does not parse: {e}") from e
        self.safe_url = parsed.render_as_string(hide_password=True)
        if backend not in self.DIALECTS:
            raise CacheError(
                f"plan cache URL {self.safe_url!r} uses {backend}; supported: "
                f"{', '.join(self.DIALECTS)}"
            )
        connect_args: dict[str, Any] = {}
        if backend == "postgresql" and "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = self.CONNECT_TIMEOUT_S
        try:
            self._engine = sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        except Exception as e:  # a missing driver: one clear error
            raise CacheError(
                f"cannot open plan cache {self.safe_url!r}: {type(e).__name__}: {e} (install "
                "the database driver, e.g. pip install 'psycopg[binary]' for postgresql://)"
            ) from e
        if self._engine.dialect.name == "sqlite":
            sa.event.listen(self._engine, "connect", _sqlite_pragmas)
        try:
            self._write([(stmt, {}) for stmt in DDL], reconnect=False, what="opening")
            self._write(
                [
                    (
                        "INSERT INTO fp_meta (key, value) VALUES ('app', :app), "
                        "('schema', :schema) ON CONFLICT (key) DO NOTHING",
                        {"app": APP_NAME, "schema": str(CACHE_SCHEMA)},
                    )
                ],
                reconnect=False,
                what="opening",
            )
            meta = {r["key"]: r["value"] for r in self.execute("SELECT key, value FROM fp_meta")}
        except BaseException:
            self._engine.dispose()
            raise
        if meta.get("app") != APP_NAME or meta.get("schema") != str(CACHE_SCHEMA):
            self._engine.dispose()
            raise CacheError(
                f"database {self.safe_url!r} holds fp_ tables of app={meta.get('app')!r} "
                f"schema={meta.get('schema')!r}, expected {APP_NAME} schema {CACHE_SCHEMA}: "
                "point --cache at another database"
            )

    writable = True

    def _busy(self, e: BaseException) -> bool:
        text = str(e).lower()
        return isinstance(e, self._sa.exc.OperationalError | self._sa.exc.IntegrityError) and (
            "locked" in text
            or "busy" in text
            or "deadlock" in text
            or "could not serialize" in text
            or "duplicate key" in text
        )

    def _lost(self, e: BaseException) -> bool:
        """The server went away (refused, closed, shutting down): worth reconnecting."""
        sa = self._sa
        return isinstance(e, sa.exc.DBAPIError) and (
            e.connection_invalidated
            or isinstance(e, sa.exc.OperationalError | sa.exc.InterfaceError)
        )

    def _error(self, what: str, e: BaseException) -> CacheError:
        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        return CacheError(
            f"plan cache {self.safe_url}: {what} failed: {type(e).__name__}: "
            f"{first[0] if first else ''}"
        )

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        def once() -> list[dict[str, Any]]:
            with self._engine.connect() as conn:
                res = conn.execute(self._sa.text(sql), dict(params or {}))
                return [dict(r._mapping) for r in res] if res.returns_rows else []

        try:
            return _retry(once, self._busy)
        except self._sa.exc.SQLAlchemyError as e:
            raise self._error("read", e) from e

    def write(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
        return self._write(statements, reconnect=True)

    def _write(
        self,
        statements: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        reconnect: bool,
        what: str = "write",
    ) -> list[int]:
        def once() -> list[int]:
            with self._engine.begin() as conn:
                return [conn.execute(self._sa.text(sql), dict(p)).rowcount for sql, p in statements]

        deadline = time.monotonic() + (self.reconnect_s if reconnect else 0.0)
        while True:
            try:
                return _retry(once, self._busy)
            except self._sa.exc.SQLAlchemyError as e:
                if self._lost(e) and time.monotonic() < deadline:
                    log.warning("plan cache %s unreachable (%s); retrying", self.safe_url, e)
                    time.sleep(0.5)
                    continue
                raise self._error(what, e) from e

    def close(self) -> None:
        self._engine.dispose()


class ReopeningStore:
    """A store opened on first use, and opened again after a failure (at most once per
    `retry_s`): what the runtime reads through, so a cache that is down when the model
    starts (a database server not up yet, a file being replaced) is used once it is back.
    A read that fails on an open store likewise holds reads off for `retry_s`. Meanwhile
    every call raises CacheError at once (no connection attempt, no connect timeout),
    which a lookup reads as a miss."""

    def __init__(
        self,
        url: str | os.PathLike[str] | None,
        *,
        on_corrupt: str = "set_aside",
        retry_s: float = 5.0,
    ):
        self._arg = url
        self.url = f"sqlite:///{default_path()}" if url is None else hide_password(os.fspath(url))
        self.on_corrupt = on_corrupt
        self.retry_s = retry_s
        self._store: Store | None = None
        self._failed_at = -math.inf
        self._error: CacheError | None = None
        self._lock = threading.Lock()

    def _get(self) -> Store:
        with self._lock:
            if time.monotonic() - self._failed_at < self.retry_s and self._error is not None:
                raise self._error  # fail fast: no connection attempt per lookup while down
            if self._store is not None:
                return self._store
            try:
                self._store = open_store(self._arg, on_corrupt=self.on_corrupt)
            except CacheError as e:
                self._failed_at, self._error = time.monotonic(), e
                raise
            self.url = self._store.url
            return self._store

    @property
    def writable(self) -> bool:
        try:
            return bool(getattr(self._get(), "writable", True))
        except CacheError:
            return False

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        store = self._get()
        try:
            return store.execute(sql, params)
        except CacheError as e:  # unreadable now: reads fail fast until retry_s has passed
            with self._lock:
                self._failed_at, self._error = time.monotonic(), e
            raise

    def write(self, statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
        return self._get().write(statements)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
            self._store = None


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout = 30000")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.close()


def hide_password(url: str) -> str:
    """`url` with the password of its user part shown as ***."""
    return re.sub(r"^([a-z0-9+.-]+://[^:/@]+):[^@]*@", r"\1:***@", url, flags=re.IGNORECASE)


def where_clause(**kw: str | None) -> tuple[str, dict[str, Any]]:
    """A WHERE clause (with its leading space) and params for the non-None filters."""
    given = {k: v for k, v in kw.items() if v is not None}
    if not given:
        return "", {}
    return " WHERE " + " AND ".join(f"{k} = :{k}" for k in given), dict(given)


def history_id() -> str:
    """A history row id: sortable by time of writing, then unique (lists read oldest first)."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"
