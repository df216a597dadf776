"""`fusion-plan report --cache URL --out report.html`: the HTML report of the plans a
cache holds for one model on one device (cli/report_html.py), without tuning again.

Each entry's graph is rebuilt from the model spec the entry was stored with, captured the
way `tune` captures, and its plan applied to it; group costs are the analytical model's
for the plan's device. The cache keeps the plan's measured median and p99 and eager's
median, so the timing chart shows those (torch.compile is not stored).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from cli.common import Resolved, capture_for_planning
from cli.report_charts import Spread
from cli.report_graph import require_dot
from cli.report_html import BucketView, JobView, check_writable, write_report
from learned_cost.analytical import AnalyticalModel
from planner.errors import CacheError, FusionPlannerError
from planner.hardware import get_spec
from planner.objective import Objective
from planner.plans.cache import CacheEntry, PlanCache
from zoo.modelspec import parse_dtype, resolve


def _label_parts(label: str) -> tuple[str, str]:
    """ "zoo:mlp[B=4,D=16]" -> ("zoo:mlp", "B=4,D=16")."""
    spec, _, shape = label.partition("[")
    return spec, shape.rstrip("]")


def _select(entries: Sequence[CacheEntry], model: str | None) -> list[CacheEntry]:
    if model:
        entries = [e for e in entries if e.model_key.startswith(model) or e.label.startswith(model)]
    keys = sorted({(e.model_key, e.device_fp) for e in entries})
    if not keys:
        raise CacheError(
            f"no cached plans{' for ' + repr(model) if model else ''}: run `fusion-plan "
            "cache ls` to see what the cache holds, or `fusion-plan tune` to make plans"
        )
    if len(keys) > 1:
        names = "; ".join(
            f"{mk[:12]} on {dev} ({next(e.label for e in entries if e.model_key == mk)})"
            for mk, dev in keys
        )
        raise CacheError(
            f"the cache holds plans for {len(keys)} models or devices: {names}. Pass "
            "--model with a model key prefix or label to pick one"
        )
    return [e for e in entries if e.scope == "bucket"] or list(entries)


def _bucket(entry: CacheEntry) -> BucketView:
    """One entry as the report shows it: its plan applied to the rebuilt graph."""
    plan = entry.plan
    times = {}
    if plan.measured_s:
        times["plan"] = Spread(plan.measured_s, None, plan.measured_p99_s)
    if plan.eager_s:
        times["eager"] = Spread(plan.eager_s)
    params: dict[str, int] = {}
    partition = evaluation = None
    note = ""
    try:
        spec_text, shape = _label_parts(entry.label)
        spec = resolve(spec_text, shape)
        params = dict(spec.params)
        captured = capture_for_planning(Resolved(spec, plan.device, parse_dtype(plan.dtype)))
        partition = plan.partition_for(captured.graph)
        evaluation = Objective(AnalyticalModel(get_spec(plan.device))).evaluate(partition)
    except (FusionPlannerError, ValueError) as e:
        note = f"the plan's graph could not be rebuilt from {entry.label!r}: {e}"
    return BucketView(
        key=entry.bucket_key.split(":", 1)[-1],
        params=params,
        partition=partition,
        evaluation=evaluation,
        realizations=tuple(g.realization for g in plan.groups),
        fallbacks={},
        strategy=plan.strategy,
        times=times,
        note=note,
    )


def _varying(buckets: Sequence[BucketView]) -> tuple[BucketView, ...]:
    """The buckets labelled by the parameters that differ between them (the dynamic ones)."""
    names = {k for b in buckets for k in b.params}
    vary = {k for k in names if len({b.params.get(k) for b in buckets}) > 1}
    if not vary:
        return tuple(buckets)
    return tuple(
        replace(b, params={k: v for k, v in b.params.items() if k in vary}) for b in buckets
    )


def run(args: argparse.Namespace) -> int:
    require_dot()
    check_writable(args.out)
    with PlanCache(args.cache, read_only=True) as cache:
        entries = _select(cache.entries(), args.model)
        url = cache.url
    first = entries[0]
    every = sorted((_bucket(e) for e in entries), key=lambda b: sorted(b.params.items()))
    buckets = _varying(every)
    shown = {k for b in buckets for k in b.params}
    fixed = ",".join(f"{k}={v}" for k, v in every[0].params.items() if k not in shown)
    spec_text = _label_parts(first.label)[0]
    job = JobView(
        model=f"{spec_text}[{fixed}]" if fixed else spec_text,
        device=get_spec(first.plan.device),
        dtype=first.plan.dtype,
        cost_model=f"{first.cost_model} (groups re-scored: analytical)",
        strategy=", ".join(sorted({e.plan.strategy for e in entries})),
        buckets=buckets,
        cache=url,
        torch_version=first.torch_version,
        created=max(e.updated_at for e in entries),
    )
    path = write_report(job, args.out)
    drawn = sum(b.partition is not None for b in buckets)
    print(f"wrote {path}: {len(buckets)} bucket(s), {drawn} plan(s) drawn", file=sys.stderr)
    return 0
