"""`fastbert embed-corpus` in this process: every row once, the vectors of Encoder.encode, bad rows in
errors.jsonl, resuming after an interruption, refusing a different run, and the Embedder itself."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'fastbert[ray]')")
import pyarrow.parquet as pq  # noqa: E402

from fastbert.integrations.corpus import CorpusError, embed_corpus  # noqa: E402
from fastbert.integrations.ray import Embedder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LONG = "word " * 3000  # far past the model's 256-token limit: truncated as Encoder.encode truncates


def make_corpus(root: Path) -> dict:
    """Small files of every input format, with the awkward rows; returns {path: expected rows}
    where each expected row is (id, text or None, error substring or None)."""
    root.mkdir(parents=True, exist_ok=True)
    expected = {}
    texts = [f"parquet sentence {i} about the weather" for i in range(11)]
    texts[2], texts[5], texts[8] = "", LONG, None
    p = root / "a.parquet"
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(11)], "text": texts}), p,
                   row_group_size=4)
    expected[str(p)] = [(f"doc-{i}", t, "null value" if t is None else None) for i, t in enumerate(texts)]

    j = root / "b.jsonl"
    rows = [{"id": 100 + i, "text": f"json line {i}"} for i in range(6)]
    rows[1]["text"] = 7
    rows[3] = {"id": 103}
    lines = [json.dumps(r) for r in rows] + ["{not json", json.dumps({"id": 107, "text": ""})]
    j.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected[str(j)] = [(100 + i, r.get("text") if isinstance(r.get("text"), str) else None,
                         {1: "not a string", 3: "no key 'text'"}.get(i)) for i, r in enumerate(rows)]
    expected[str(j)] += [(None, None, "not valid JSON"), (107, "", None)]

    t = root / "c.txt"
    t.write_bytes(b"\xef\xbb\xbfplain line one\r\n\nline three \xff bad byte\nlast line, no newline")
    expected[str(t)] = [(0, "plain line one", None), (1, "", None), (2, None, "not valid UTF-8"),
                        (3, "last line, no newline", None)]

    c = root / "d.csv"
    c.write_text('id,text\n1,"csv, with a comma"\n2,\n3,"two\nlines"\n', encoding="utf-8")
    expected[str(c)] = [(1, "csv, with a comma", None), (2, "", None), (3, "two\nlines", None)]
    return expected


def read_output(outdir: Path):
    """(rows: {(source, row): (id, vector)}, errors: {(source, row): (id, reason)}); asserts that no
    (source, row) appears twice anywhere."""
    rows, errors = {}, {}
    for part in sorted(outdir.glob("part-*.parquet")):
        for r in pq.read_table(part).to_pylist():
            key = (r["source"], r["row"])
            assert key not in rows, f"{key} written twice"
            rows[key] = (r["id"], np.asarray(r["embedding"], dtype=np.float32))
    for line in (outdir / "errors.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        key = (r["source"], r["row"])
        assert key not in errors and key not in rows, f"{key} reported twice"
        errors[key] = (r["id"], r["reason"])
    return rows, errors


def check_output(outdir: Path, expected: dict, encoder):
    rows, errors = read_output(outdir)
    want_rows = {(src, i): e for src, es in expected.items() for i, e in enumerate(es) if e[2] is None}
    want_errors = {(src, i): e for src, es in expected.items() for i, e in enumerate(es) if e[2]}
    assert set(rows) == set(want_rows)
    assert set(errors) == set(want_errors)
    for key, (row_id, reason) in errors.items():
        assert want_errors[key][2] in reason, (key, reason)
        assert row_id == want_errors[key][0]
    keys = sorted(want_rows)
    ref = encoder.encode([want_rows[k][1] for k in keys], batch_size=8)
    got = np.stack([rows[k][1] for k in keys])
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.99999, (keys[int(cos.argmin())], cos.min())
    assert np.abs(ref - got).max() < 1e-4
    assert [rows[k][0] for k in keys] == [want_rows[k][0] for k in keys]
    return rows, errors


@pytest.fixture(scope="module")
def encoder(model_dir):
    import fastbert
    return fastbert.Encoder.from_pretrained(model_dir, device="cpu")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return root, make_corpus(root)


def test_import_fastbert_does_not_import_ray():
    code = ("import sys, fastbert, fastbert.cli, fastbert.integrations.corpus, fastbert.integrations.ray; "
            "fastbert.cli.build_parser(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'pyarrow')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_every_row_once_with_the_vectors_of_encode(corpus, encoder, model_dir, tmp_path):
    root, expected = corpus
    out = tmp_path / "out"
    summary = embed_corpus([str(root / "*.parquet"), str(root / "b.jsonl"), str(root / "c.txt"),
                            str(root / "d.csv")], out, model=model_dir, shard_rows=4, batch_rows=3,
                           progress=False)
    assert summary.complete and summary.shards_skipped == 0
    n_ok = sum(1 for es in expected.values() for e in es if e[2] is None)
    assert (summary.rows, summary.errors) == (n_ok, sum(len(es) for es in expected.values()) - n_ok)
    check_output(out, expected, encoder)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["done"]) == summary.shards_total == 3 + 2 + 1 + 1
    # the same command again: nothing to do, nothing rewritten
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    again = embed_corpus([str(root / "*.parquet"), str(root / "b.jsonl"), str(root / "c.txt"),
                          str(root / "d.csv")], out, model=model_dir, shard_rows=4, batch_rows=3,
                         progress=False)
    assert again.complete and again.shards_done == 0 and again.shards_skipped == summary.shards_total
    assert {p: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")} == stamps
    check_output(out, expected, encoder)


def test_a_different_run_into_the_same_outdir_is_refused(corpus, model_dir, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    embed_corpus([str(root / "c.txt")], out, model=model_dir, progress=False)
    with pytest.raises(CorpusError, match="inputs"):
        embed_corpus([str(root / "c.txt"), str(root / "d.csv")], out, model=model_dir, progress=False)
    with pytest.raises(CorpusError, match="pooling"):
        embed_corpus([str(root / "c.txt")], out, model=model_dir, pooling="cls", progress=False)
    with pytest.raises(CorpusError, match="shard_rows"):
        embed_corpus([str(root / "c.txt")], out, model=model_dir, shard_rows=2, progress=False)
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="has no manifest.json"):
        embed_corpus([str(root / "c.txt")], other, model=model_dir, progress=False)


def test_bad_inputs_are_clear_errors(corpus, model_dir, tmp_path):
    root, _ = corpus
    with pytest.raises(CorpusError, match="no such file"):
        embed_corpus([str(tmp_path / "missing-*.parquet")], tmp_path / "o", model=model_dir)
    (tmp_path / "x.xml").write_text("<a/>")
    with pytest.raises(CorpusError, match="unknown file type '.xml'"):
        embed_corpus([str(tmp_path / "x.xml")], tmp_path / "o", model=model_dir)
    with pytest.raises(CorpusError, match="no column 'body'"):
        embed_corpus([str(root / "a.parquet")], tmp_path / "o", column="body", model=model_dir)
    with pytest.raises(CorpusError, match="no id column 'key'"):
        embed_corpus([str(root / "d.csv")], tmp_path / "o", id_column="key", model=model_dir)
    with pytest.raises(CorpusError, match="text file has no columns"):
        embed_corpus([str(root / "c.txt")], tmp_path / "o", id_column="id", model=model_dir)


def test_a_checkpoint_that_cannot_load_is_a_clear_error(corpus, model_dir, tmp_path):
    """No tokenizer files, or a config.json that is not JSON: a CorpusError naming the folder, and no
    output folder left behind to resume."""
    import shutil

    root, _ = corpus
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(Path(model_dir) / "config.json", model / "config.json")
    shutil.copy(Path(model_dir) / "model.safetensors", model / "model.safetensors")
    with pytest.raises(CorpusError, match="no tokenizer files"):
        embed_corpus([str(root / "a.parquet")], tmp_path / "o", model=model, progress=False)
    (model / "config.json").write_text("{not json")
    with pytest.raises(CorpusError, match="not valid JSON"):
        embed_corpus([str(root / "a.parquet")], tmp_path / "o", model=model, progress=False)
    with pytest.raises(CorpusError, match="^pooling must be one of"):  # an option, not the checkpoint
        embed_corpus([str(root / "a.parquet")], tmp_path / "o", model=model_dir, pooling="bogus", progress=False)
    assert not (tmp_path / "o").exists()


class _InterruptOnThirdCall(Embedder):
    calls = 0

    def __call__(self, batch):
        type(self).calls += 1
        if type(self).calls == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the third shard
        return super().__call__(batch)


def test_an_interrupted_run_resumes_without_duplicates(corpus, encoder, model_dir, tmp_path):
    root, expected = corpus
    out = tmp_path / "out"
    inputs = [str(root / "a.parquet")]
    with pytest.raises(KeyboardInterrupt):
        embed_corpus(inputs, out, model=model_dir, shard_rows=4, batch_rows=4, progress=False,
                     embedder_cls=_InterruptOnThirdCall)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["done"]) == ["part-00000", "part-00001"] and not manifest["complete"]
    first = (out / "part-00000.parquet").stat().st_mtime_ns
    resumed = embed_corpus(inputs, out, model=model_dir, shard_rows=4, batch_rows=4, progress=False)
    assert resumed.complete and (resumed.shards_skipped, resumed.shards_done) == (2, 1)
    assert (out / "part-00000.parquet").stat().st_mtime_ns == first
    check_output(out, {str(root / "a.parquet"): expected[str(root / "a.parquet")]}, encoder)


@pytest.mark.slow  # end to end: a `fastbert embed-corpus` process started and SIGKILLed mid-run
def test_a_killed_command_resumes_where_it_stopped(encoder, model_dir, tmp_path):
    src = tmp_path / "many.txt"
    lines = [f"line {i}: " + "some words " * (i % 7) for i in range(60)]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "fastbert", "embed-corpus", str(src), "-o", str(out),
            "--model", model_dir, "--shard-rows", "10", "--batch-rows", "2", "--no-progress"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            manifest = out / "manifest.json"
            if manifest.is_file() and json.loads(manifest.read_text())["done"]:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()!r}"
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup at all, as a lost machine
    finally:
        proc.kill()
        proc.wait()
    done_before = json.loads((out / "manifest.json").read_text())["done"]
    assert 1 <= len(done_before) < 6
    resumed = embed_corpus([str(src)], out, model=model_dir, shard_rows=10, batch_rows=2,
                           progress=False)
    assert resumed.complete and resumed.shards_skipped == len(done_before)
    assert resumed.shards_done == 6 - len(done_before)
    check_output(out, {str(src): [(i, t, None) for i, t in enumerate(lines)]}, encoder)
    assert not list(out.glob(".*tmp*")), "temporary files left behind"


def test_cli_reports_bad_input_with_exit_2(tmp_path, capsys):
    from fastbert.cli import main

    with pytest.raises(SystemExit) as info:
        main(["embed-corpus", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "nope.jsonl" in err and "no such file" in err
    assert "Traceback" not in err


def test_embedder_marks_bad_rows_and_splits_by_token_budget(encoder, model_dir):
    texts = ["short", "a somewhat longer sentence with more words in it", "", LONG, "mid length text"]
    emb = Embedder(model=model_dir, batch_tokens=40, stats=True)  # forces several sub-batches
    got = emb(pa.table({"text": texts + [None], "n": list(range(6))}))
    assert got.column_names == ["text", "n", "embedding", "error", "embed_worker", "embed_seconds"]
    assert got.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert got.column("error").to_pylist()[:5] == [None] * 5
    assert "null value" in got.column("error")[5].as_py() and got.column("embedding")[5].as_py() is None
    vectors = np.array(got.column("embedding").to_pylist()[:5], dtype=np.float32)
    np.testing.assert_allclose(vectors, encoder.encode(texts), atol=1e-5)
    numbers = emb(pa.table({"text": pa.array([1, None], type=pa.int64())}))
    assert numbers.column("error").to_pylist() == [
        "column 'text' holds int64 values, not strings", "null value in column 'text'"]
    given = emb(pa.table({"text": ["fine", "fine"], "error": [None, "bad upstream"]}))
    assert given.column("error").to_pylist() == [None, "bad upstream"]
    assert given.column("embedding").null_count == 1
    lean = Embedder(model=model_dir, keep_column=False)(pa.table({"text": ["x"], "n": [1]}))
    assert lean.column_names == ["n", "embedding", "error"]
    with pytest.raises(KeyError, match="no column 'text'"):
        emb(pa.table({"body": ["x"]}))


class _EveryRowTwice(Embedder):
    """What a retried task can do on Ray: the same rows come back a second time."""

    def __call__(self, batch):
        out = super().__call__(batch)
        return pa.concat_tables([out, out.slice(0, 1), out])


def test_rows_that_come_back_twice_are_written_once(encoder, model_dir, tmp_path):
    src = tmp_path / "few.txt"
    lines = ["one", "two", "", "four", "five"]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = embed_corpus([str(src)], tmp_path / "out", model=model_dir, shard_rows=2, batch_rows=2,
                           progress=False, embedder_cls=_EveryRowTwice)
    assert summary.complete and summary.rows == 5
    check_output(tmp_path / "out", {str(src): [(i, t, None) for i, t in enumerate(lines)]}, encoder)


def test_int8_and_uint8_are_refused_binary_is_embedded(corpus, encoder, model_dir, tmp_path):
    root, _ = corpus
    # per-batch int8/uint8 ranges would make a text's codes depend on its batchmates
    for precision in ("int8", "uint8"):
        with pytest.raises(ValueError, match=f"precision='{precision}'.*calibration_embeddings"):
            Embedder(model=model_dir, precision=precision)
        with pytest.raises(CorpusError, match=f"precision='{precision}'.*calibration_embeddings"):
            embed_corpus([str(root / "c.txt")], tmp_path / "o", model=model_dir, precision=precision)
    assert not (tmp_path / "o").exists()
    texts = ["one", "two words", ""]
    for precision in ("binary", "ubinary"):  # per-value: the same codes in any batch
        got = Embedder(model=model_dir, precision=precision)(pa.table({"text": texts}))
        want = encoder.encode(texts, precision=precision)
        np.testing.assert_array_equal(np.array(got.column("embedding").to_pylist()), want)


def test_jsonl_ids_of_mixed_types_are_written_as_strings(encoder, model_dir, tmp_path):
    src = tmp_path / "ids.jsonl"
    ids = [1, 2, "three", 4, True, 6.5, 7, None]  # shards of 2: ints | str, int | bool, float | int
    lines = [json.dumps({"id": i, "text": f"text {k}"}) for k, i in enumerate(ids)]
    src.write_text("\n".join(lines + [json.dumps({"text": "no id"})]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    summary = embed_corpus([str(src)], out, model=model_dir, shard_rows=2, progress=False)
    assert summary.complete and (summary.rows, summary.errors) == (8, 1)
    want = [1, 2, "three", "4", "true", "6.5", 7, None]  # one type per shard: mixed ones as JSON text
    check_output(out, {str(src): [(i, f"text {k}", None) for k, i in enumerate(want)]
                       + [(None, None, "no id key 'id'")]}, encoder)
    assert pq.read_table(out / "part-00000.parquet").schema.field("id").type == pa.int64()
    assert pq.read_table(out / "part-00001.parquet").schema.field("id").type == pa.string()


def test_a_column_missing_from_the_first_jsonl_object_is_refused(corpus, model_dir, tmp_path, capsys):
    from fastbert.cli import main

    root, _ = corpus
    src = str(root / "b.jsonl")
    with pytest.raises(CorpusError, match=r"b\.jsonl: its first JSON object has no key 'body' "
                                          r"\(keys: \['id', 'text'\]\)"):
        embed_corpus([src], tmp_path / "o", column="body", model=model_dir)
    with pytest.raises(CorpusError, match=r"b\.jsonl: its first JSON object has no id key 'key'"):
        embed_corpus([src], tmp_path / "o", id_column="key", model=model_dir)
    with pytest.raises(SystemExit) as info:
        main(["embed-corpus", src, "-o", str(tmp_path / "o"), "--column", "body", "--model", model_dir])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "no key 'body'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_dictionary_encoded_strings_are_texts(encoder, model_dir, tmp_path):
    texts = ["red", None, "green", "red"]
    got = Embedder(model=model_dir)(pa.table({"text": pa.array(texts).dictionary_encode()}))
    assert got.column("error").to_pylist() == [None, "null value in column 'text'", None, None]
    vectors = np.array([got.column("embedding")[i].as_py() for i in (0, 2, 3)], dtype=np.float32)
    np.testing.assert_allclose(vectors, encoder.encode(["red", "green", "red"]), atol=1e-5)
    src = tmp_path / "cat.parquet"  # what pandas writes for a Categorical column
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), src)
    assert pa.types.is_dictionary(pq.read_table(src).schema.field("text").type)
    summary = embed_corpus([str(src)], tmp_path / "out", model=model_dir, shard_rows=2, progress=False)
    assert summary.complete and (summary.rows, summary.errors) == (3, 1)
    check_output(tmp_path / "out", {str(src): [(i, t, "null value" if t is None else None)
                                               for i, t in enumerate(texts)]}, encoder)


def test_a_ray_address_that_cannot_be_joined_is_exit_2_before_any_output(corpus, tmp_path, capsys):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'fastbert[ray]')")
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process: --ray would use it")
    from fastbert.cli import main

    root, _ = corpus
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as info:
        main(["embed-corpus", str(root / "c.txt"), "-o", str(out), "--ray", "bogus", "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--ray bogus: cannot join Ray" in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) < 200 and not out.exists()
