"""bench/gpu_check.sh: stages that each fit one 5-minute call, GPU steps only after the host ones they
need, nothing from the internet, output under $OUT; --dry-run proves the plumbing on CPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402  (bench/ on the path first)

STAGES = ("install", "kernels", "ops", "bench")


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_fits_one_call(stage, tmp_path):
    plan = gpu_check.steps(stage, tmp_path)
    assert sum(spec["limit"] for _, spec in plan) <= 300, plan
    assert plan[0][0] == "environment"                     # versions and device first, in the log


def test_installs_without_the_internet(tmp_path):
    for wheel in (None, str(tmp_path / "fastbert-0.1.0-cp311-cp311-linux_x86_64.whl")):
        (_, spec), = [s for s in gpu_check.steps("install", tmp_path, wheel) if s[0] == "install"]
        assert "--no-deps" in spec["cmd"], spec["cmd"]     # no dependency resolution, no download
        assert wheel in spec["cmd"] if wheel else "--no-build-isolation" in spec["cmd"]


def test_bench_rows_are_gpu_rows_into_out(tmp_path):
    (_, spec), = [s for s in gpu_check.steps("bench", tmp_path) if s[0] != "environment"]
    assert spec["gpu"] and str(tmp_path / "results") in spec["cmd"]
    assert "--cpu-smoke" not in spec["cmd"]


def test_all_stages_at_once_is_refused_on_a_gpu(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--stage", "all"])
    assert "one by one" in capsys.readouterr().err


def test_dry_run_from_another_folder_writes_log_and_table(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--dry-run", "--stage", "install"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log, table = (out / "gpu-check.log").read_text(), (out / "gpu-check.md").read_text()
    assert "pip install --dry-run --no-deps" in log and "Would install fastbert" in log
    assert table.splitlines()[2].startswith("| environment | host | dry-run ok")
    assert "| install | host | dry-run ok" in table
    assert proc.stdout.rstrip().endswith(table.rstrip().splitlines()[-1])    # the headline rows come last
