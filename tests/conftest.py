"""Test-session settings shared by every test module."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps its example database and caches outside the checkout: a test run
# writes nothing into the repository.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "fusion-planner-hypothesis")
