"""Realizing a plan: each group as an executable unit, checked against a higher-precision reference."""

from planner.realize.realizer import RealizedPlan, RealizeWarning, realize

__all__ = ["RealizeWarning", "RealizedPlan", "realize"]
