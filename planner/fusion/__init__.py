"""Fusion as graph partitioning: partitions, legality rules, patterns, the rule-based default."""

from planner.fusion.legality import LegalityReport, can_merge, check
from planner.fusion.partition import Partition, is_convex

__all__ = ["LegalityReport", "Partition", "can_merge", "check", "is_convex"]
