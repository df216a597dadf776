"""The GPU-test record (benchmarks/gpu_tests.py): rows appended, commits read back, and
whether the watched code changed since the last recorded run."""

from __future__ import annotations

from benchmarks import gpu_tests


def test_a_row_is_appended_and_its_commit_read_back(tmp_path):
    out = tmp_path / "gpu_tests.md"
    gpu_tests.append(out, gpu_tests.row("2026-01-01 00:00", "GPU X", "2.11", "a" * 40, "1 passed"))
    gpu_tests.append(
        out, gpu_tests.row("2026-01-02 00:00", "GPU X", "2.11", "b" * 40 + "+dirty", "x")
    )
    text = out.read_text()
    assert text.startswith(gpu_tests.HEADER)
    assert gpu_tests.recorded_commits(text) == ["a" * 40, "b" * 40]


def test_the_committed_record_names_commits():
    assert gpu_tests.recorded_commits(gpu_tests.RESULTS.read_text())


def test_pytest_summary_line_is_kept_without_its_rule():
    out = "....\n== 5 passed, 57 deselected, 1 warning in 31.00s ==\n"
    assert gpu_tests.summary_line(out) == "5 passed, 57 deselected, 1 warning in 31.00s"
    assert gpu_tests.summary_line("") == "no output"


def test_changes_are_counted_from_the_recorded_commit():
    assert gpu_tests.changed_since("HEAD") == []
    (why,) = gpu_tests.changed_since("0" * 40)
    assert "not in this repository" in why
