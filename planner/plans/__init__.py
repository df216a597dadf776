"""Plans and where they live: the Plan record, shape buckets and the plan cache."""

from planner.plans.buckets import Bucket, BucketSpec, parse_dynamic
from planner.plans.cache import PlanCache
from planner.plans.plan import GroupPlan, Plan

__all__ = ["Bucket", "BucketSpec", "GroupPlan", "Plan", "PlanCache", "parse_dynamic"]
