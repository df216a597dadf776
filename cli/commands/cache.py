"""`fusion-plan cache ls|show|queue|lookup|export|import|prune`: look after the plan cache.

The cache is the default SQLite file under the user's cache directory unless `--cache`
names another (a path, sqlite:///path, or a SQLAlchemy URL such as postgresql://...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cli import fmt
from cli.common import Resolved, capture_for_planning, resolve
from planner.errors import CacheError
from planner.hardware import device_fingerprint
from planner.plans.cache import CacheEntry, PlanCache
from zoo import modelspec

# Actions that only read: they open the cache read-only, so they never create a file,
# set one aside or write to it (`cache ls --cache notes.txt` leaves notes.txt alone).
READ_ONLY = ("ls", "show", "queue", "lookup", "export")


def run(args: argparse.Namespace) -> int:
    read_only = args.action in READ_ONLY or (args.action == "prune" and args.dry_run)
    with PlanCache(args.cache, read_only=read_only) as cache:
        return ACTIONS[args.action](cache, args)


# ---- actions ----------------------------------------------------------------------------
def _ls(cache: PlanCache, args: argparse.Namespace) -> int:
    entries = cache.entries(model_key=args.model, device_fp=args.device_fp)
    rows = [_row(cache, e) for e in entries]
    if args.current:
        rows = [r for r in rows if r["status"] == "ok"]
    if args.format == "json":
        return _json({"cache": cache.url, "entries": rows})
    print(f"plan cache {cache.url}: {len(rows)} entries")
    if rows:
        print(
            f"{'id':<10} {'model':<28} {'device':<18} {'bucket':<18} {'strategy':<10} "
            f"{'groups':>6} {'predicted':>10} {'measured':>10} {'torch':<8} status"
        )
    specs: dict[tuple[str, str], Any] = {}
    for r in rows:
        key = (r["model_key"], r["device_fp"])
        if key not in specs:
            specs[key] = cache.bucket_spec(*key)
        dims = specs[key].dims if specs[key] is not None else None
        print(
            f"{r['id']:<10} {_model(r):<28} {r['device_fp']:<18} "
            f"{fmt.bucket(r['bucket_key'], dims):<18} {r['strategy'][:10]:<10} {r['groups']:>6} "
            f"{fmt.time_s(r['predicted_s']):>10} {fmt.time_s(r['measured_s']):>10} "
            f"{r['torch_version']:<8} {r['status']}"
        )
    return 0


def _model(row: dict[str, Any], width: int = 28) -> str:
    """The model's label as stored by tune (e.g. zoo:mlp[B=64,...]), else its key."""
    text = row.get("label") or row["model_key"]
    return text if len(text) <= width else text[: width - 3] + "..."


def _show(cache: PlanCache, args: argparse.Namespace) -> int:
    matches = [e for e in cache.entries() if e.id.startswith(args.id)]
    if len(matches) != 1:
        raise CacheError(
            f"{'no' if not matches else len(matches)} entries match id {args.id!r}: "
            "run `fusion-plan cache ls` and give a longer prefix"
        )
    e = matches[0]
    history = cache.history(e.model_key, e.device_fp, e.bucket_key)
    if args.format == "json":
        names = _op_names(e)
        ops = [[names[n] for n in g.nodes] for g in e.plan.groups] if names else None
        return _json(
            {**_row(cache, e), "plan": e.plan.to_json(), "group_ops": ops, "history": history}
        )
    r = _row(cache, e)
    for k in ("id", "label", "model_key", "device_fp", "bucket_key", "strategy", "cost_model"):
        print(f"{k:<12} {r[k] or '-'}")
    print(f"{'status':<12} {r['status']}")
    print(
        f"{'latency':<12} predicted {fmt.time_s(e.predicted_s)}, measured "
        f"{fmt.time_s(e.measured_s)}, eager {fmt.time_s(e.plan.eager_s)}"
        + (
            ""
            if e.plan.measured_synced_s is None
            else f"; one call waited for {fmt.time_s(e.plan.measured_synced_s)}"
        )
    )
    print(f"{'made':<12} {e.created_at} (torch {e.torch_version}); updated {e.updated_at}")
    names = _op_names(e)
    where = "" if names else " (node indices: the model could not be rebuilt from its label)"
    print(f"groups ({e.plan.n_groups}){where}:")
    for i, g in enumerate(e.plan.groups):
        ops = ", ".join(names[n] for n in g.nodes) if names else str(list(g.nodes))
        print(f"  {i:>3} {g.realization:<12} {ops}")
    print(f"history ({len(history)} offers):")
    for h in history:
        won = "kept" if h["won"] else "lost"
        print(
            f"  {h['updated_at']} {won:<5} predicted {fmt.time_s(h['predicted_s'])}, "
            f"measured {fmt.time_s(h['measured_s'])}, {h['cost_model']}"
        )
    return 0


def _queue(cache: PlanCache, args: argparse.Namespace) -> int:
    items = cache.tuning_queue(model_key=args.model, status=None if args.all else "pending")
    if args.format == "json":
        return _json({"cache": cache.url, "queue": [i.__dict__ for i in items]})
    print(f"tuning queue of {cache.url}: {len(items)} shapes")
    for i in items:
        shapes = ";".join("x".join(map(str, s)) for s in i.shapes)
        print(
            f"  {i.model_key:<16} {i.device_fp:<18} {shapes:<20} seen {i.count:>5}x "
            f"bucket {i.bucket_key or '-':<20} {i.status}"
        )
    return 0


def _lookup(cache: PlanCache, args: argparse.Namespace) -> int:
    r = resolve(args)
    graph = capture_for_planning(r).graph
    dev = args.device_fp or device_fingerprint()
    result = cache.lookup(graph.structure_key, graph.input_shapes, dev)
    bucket = result.bucket.key if result.bucket is not None else None
    payload = {
        "model": r.spec.label,
        "model_key": graph.structure_key,
        "device_fp": dev,
        "shapes": [list(s) for s in graph.input_shapes],
        "source": result.source,
        "bucket": bucket,
        "entry_id": result.entry.id if result.entry else None,
        "plan": result.plan.to_json() if result.plan else None,
    }
    if args.format == "json":
        return _json(payload)
    print(f"{r.spec.label} ({r.dtype_name}) model key {graph.structure_key} on {dev}")
    stored_spec = cache.bucket_spec(graph.structure_key, dev)
    shown = fmt.bucket(bucket, stored_spec.dims if stored_spec else None) if bucket else None
    if result.plan is None:
        if bucket:
            where = f"bucket {shown}"
        elif stored_spec is None:
            where = "no plans stored for this model key on this device"
        else:
            where = "no bucket: the shape is outside the stored spec"
        print(f"miss -> default plan ({where}); the runtime would queue this shape for tuning")
        return 0
    p = result.plan
    print(
        f"hit ({result.source}{' ' + shown if shown and result.source == 'bucket' else ''}): "
        f"entry {result.entry.id if result.entry else '?'}, {p.strategy} plan with {p.n_groups} "
        f"groups, predicted {fmt.time_s(p.predicted_s)}, measured {fmt.time_s(p.measured_s)} "
        f"(eager {fmt.time_s(p.eager_s)})"
    )
    return 0


def _export(cache: PlanCache, args: argparse.Namespace) -> int:
    doc = cache.export_records()
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.file).write_text(text)
        except OSError as e:
            raise CacheError(f"cannot write export file {args.file}: {e}") from e
        print(
            f"exported {len(doc['plans'])} plans, {len(doc['specs'])} bucket specs, "
            f"{len(doc['queue'])} queued shapes to {args.file}",
            file=sys.stderr,
        )
    return 0


def _import(cache: PlanCache, args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        doc = json.loads(text)
    except (OSError, ValueError) as e:
        raise CacheError(f"cannot read export file {args.file}: {e}") from e
    if not isinstance(doc, dict):
        raise CacheError(f"{args.file} is not a plan-cache export (expected a JSON object)")
    counts = cache.import_records(doc)
    if args.format == "json":
        return _json(counts)
    print(
        f"imported into {cache.url}: {counts['stored']} plans stored, "
        f"{counts['kept_existing']} kept the better existing plan, {counts['rejected']} "
        f"rejected; {counts['specs']} bucket specs, {counts['queue']} queued shapes"
    )
    return 0


def _prune(cache: PlanCache, args: argparse.Namespace) -> int:
    counts = cache.prune(
        stale=args.stale,
        older_than_s=args.older_than * 86400 if args.older_than is not None else None,
        model_key=args.model,
        device_fp=args.device_fp,
        queue=args.queue,
        history=args.history,
        dry_run=args.dry_run,
    )
    if args.format == "json":
        return _json({"dry_run": args.dry_run, "deleted": counts})
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb}: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
    return 0


ACTIONS = {
    "ls": _ls,
    "show": _show,
    "queue": _queue,
    "lookup": _lookup,
    "export": _export,
    "import": _import,
    "prune": _prune,
}


# ---- helpers ----------------------------------------------------------------------------
def _row(cache: PlanCache, e: CacheEntry) -> dict[str, Any]:
    return {
        "id": e.id,
        "model_key": e.model_key,
        "device_fp": e.device_fp,
        "bucket_key": e.bucket_key,
        "strategy": e.plan.strategy,
        "groups": e.plan.n_groups,
        "predicted_s": e.predicted_s,
        "measured_s": e.measured_s,
        "measured_synced_s": e.plan.measured_synced_s,
        "eager_s": e.plan.eager_s,
        "torch_version": e.torch_version,
        "cost_model": e.cost_model,
        "label": e.label,
        "updated_at": e.updated_at,
        "status": (f"stale: {reason}" if (reason := cache.stale_reason(e)) else "ok"),
    }


def _op_names(e: CacheEntry) -> list[str] | None:
    """The FX names of the plan's nodes, from the model rebuilt by its stored label
    (`zoo:mlp[B=64,D=1024,...]`) and captured as `tune` captures it; None when the label
    does not rebuild the model the plan was made for (same structure key)."""
    spec_text, _, shape = (e.label or "").partition("[")
    if not spec_text:
        return None
    try:
        spec = modelspec.resolve(spec_text, shape.removesuffix("]"))
        dtype = modelspec.parse_dtype(_DTYPE_NAMES.get(e.plan.dtype, e.plan.dtype))
        graph = capture_for_planning(Resolved(spec, e.plan.device, dtype)).graph
    except Exception:  # any failure to rebuild: show indices, never fail `cache show`
        return None
    if graph.structure_key != e.model_key or len(graph.nodes) <= max(
        (n for g in e.plan.groups for n in g.nodes), default=-1
    ):
        return None
    return [n.name for n in graph.nodes]


_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _json(payload: Any) -> int:
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0
