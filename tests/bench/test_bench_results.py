"""Benchmark results: one JSONL line per run, appended, and the RESULTS.md generated from the lines."""
import json
from dataclasses import asdict

import pytest

from fastbert.benchmarks import results


def test_append_adds_one_line_per_run_and_regenerates_the_markdown(tmp_path):
    first = results.record("demo", [{"case": "a", "ms": 1.5, "vs torch": float("nan")}], variant="quick",
                           config={"threads": 2}, versions={"torch": "2.x"})
    second = results.record("demo", [{"case": "a", "ms": 1.25, "vs torch": 2.0, "shape": (2, 3)}])
    path = results.append(first, tmp_path)
    assert results.append(second, tmp_path) == path == tmp_path / "demo.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["figures"][0]["ms"] for line in lines] == [1.5, 1.25]
    assert lines[0]["figures"][0]["vs torch"] is None  # NaN has no JSON spelling
    assert lines[1]["figures"][0]["shape"] == [2, 3]
    for line in lines:
        assert line["schema"] == results.SCHEMA and line["kind"] == "demo" and line["date"]
        assert line["machine"]["device"] == "cpu" and line["machine"]["cores"] >= 1
        assert len(line["commit"] or "0" * 40) == 40  # this checkout's HEAD (None outside one)
    assert lines[0]["variant"] == "quick" and lines[0]["config"] == {"threads": 2}
    assert results.read(tmp_path) == {"demo": lines}
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## demo" in text and "2 runs in `demo.jsonl`" in text
    assert "Latest quick on cpu" in text and "Latest run on cpu" in text and "| 1.25 | 2 |" in text


def test_bad_kind_or_figures_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kind must be"):
        results.record("../escape", [])
    with pytest.raises(TypeError, match="list of rows"):
        results.record("demo", {"ms": 1.0})


def test_suite_lines_render_as_the_bench_table(tmp_path):
    from fastbert.benchmarks.report import Result

    rows = [Result("Tokenizer", "fastbert", "English", 10.0, "MB/s", fastbert=True, check="ok"),
            Result("Tokenizer", "tokenizers", "English", 5.0, "MB/s", speedup=2.0)]
    results.append(results.record("suite", [asdict(r) for r in rows]), tmp_path)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| Workload | fastbert | tokenizers | Output vs HF |" in text and "(2.00x)" in text
