"""Where `tune` stores a measured plan: under the spec and bucket the runtime looks it up
with (inputs in the runtime's order), under the ops the model traces into elsewhere in
the bucket too, and in a file `fusion-plan cache import` takes when the cache refuses it
(so a measured plan is never lost)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from planner.errors import FusionPlannerError
from planner.hardware import cache_dir
from planner.ir.capture_dynamic import one_step_inside
from planner.plans.buckets import Bucket, BucketSpec
from planner.plans.cache import PlanCache
from planner.plans.cache_admin import export_document, plan_record, spec_record
from planner.plans.plan import Plan
from planner.runtime.graph import capture_for_serving

log = logging.getLogger(__name__)


def unstored_path(plan: Plan) -> Path:
    """Where a plan the cache would not take is saved instead (an export document)."""
    name = f"unstored-{time.strftime('%Y%m%dT%H%M%S')}-{plan.graph_key[:10]}.json"
    for folder in (cache_dir() / "unstored-plans", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder / name
        except OSError:
            continue
    return Path(name)


def in_served_order(
    spec: BucketSpec, bucket: Bucket, inputs: tuple[Any, ...], captured: Any
) -> tuple[BucketSpec, Bucket]:
    """`spec` and `bucket` over the inputs numbered as the served capture takes them.

    The spec numbers the example call's tensors in the order they were passed; the
    runtime backend numbers them in the order dynamo's graph first uses them (and drops
    one it never reads), and looks plans up in that order. Stored in the call's order, a
    plan of a model that reads a later argument first (a `transformers` encoder-decoder
    called with keyword arguments reads `decoder_input_ids` first) would never be found.
    The two orders are matched by tensor identity; where they cannot be, unchanged."""
    order = served_order(inputs, captured)
    if order is None or len(order) != len(bucket.dims):
        return spec, bucket
    return spec.renumbered(order), bucket.renumbered(order, len(captured.example_inputs))


def served_order(inputs: Any, captured: Any) -> list[int | None] | None:
    """For each tensor of the call `inputs` (in the order they were passed), its index
    among the served capture's inputs (None: the graph never reads it); None when the
    orders agree or cannot be matched (a served input that is not one of the call's
    tensors as it is). Matched by tensor identity."""
    leaves = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
    served = list(captured.example_inputs)
    order = [next((j for j, y in enumerate(served) if y is x), None) for x in leaves]
    if order == list(range(len(served))):
        return None
    if any(j not in order for j in range(len(served))):  # an input not passed as it is
        return None
    return order


def store_plan(
    cache: PlanCache,
    plan: Plan,
    spec: BucketSpec,
    bucket: Bucket,
    label: str,
    progress: Callable[[str], None],
) -> str:
    """Store the plan (and the bucket spec); if the cache refuses, the measured plan is
    written to a file `fusion-plan cache import` takes, so it is never lost."""
    try:
        cache.set_bucket_spec(plan.structure_key, spec)
        return str(cache.store(plan, bucket, label=label))
    except FusionPlannerError as e:
        doc = export_document(
            plans=[plan_record(plan, f"bucket:{bucket.key}", label=label)],
            specs=[spec_record(plan.structure_key, plan.device_fingerprint, spec)],
        )
        path = unstored_path(plan)
        try:
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        except OSError as w:
            progress(f"  plan NOT stored ({e}) and not saved ({w}): {json.dumps(doc)}")
            return f"NOT stored: {e}"
        progress(f"  plan NOT stored ({e}); saved to {path}")
        return f"NOT stored ({e}); saved to {path}: load it with `fusion-plan cache import {path}`"


def inside_alias(
    module: torch.nn.Module, inputs: Any, bucket: Bucket, graph: Any, plan: Plan, label: str
) -> Plan | None:
    """`plan` carried to the ops the model traces into one step inside the bucket, where
    those differ from the representative's (an op that is an identity at the range's edge,
    `pos[:, :S]` at S = the table's length, is dropped there and kept elsewhere): the
    backend keys a model by the graph of its first call, so a plan stored only under the
    edge's graph would not be found from any other shape. None where the ops are the same,
    the bucket holds one shape, or the plan cannot be carried (Plan.aligned_to)."""
    if plan.tensor_parallel is not None:
        return None
    args = list(inputs)
    where = [i for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
    inner = one_step_inside(tuple(args[i] for i in where), bucket.ranges())
    if inner is None:
        return None
    for i, x in zip(where, inner):
        args[i] = x
    try:
        other = capture_for_serving(module, tuple(args), name=label).graph
        if other.structure_key == graph.structure_key:
            return None
        return plan.aligned_to(graph, other)
    except Exception as e:  # the alias is a courtesy: the plan itself is stored
        log.info("no plan stored for the ops inside the bucket: %s", e)
        return None
