"""Idle-gap probes, research tooling for the tokenizer's thread pool (bench/bench_tokenizer.py
--idle-gaps / --after): fastbert at each thread count when every call comes after the machine idled,
or right after another tokenizer's call. Not part of `fastbert bench`; the measurement pieces it
reuses (peers, rounds of new text) are fastbert.benchmarks.tokenizer's.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import os
import statistics
import time

from fastbert.benchmarks import tokenizer as tb


def idle_gaps(model_dir, texts=None, gaps_ms=(0, 1, 3, 10, 30, 100), threads=(1, 2), quick=False, progress=None,
              *, smoke=False, after=()) -> list[dict]:
    """fastbert at each thread count when every call comes after the machine idled for a while: for each
    gap, rounds of (sleep the gap, then one call) for each count in turn, on text new to it every round.
    One row per text, path, gap and count, with the median ms per call, MB/s and "vs 1 thread" (the first
    count's median over this one's, same gap). A thread pool gains only while its cores are running: a
    core that idled (here: a virtual CPU that its host put to sleep) takes time to run again, and that
    falls on the worker that the call wakes. Rows of more than one thread show it: "worker tasks" (the
    share of the batches' tasks that the pool's workers ran; the calling thread ran the rest) and
    "worker start ms" (median time from the start of a batch's tasks to a worker's first one, over the
    calls where a worker ran any; None when none did).

    after: names of peers (tb.PEERS) whose call on as much other new text comes right before each timed
    call instead of a gap, as in the peers' table: with fastbert's thread count (1: serial; more: the
    peer's own parallel mode), or "NAME/THREADS" at that count before every call (a serial call before a
    2-thread one, as the peers' table has it half the time; "fastbert/1" is fastbert's own). Their rows
    have "before" set to the name as given and no "idle gap ms"; they show what another call's work
    costs the next call (CPU caches, TLB, cores)."""
    say = progress or (lambda message: None)
    if not isinstance(texts, dict):
        texts = tb.default_texts(quick=quick, smoke=smoke)
        if quick:
            texts = {"english": texts["english"]}
    repeats = 1 if smoke else 7 if quick else 15
    threads = tb.resolve_threads(threads)
    before = {label: _before_peer(label) for label in after}  # label -> (peer class, its count or None)
    tags = itertools.count(1)
    common = {"device": tb.device(), "versions": tb.versions(),
              "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    peers = {n: tb.FastbertPeer(model_dir, n) for n in threads}
    # label -> {fastbert's count: the peer that runs before its calls}
    before_peers = {label: {n: cls(model_dir, fixed or n) for n in threads} for label, (cls, fixed) in before.items()}
    conditions = [(f"idle {gap} ms", gap, None) for gap in gaps_ms] + [(name, None, name) for name in after]
    rows = []
    for text_name, docs in texts.items():
        for path, method in tb.PATHS.items():
            for p in peers.values():
                getattr(p, method)(tb.primer(docs))  # threads started, buffers mapped
            for label, gap, peer_name in conditions:
                say(f"{text_name}: {path}, before each call: {label}, threads {threads}")
                seconds = {n: [] for n in threads}
                pool_runs = {n: [] for n in threads}  # the pool's record of each call that used it
                for _ in range(repeats):
                    texts_now = tb.unseen(docs, next(tags))
                    other = tb.unseen(docs, next(tags)) if peer_name else None
                    for n, p in peers.items():
                        p.clear_cache()
                        if gap:
                            time.sleep(gap / 1e3)
                        if peer_name:
                            peer = before_peers[peer_name][n]
                            peer.before_call()
                            getattr(peer, method)(other)
                        runs_before = p.tok._core.pool_last_run()["runs"]
                        start = time.perf_counter()
                        getattr(p, method)(texts_now)
                        seconds[n].append(time.perf_counter() - start)
                        record = p.tok._core.pool_last_run()
                        if record["runs"] != runs_before:
                            pool_runs[n].append(record)
                nbytes = tb.corpus.total_bytes(texts_now)
                first = statistics.median(seconds[threads[0]])
                for n in threads:
                    median = statistics.median(seconds[n])
                    rows.append({"name": "fastbert", "text": text_name, "path": path, "before": label,
                                 "idle gap ms": gap, "threads": n, "ms per call": 1e3 * median,
                                 "MB/s": nbytes / median / 1e6, "vs 1 thread": first / median, "repeats": repeats,
                                 **_worker_figures(pool_runs[n]), **common})
    return rows


def _before_peer(label: str) -> tuple[type, int | None]:
    """idle_gaps' "NAME" -> (the peer's class, None: it runs at fastbert's count) or "NAME/THREADS"
    -> (the class, that count)."""
    name, _, count = label.partition("/")
    if name not in tb.PEERS_BY_NAME:
        raise ValueError(f"after: unknown peer {name!r} in {label!r}; the peers are {list(tb.PEERS_BY_NAME)}")
    if not count:
        return tb.PEERS_BY_NAME[name], None
    cores = os.cpu_count() or 1
    allowed = "a whole number from 1" if name == tb.FastbertPeer.name else f"1 or {cores} (its pool takes all cores)"
    if not count.isdigit() or int(count) < 1 or (name != tb.FastbertPeer.name and int(count) not in (1, cores)):
        raise ValueError(f"after: {label!r}: {name}'s thread count after '/' must be {allowed}")
    return tb.PEERS_BY_NAME[name], int(count)


def _worker_figures(records: list[dict]) -> dict:
    """idle_gaps' worker columns from the pool's records of a row's calls (none: the calls ran on the
    calling thread alone, as one thread does)."""
    if not records:
        return {"worker tasks": None, "worker start ms": None}
    starts = [r["worker_start_us"] / 1e3 for r in records if r["worker_start_us"] is not None]
    return {"worker tasks": sum(r["worker_tasks"] for r in records) / sum(r["tasks"] for r in records),
            "worker start ms": statistics.median(starts) if starts else None}


def format_idle_gaps(rows: list[dict]) -> str:
    """Plain-text table of idle_gaps' rows."""
    head = (f"{'text':<13}{'path':<10}{'before each call':>19}{'thr':>4}{'ms/call':>9}{'MB/s':>9}"
            f"{'vs 1 thread':>13}{'worker tasks':>14}{'worker start':>14}")
    lines = [head, "-" * len(head)]
    for r in rows:
        share = f"{r['worker tasks']:.0%}" if r.get("worker tasks") is not None else "-"
        start = f"{r['worker start ms']:.3f} ms" if r.get("worker start ms") is not None else "-"
        lines.append(f"{r['text']:<13}{r['path']:<10}{r['before']:>19}{r['threads']:>4}{r['ms per call']:>9.2f}"
                     f"{r['MB/s']:>9.1f}{r['vs 1 thread']:>12.2f}x{share:>14}{start:>14}")
    return "\n".join(lines)
