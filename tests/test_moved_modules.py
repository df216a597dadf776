"""Old module names of the public Python API keep working, with a DeprecationWarning."""

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("planner.cache", "planner.plans.cache", "PlanCache"),
        ("planner.buckets", "planner.plans.buckets", "parse_dynamic"),
        ("planner.plan", "planner.plans.plan", "Plan"),
    ],
)
def test_an_old_module_name_warns_and_gives_the_same_objects(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        mod = importlib.import_module(old)
    assert getattr(mod, name) is getattr(importlib.import_module(new), name)


def test_the_runtime_entry_point_is_where_the_readme_says():
    from planner.runtime import fusion_planner_backend
    from planner.runtime.backend import fusion_planner_backend as direct

    assert fusion_planner_backend is direct
