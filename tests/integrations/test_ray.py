"""fastbert on Ray Data: the Embedder in map_batches, and `embed-corpus --ray` with 2 actors on a
local Ray: every row once, Encoder.encode's vectors, the in-process output, an actor killed mid-run."""
import json
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'fastbert[ray]')")
pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'fastbert[ray]')")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'fastbert[ray]')")
import pyarrow.parquet as pq  # noqa: E402

from fastbert.integrations.corpus import embed_corpus  # noqa: E402
from fastbert.integrations.ray import Embedder  # noqa: E402
from test_embed_corpus import check_output, corpus, encoder, read_output  # noqa: E402,F401 (fixtures)

# A local Ray cluster by nature: worker processes that each import torch and load the checkpoint (tens of
# seconds on 2 cores). CI's slow stage runs them; the Embedder and embed-corpus themselves are tested in
# this process by test_embed_corpus.py in every stage.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    # 2 CPUs for the 2 embedding actors, one more for the stage that reads the shards
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()



def _inputs(root):
    return [str(root / "a.parquet"), str(root / "b.jsonl"), str(root / "c.txt"), str(root / "d.csv")]


def test_embedder_in_map_batches_gives_encode_vectors(encoder, model_dir):
    texts = [f"row {i} " + "text " * (i % 9) for i in range(24)] + ["", None]
    table = pa.table({"id": list(range(26)), "text": texts})
    ds = ray.data.from_arrow([table.slice(i, 7) for i in range(0, 26, 7)])  # 4 blocks for 2 actors
    out = ds.map_batches(Embedder, fn_constructor_kwargs={"model": model_dir, "column": "text"},
                         compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=5,
                         batch_format="pyarrow")
    table = pa.concat_tables(list(out.iter_batches(batch_format="pyarrow", batch_size=None)))
    table = table.sort_by("id")
    assert table.column("id").to_pylist() == list(range(26))  # every row once
    assert table.column("error").to_pylist() == [None] * 25 + ["null value in column 'text'"]
    got = np.array(table.column("embedding").to_pylist()[:25], dtype=np.float32)
    ref = encoder.encode(texts[:25])
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.99999


def test_ray_run_equals_the_in_process_run(corpus, encoder, model_dir, tmp_path):
    root, expected = corpus
    local = embed_corpus(_inputs(root), tmp_path / "local", model=model_dir, shard_rows=4,
                         batch_rows=3, progress=False)
    on_ray = embed_corpus(_inputs(root), tmp_path / "ray", model=model_dir, ray="local",
                          num_workers=2, shard_rows=4, batch_rows=3, progress=False)
    assert local.complete and on_ray.complete
    assert (on_ray.rows, on_ray.errors) == (local.rows, local.errors)
    check_output(tmp_path / "ray", expected, encoder)
    # the same files with the same rows; vectors equal up to batching's float noise
    names = sorted(p.name for p in (tmp_path / "local").glob("part-*.parquet"))
    assert names == sorted(p.name for p in (tmp_path / "ray").glob("part-*.parquet"))
    for name in names:
        a, b = pq.read_table(tmp_path / "local" / name), pq.read_table(tmp_path / "ray" / name)
        assert a.schema == b.schema
        assert a.drop_columns(["embedding"]).equals(b.drop_columns(["embedding"]))
        np.testing.assert_allclose(np.array(a.column("embedding").to_pylist()),
                                   np.array(b.column("embedding").to_pylist()), atol=1e-5)
    assert (tmp_path / "local" / "errors.jsonl").read_text() == (tmp_path / "ray" / "errors.jsonl").read_text()
    assert sum(w["rows"] for w in on_ray.workers.values()) == on_ray.rows + on_ray.errors


def test_an_actor_killed_mid_run_is_restarted_and_every_row_lands_once(encoder, model_dir, tmp_path):
    marker = tmp_path / "killed"

    class KilledOnSecondCall(Embedder):  # defined here: Ray ships it by value
        calls = 0

        def __call__(self, batch):
            self.calls += 1
            if self.calls == 2 and not marker.exists():
                marker.write_text(str(os.getpid()))
                ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
                time.sleep(60)  # the kill lands while this batch is in flight
            return super().__call__(batch)

    src = tmp_path / "lines.txt"
    lines = [f"line {i} " + "word " * (i % 5) for i in range(40)]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = embed_corpus([str(src)], tmp_path / "out", model=model_dir, ray="local",
                           num_workers=2, shard_rows=8, batch_rows=4, progress=False,
                           embedder_cls=KilledOnSecondCall)
    assert marker.exists(), "no actor was killed: the test did not test anything"
    assert summary.complete and summary.rows == 40
    killed = int(marker.read_text())
    assert any(int(w.rsplit(":", 1)[1]) != killed for w in summary.workers), summary.workers
    check_output(tmp_path / "out", {str(src): [(i, t, None) for i, t in enumerate(lines)]}, encoder)
    rows, _ = read_output(tmp_path / "out")
    assert len(rows) == 40
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["done"]) == 5 and manifest["complete"]
