"""The tokenizer benchmark times text new to every tokenizer: no call sees a text an earlier call saw,
every tokenizer gets the same texts in a round, and the output checked is a timed round's."""
import gc
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from fastbert.benchmarks import tokenizer as tb

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the research tooling there
import tokenizer_idle_gaps as ig  # noqa: E402
import tokenizer_work as tw  # noqa: E402

DOCS = ["The quick brown fox.", "Ünïcödé text, with accents.", "野口里佳 Noguchi Rika"]


def _recorder(seen, name):
    def fn(texts):
        seen.setdefault(name, []).append(list(texts))
        return [len(t) for t in texts]
    return fn


def test_rounds_are_new_text_and_the_same_for_every_tokenizer():
    seen, cleared = {}, []
    calls = {name: (_recorder(seen, name), lambda name=name: cleared.append(name)) for name in ("a", "b")}
    rounds = tb.Rounds(DOCS, itertools.count(1))
    result = tb.time_interleaved(calls, rounds, repeats=3)
    for name in calls:
        _, first, *timed = seen[name]  # the primer, the first pass, then the timed rounds
        texts = [t for call in [first, *timed] for t in call]
        assert len(texts) == len(set(texts)) == 4 * len(DOCS), "a text was encoded twice"
        assert not set(seen[name][0]) & set(texts), "the primer shares a text with the timed calls"
        assert all(t.endswith(doc) for call in [first, *timed] for t, doc in zip(call, DOCS))
        median, repeats, out, first_seconds, collecting = result[name]
        assert repeats == 3 and median > 0 and first_seconds > 0 and collecting == 0
        assert out == [len(t) for t in rounds(1)]  # round 1's output is the one checked
        assert cleared.count(name) == 5  # before the primer, the first pass and each timed round
    assert seen["a"][1:] == seen["b"][1:]  # same texts, round by round


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_round_orders_put_every_tokenizer_after_every_other_equally_often(n):
    names = [f"t{i}" for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    orders = tb.round_orders(names, 2 * cycle)
    assert len(orders) == 2 * cycle and all(sorted(o) == names for o in orders)
    firsts = [o[0] for o in orders]
    after = {(a, b): 0 for a in names for b in names if a != b}
    for o in orders:
        for a, b in zip(o, o[1:]):
            after[a, b] += 1
    assert len(set(firsts.count(x) for x in names)) == 1, firsts
    # each ordered pair adjacent the same number of times (rotating one order repeats the same n pairs)
    assert len(set(after.values())) <= 1, after


def test_a_calls_collections_walk_only_what_it_made():
    """The lists one tokenizer returned (kept until the next call returns) are out of the garbage
    collector's reach during the next tokenizer's call: that call's collections walk only its own
    objects. Without it, they walked the previous tokenizer's output, at the next one's cost."""
    young_at_call = {}

    def returns_lists(texts):
        return [[i] for i in range(3000)]  # tracked containers: enough to set off collections

    def counts_young(texts):
        young_at_call.setdefault("b", []).append(len(gc.get_objects(generation=0)))
        return texts

    before = gc.get_freeze_count()
    tb.time_interleaved({"a": (returns_lists, None), "b": (counts_young, None)},
                        tb.Rounds(DOCS, itertools.count(1)), repeats=4)
    timed = young_at_call["b"][1:]  # after its untimed primer: the first pass and the rounds
    assert max(timed) < 100, young_at_call  # "a"'s lists left hundreds in the young generation
    assert gc.get_freeze_count() == before  # everything frozen for the run is back in the collector's reach


def test_time_interleaved_reports_the_garbage_collection_inside_the_calls():
    def collects(texts):
        made = [[] for _ in range(20_000)]  # objects of this call, which its collections walk
        for _ in range(20):  # collections are most of the call, so the share stays clear of 0.3 on a busy machine
            gc.collect()
        return [texts, made]

    result = tb.time_interleaved({"collects": (collects, None), "quiet": (lambda texts: texts, None)},
                                 tb.Rounds(DOCS, itertools.count(1)), repeats=3)
    median, _, _, _, collecting = result["collects"]
    assert 0.3 * median < collecting <= median  # about 0.9 of it here (0.6-0.75 with 5 collections; 0.29 once on a busy machine)
    assert result["quiet"][4] == 0  # nothing made, nothing collected: the run before it is out of reach


def test_time_interleaved_takes_the_round_orders():
    calls_in_order = []
    calls = {name: ((lambda texts, name=name: calls_in_order.append(name)), None) for name in "abcd"}
    tb.time_interleaved(calls, tb.Rounds(DOCS, itertools.count(1)), repeats=4)
    timed = calls_in_order[8:]  # after each one's primer and first pass
    assert [timed[i:i + 4] for i in range(0, 16, 4)] == tb.round_orders(list("abcd"), 4)


def test_peers_table_times_every_thread_count_in_the_same_rounds(model_dir):
    """The "vs 1 thread" of the peers' table compares calls of the same rounds, not two runs made one
    after the other (on a shared machine the load changes between them)."""
    calls = []

    class Recording(tb.FastbertPeer):
        def ids(self, texts):
            calls.append(("ids", self.threads))
            return super().ids(texts)

        def padded(self, texts):
            calls.append(("padded128", self.threads))
            return super().padded(texts)

    rows = tb.run(model_dir, {"mixed": DOCS * 20}, threads=(1, 2), smoke=True, peers=(Recording,))
    assert sorted((r["path"], r["threads"]) for r in rows) == sorted((p, n) for p in tb.PATHS for n in (1, 2))
    assert all(r["ids_match"] for r in rows)
    first_path = [n for path, n in calls if path == "ids"]
    # primer, first pass and the timed round of each count, all before the next path's calls
    assert calls[:len(first_path)] == [("ids", n) for n in first_path] and sorted(set(first_path)) == [1, 2]
    assert all(r["vs 1 thread"] > 0 for r in rows)
    # fastbert's pool rows carry the pool's record (None here: batches this small stay on one thread)
    assert all(("tasks ms" in r) == (r["threads"] > 1) for r in rows)


def test_peers_option_picks_the_tokenizers_beside_fastbert():
    """bench_tokenizer.py --peers: fastbert and the named peers in the table's usual order; 'none' is
    fastbert alone; an unknown name is refused by name, with the known ones."""
    assert tb.peer_classes(["BertTokenizerFast", "nanotoken"]) == \
        (tb.FastbertPeer, tb.NanotokenPeer, tb.TransformersPeer)
    assert tb.peer_classes(["none"]) == tb.peer_classes([]) == (tb.FastbertPeer,)
    assert tb.peer_classes(["fastbert", "tokenizers"]) == (tb.FastbertPeer, tb.TokenizersPeer)
    with pytest.raises(ValueError, match="'nanotokn'.*nanotoken"):
        tb.peer_classes(["nanotokn"])


def test_tags_never_repeat_across_cases_of_a_run():
    tags = itertools.count(1)
    a, b = tb.Rounds(DOCS, tags), tb.Rounds(DOCS, tags)
    texts = a(0) + a(1) + b(0) + b(1)
    assert len(set(texts)) == len(texts)
    assert a(1) is a(1)  # built once, outside the timed region


def test_repeated_rounds_give_the_same_text_every_round():
    rounds = tb.Rounds(DOCS, itertools.count(1), repeated=True)
    assert rounds(0) == rounds(1) == rounds(5)
    assert rounds(0) != DOCS  # still text no earlier call used


def test_primer_shares_no_word_with_the_text():
    words = {w for d in DOCS for w in d.split()}
    primed = {w for d in tb.primer(DOCS) for w in d.split()}
    assert primed and not words & primed


def test_thread_scaling_rows(model_dir):
    """bench_tokenizer.py --scaling: a row per text, path and thread count, timed on new text, with the
    ratio to the first count; stage times only from a build with the stage timers (not this one)."""
    rows = tb.thread_scaling(model_dir, {"mixed": DOCS * 40}, threads=(1, 2), smoke=True)
    # the pool at each count, then 2 separate 1-thread tokenizers on slices (the no-pool reference)
    assert [(r["path"], r["threads"], r["sliced"]) for r in rows] == \
        [(p, n, s) for p in tb.PATHS for n, s in ((1, False), (2, False), (2, True))]
    assert all(r["MB/s"] > 0 and "error" not in r for r in rows)
    assert [r["vs 1 thread"] for r in rows if r["threads"] == 1] == [1.0, 1.0]
    assert all(r["vs 1 thread"] > 0 for r in rows if r["sliced"])
    # the pool's own record of its calls: time inside tasks, and the share of the run it fills
    pool = [r for r in rows if r["threads"] == 2 and not r["sliced"]]
    assert all(r["tasks ms"] > 0 and 0 < r["busy"] <= 1.0 for r in pool), pool
    assert all("tasks ms" not in r for r in rows if r["threads"] == 1 or r["sliced"])
    assert all("stages" not in r for r in rows)  # the default build compiles the timers out
    assert "vs 1 thread" in tb.format_scaling(rows)
    assert "not measured, this build of the extension has no stage timers" in tb.format_scaling(rows)
    # the machine's own ceiling for 2 threads, measured in the same run: more than none, at most 2x
    # (with timing noise)
    assert all(0.3 < r["machine ceiling"] <= 2.6 for r in rows)
    low, high = rows[0]["machine ceiling range"]
    assert low <= rows[0]["machine ceiling"] <= high
    assert "machine ceiling: 2 threads" in tb.format_scaling(rows)
    # the same for work shaped like a tokenizer's (random reads from a cached table)
    assert all(0.3 < r["lookup ceiling"] <= 2.6 for r in rows)
    low, high = rows[0]["lookup ceiling range"]
    assert low <= rows[0]["lookup ceiling"] <= high
    assert "lookup ceiling: 2 threads" in tb.format_scaling(rows)


def test_sliced_peer_encodes_every_text_once_in_order(model_dir):
    """The no-pool reference of --scaling: its slices, joined, are the whole batch's output, cut where
    the characters split evenly (not by text count)."""
    texts = [d * (1 + i % 7) for i, d in enumerate(DOCS * 3)]
    peer, whole = tb.SlicedPeer(model_dir, 2), tb.FastbertPeer(model_dir, 1)
    parts = peer.ids(texts)
    assert len(parts) == 2 and [row for part in parts for row in part] == whole.ids(texts)
    (a, b), (c, d) = peer._slices(texts)
    assert a == 0 and b == c and d == len(texts)
    half = sum(map(len, texts)) / 2
    assert abs(sum(map(len, texts[:b])) - half) <= max(map(len, texts))
    padded = peer.padded(texts)
    assert np.array_equal(np.concatenate([p["input_ids"] for p in padded]), whole.padded(texts)["input_ids"])


def test_idle_gap_rows(model_dir):
    """bench_tokenizer.py --idle-gaps: a row per text, path, gap and thread count, the first count's
    "vs 1 thread" exactly 1, every call timed after its gap (a call cannot take less than nothing)."""
    rows = ig.idle_gaps(model_dir, {"mixed": DOCS * 40}, gaps_ms=(0, 5), threads=(1, 2), smoke=True)
    assert [(r["path"], r["idle gap ms"], r["before"], r["threads"]) for r in rows] == \
        [(p, g, f"idle {g} ms", n) for p in tb.PATHS for g in (0, 5) for n in (1, 2)]
    assert all(r["MB/s"] > 0 and r["ms per call"] > 0 for r in rows)
    assert all(r["vs 1 thread"] == 1.0 for r in rows if r["threads"] == 1)
    # one thread never uses the pool; on two the record of every call is there
    assert all(r["worker tasks"] is None and r["worker start ms"] is None for r in rows if r["threads"] == 1)
    assert all(0 <= r["worker tasks"] <= 1 for r in rows if r["threads"] == 2)
    assert all(r["worker start ms"] is None or r["worker start ms"] >= 0 for r in rows)
    assert "worker start" in ig.format_idle_gaps(rows).splitlines()[0]


def _record_calls(monkeypatch, classes) -> list:
    """Every path call of these peers, in order: (name, threads, first text)."""
    events = []
    for cls in classes:
        for method in tb.PATHS.values():
            def call(self, texts, cls=cls, original=getattr(cls, method)):
                events.append((cls.name, self.threads, texts[0]))
                return original(self, texts)
            monkeypatch.setattr(cls, method, call)
    return events


def test_rows_after_a_peer_time_each_call_right_after_that_peers_call(model_dir, monkeypatch):
    """bench_tokenizer.py --after: before every timed fastbert call, the named peer (at the same thread
    count) encodes other new text; an unknown peer is refused by name."""
    events = _record_calls(monkeypatch, (tb.FastbertPeer, tb.TokenizersPeer))
    rows = ig.idle_gaps(model_dir, {"mixed": DOCS * 40}, gaps_ms=(), threads=(1, 2), smoke=True,
                        after=("tokenizers",))
    assert [(r["path"], r["before"], r["idle gap ms"], r["threads"]) for r in rows] == \
        [(p, "tokenizers", None, n) for p in tb.PATHS for n in (1, 2)]
    assert all(r["MB/s"] > 0 for r in rows) and "tokenizers" in ig.format_idle_gaps(rows)
    timed = [i for i, e in enumerate(events) if e[0] == "fastbert" and i > 0 and events[i - 1][0] == "tokenizers"]
    assert len(timed) == len(rows)  # every timed call came right after the peer's
    for i in timed:
        assert events[i - 1][1] == events[i][1]  # the peer at the same thread count
        assert events[i - 1][2] != events[i][2]  # on other text
    with pytest.raises(ValueError, match="nope"):
        ig.idle_gaps(model_dir, {"mixed": DOCS}, gaps_ms=(), threads=(1,), smoke=True, after=("nope",))


def test_rows_after_a_peer_at_a_fixed_count_put_that_call_before_every_count(model_dir, monkeypatch):
    """--after NAME/THREADS: the peer runs at that count before every timed call, a serial call before
    each 2-thread one too (what the peers' table has half the time); a bad count is refused by name."""
    monkeypatch.setattr(tb, "PATHS", {"ids": "ids"})
    recorded = _record_calls(monkeypatch, (tb.FastbertPeer, tb.TokenizersPeer))
    rows = ig.idle_gaps(model_dir, {"mixed": DOCS * 40}, gaps_ms=(), threads=(1, 2), smoke=True,
                        after=("tokenizers/1", "fastbert/1"))
    events = [e[:2] for e in recorded]  # (name, threads)
    assert [(r["before"], r["threads"]) for r in rows] == \
        [("tokenizers/1", 1), ("tokenizers/1", 2), ("fastbert/1", 1), ("fastbert/1", 2)]
    fastbert_calls = [i for i, e in enumerate(events) if e[0] == "fastbert"]
    # each timed call (the 2-thread ones included) right after a serial call of the named peer
    pairs = {(events[i - 1], events[i][1]) for i in fastbert_calls[2:] if events[i - 1][0] == "tokenizers"}
    assert pairs == {(("tokenizers", 1), 1), (("tokenizers", 1), 2)}
    with pytest.raises(ValueError, match="tokenizers/3.*1 or"):
        ig.idle_gaps(model_dir, {"mixed": DOCS}, gaps_ms=(), threads=(1,), smoke=True, after=("tokenizers/3",))
    with pytest.raises(ValueError, match="fastbert/x"):
        ig.idle_gaps(model_dir, {"mixed": DOCS}, gaps_ms=(), threads=(1,), smoke=True, after=("fastbert/x",))


def test_work_counts_only_the_extensions_own_functions(tmp_path):
    out = tmp_path / "cachegrind.out"
    out.write_text("events: Ir\nfl=???\n"
                   "fn=fastbert::Tokenizer::encode_chunks(char const*) const\n10 100\n11 20\n"
                   "fn=PyEval_EvalFrameDefault\n5 1000\n"
                   "fn=(anonymous namespace)::PyTokenizer::encode_batch(pybind11::object)\n7 3\n"
                   "fn=fastbert::ThreadPool::worker_loop()\n3 500\n"
                   "fn=void fastbert::(anonymous namespace)::spin_until<F>(F, long)\n4 700\n"
                   "fn=fastbert::WordPiece::tokenize(fastbert::Word const&) const\n1 7\n")
    counts = tw.extension_instructions(str(out))
    assert counts == {"fastbert::Tokenizer::encode_chunks(char const*) const": 120,
                      "(anonymous namespace)::PyTokenizer::encode_batch(pybind11::object)": 3,
                      "fastbert::WordPiece::tokenize(fastbert::Word const&) const": 7}


def test_work_refuses_unknown_text_path_and_batches(model_dir, monkeypatch):
    # refused before any child runs, so a valgrind that is not there is never started
    monkeypatch.setattr(tw.shutil, "which", lambda name: "/nonexistent/valgrind")
    with pytest.raises(ValueError, match="path must be one of"):
        tw.thread_work(model_dir, paths=("padded",))
    with pytest.raises(ValueError, match="text must be one of"):
        tw.thread_work(model_dir, texts=("klingon",))
    with pytest.raises(ValueError, match="batches must be at least 1"):
        tw.thread_work(model_dir, batches=0)
    monkeypatch.setattr(tw.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="needs valgrind"):
        tw.thread_work(model_dir)


def test_evict_is_an_argument_of_the_timing_not_a_module_setting(monkeypatch):
    evictions = []
    monkeypatch.setattr(tb, "evict_cpu_caches", lambda: evictions.append(1))
    calls = {"a": (_recorder({}, "a"), None)}
    tb.time_interleaved(calls, tb.Rounds(DOCS, itertools.count(1)), repeats=2)
    assert evictions == []
    tb.time_interleaved(calls, tb.Rounds(DOCS, itertools.count(1)), repeats=2, evict=True)
    assert len(evictions) == 3  # the first pass and each timed round
    assert not hasattr(tb, "EVICT")
