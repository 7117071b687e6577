"""bench/bench_kernels.py works without a GPU: its --cpu-smoke pieces run here at toy shapes."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_kernels.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))  # its per-op bench files and their `common` helpers
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # parses no argv: the module runs nothing at import
    return module


def test_verdict_is_flash_attentions_rule(bench):
    ref = torch.zeros(4)
    peer = torch.full((4,), 1e-3)
    ok, note = bench.verdict("y", torch.full((4,), 2e-3), peer, ref, torch.float16)
    assert ok and "err 2.00e-03" in note
    ok, note = bench.verdict("y", torch.full((4,), 5e-3), peer, ref, torch.float16)
    assert not ok and "bound 4.00e-03" in note
    assert not bench.verdict("y", torch.full((4,), float("nan")), peer, ref, torch.float16)[0]


def test_smoke_run_checks_times_and_writes(bench, tmp_path):
    plan = bench.Plan(smoke=True)
    plan.dtypes = (torch.float32,)
    rows, env = bench.run(plan, skip_e2e=True)
    sections = {r["section"] for r in rows}
    assert sections == {"Peaks", "Attention", "bias+GELU", "add+LayerNorm"}
    mine = [r for r in rows if r["fastbert"]]
    assert mine and all(r["check"] == "ok" for r in mine), [r["note"] for r in mine if r["check"] != "ok"]
    assert all(r["ms"] > 0 and r["vs_best_torch"] > 0 for r in mine)
    assert any(r["impl"] == "SDPA math" and r["ms"] for r in rows)
    path = bench.write_results(plan, rows, env, tmp_path)
    assert path == tmp_path / "kernels.jsonl" and (tmp_path / "RESULTS.md").is_file()
    [run] = [json.loads(line) for line in path.read_text().splitlines()]
    assert run["kind"] == "kernels" and run["variant"] == "smoke" and run["machine"]["device"] == "cpu"
    assert run["versions"]["triton"] == env["triton"] and run["config"]["gpu"] == env["gpu"]
    assert len(run["figures"]) == len(rows) and "group" not in run["figures"][0]
    text = bench.table(rows, env)
    assert "fastbert add_layer_norm" in text and "FAIL" not in text
