"""Tokenizer latency: one short text per call, as a request handler or a Python loop over texts calls it.

Two calls, each against the peers that have it:
  "ids"           the ids of one text: fastbert.encode, nanotoken.encode (a numpy array), HF tokenizers
                  Tokenizer.encode(text).ids, BertTokenizerFast.encode;
  "model inputs"  the dict a model takes (input_ids, token_type_ids, attention_mask):
                  fastbert(text), BertTokenizerFast(text).
Each round calls every peer once on every sentence, in turn (in the orders of tokenizer.round_orders,
each peer right after every other equally often), after clearing its caches, on the sentences under a
tag no earlier round or call used (a number and a space before each, built before timing;
tokenizer.Rounds): every text is new to every tokenizer, so no whole-text or word cache answers from
an earlier round. The figure is the median over rounds of (round time / sentences), in microseconds
per call; calls/s is its inverse. Every output is compared with BertTokenizerFast's ids for the same
sentences, on the untimed first round (round 0).
"""
from __future__ import annotations

import datetime as _dt
import itertools
import statistics
import time

from fastbert.benchmarks import corpus
from fastbert.benchmarks.tokenizer import (REFERENCE, FastbertPeer, NanotokenPeer, Rounds, TokenizersPeer,
                                           TransformersPeer, device, round_orders, versions)

CALLS = ("ids", "model inputs")


def _one_text_calls(peer) -> dict:
    """{call: fn(text) -> ids} for the calls this peer has (the model-inputs call returns its input_ids)."""
    if isinstance(peer, (FastbertPeer, TransformersPeer)):
        return {"ids": peer.tok.encode, "model inputs": lambda text: peer.tok(text)["input_ids"]}
    if isinstance(peer, NanotokenPeer):
        return {"ids": peer.tok.encode}
    if isinstance(peer, TokenizersPeer):
        return {"ids": lambda text: peer.plain.encode(text).ids}
    return {}


def sentences(count: int) -> list[str]:
    """The first ``count`` lines of the English benchmark text (paragraphs of the Python docs, one per
    line): real inputs of a few dozen to a few hundred bytes."""
    return corpus.english_lines()[:count]


def run(model_dir, quick=False, smoke=False, progress=None, texts=None, **_) -> list[dict]:
    """One row per (call, tokenizer): us/call, calls/s, MB/s and whether the ids equal BertTokenizerFast's."""
    say = progress or (lambda message: None)
    docs = list(texts) if isinstance(texts, list) else sentences(40 if smoke else 500 if quick else 2000)
    rounds = 1 if smoke else 8 if quick else 12  # whole cycles of round_orders for 4 peers
    say(f"one text per call: {len(docs)} sentences, reference ({REFERENCE})")
    peers = {}
    for cls in (FastbertPeer, NanotokenPeer, TokenizersPeer, TransformersPeer):
        try:
            peers[cls.name] = cls(model_dir, 1)
        except Exception as exc:  # an unavailable peer is a row with a note, not a crash
            peers[cls.name] = exc
    peers[REFERENCE].before_repeat()
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows = [{"text": "english", "path": "ids", "threads": 1, "name": name, "us/call": None, "calls/s": None,
             "MB/s": None, "ids_match": None, "error": f"{type(peer).__name__}: {peer}"}
            for name, peer in peers.items() if isinstance(peer, Exception)]
    tags = itertools.count(1)  # one counter for the run: no two rounds of any call share a text
    for call in CALLS:
        fns = {name: _one_text_calls(p).get(call) for name, p in peers.items() if not isinstance(p, Exception)}
        fns = {name: fn for name, fn in fns.items() if fn is not None}
        texts = Rounds(docs, tags)
        expected = [peers[REFERENCE].tok.encode(text) for text in texts(0)]
        outputs = {}
        for name, fn in fns.items():  # round 0, untimed: warm-up and the output check
            peers[name].clear_cache()
            outputs[name] = [list(map(int, fn(text))) for text in texts(0)]
        times = {name: [] for name in fns}
        for r, order in enumerate(round_orders(list(fns), rounds), start=1):
            say(f"one text per call, {call}: round {r}/{rounds}")
            round_texts = texts(r)
            for name in order:
                peers[name].before_call()
                fn = fns[name]
                start = time.perf_counter()
                for text in round_texts:
                    fn(text)
                times[name].append((time.perf_counter() - start) / len(round_texts))
        nbytes = corpus.total_bytes(texts(1))
        for name in fns:
            seconds = statistics.median(times[name])
            rows.append({"text": "english", "path": call, "threads": 1, "name": name, "sentences": len(docs),
                         "bytes": nbytes, "us/call": seconds * 1e6, "calls/s": 1 / seconds,
                         "MB/s": nbytes / len(docs) / seconds / 1e6, "ids_match": outputs[name] == expected,
                         "text seen": "new each round", "rounds": rounds, "device": device(),
                         "versions": versions(), "timestamp": stamp})
    fast = {r["path"]: r["us/call"] for r in rows if r["name"] == "fastbert" and r.get("us/call")}
    for r in rows:
        r["fastbert speedup"] = r["us/call"] / fast[r["path"]] if r.get("us/call") and r["path"] in fast else None
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'call':<14}{'tokenizer':<19}{'us/call':>9}{'calls/s':>11}{'ids':>6}{'fastbert is':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = {True: "ok", False: "FAIL", None: "-"}[r.get("ids_match")]
        us = f"{r['us/call']:.2f}" if r.get("us/call") else "-"
        rate = f"{r['calls/s']:,.0f}" if r.get("calls/s") else "-"
        speed = f"{r['fastbert speedup']:.2f}x" if r.get("fastbert speedup") and r["name"] != "fastbert" else ""
        lines.append(f"{r['path']:<14}{r['name']:<19}{us:>9}{rate:>11}{ok:>6}{speed:>13}")
        if r.get("error"):
            lines.append(f"{'':<14}{r['error'][:200]}")
    return "\n".join(lines)
