"""Generated docs must match the scripts that generate them (numbers are computed, not typed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_worked_examples_page_is_up_to_date():
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "worked_examples.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    page = (ROOT / "docs" / "worked_examples.md").read_text()
    assert out.stdout.strip() == page.strip(), (
        "docs/worked_examples.md is stale: run python docs/worked_examples.py > "
        "docs/worked_examples.md"
    )
