"""Exercises fastbert._C for the leak check (leak_check.sh runs it under LeakSanitizer): tokenizers
built and dropped, N small calls, batches with every output option, threads, and the error paths.
Usage: python leak_workload.py VOCAB_DIR [N_SMALL_CALLS]"""
import gc
import sys
import threading

import fastbert

path = sys.argv[1]
n_small = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
texts = ["hello world", "UNwant\u00e9d,running", "野口里佳 Noguchi Rika", "\ufeffHello [MASK] x",
         "a" * 150 + " e\u0301" * 20, "\U0001f600 \u200b\u3000 ok"]
for _ in range(3):  # construction / destruction
    tok = fastbert.BertTokenizer.from_pretrained(path, num_threads=4)
    tok(texts * 50, texts[::-1] * 50, padding=True, truncation=True, max_length=16, stride=4,
        return_overflowing_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True,
        return_tensors="np")
    del tok
    gc.collect()
tok = fastbert.BertTokenizer.from_pretrained(path, num_threads=4)
for i in range(n_small):
    tok(texts[i % len(texts)], return_offsets_mapping=(i % 2 == 0))
for kw in (dict(), dict(padding=True, return_tensors="pt"), dict(is_split_into_words=True)):
    batch = [t.split() for t in texts] if kw.get("is_split_into_words") else texts * 20
    tok(batch, **kw)
tok.batch_decode(tok(texts)["input_ids"])
for bad in (["ok", 3], ["lone \ud800 surrogate"]):  # error paths must free what they built
    try:
        tok(bad)
    except (TypeError, ValueError):
        pass
try:
    tok(texts[0], truncation=True, max_length=3, stride=5, return_overflowing_tokens=True)
except Exception:
    pass
threads = [threading.Thread(target=lambda tok=tok: [tok(texts * 10) for _ in range(20)]) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
del tok, threads
gc.collect()
print("workload done")
