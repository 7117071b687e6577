"""Every route of `fastbert serve`, in-process (httpx on the ASGI app), against the library call it
stands for: /v1/embeddings and /embed against fastbert.Encoder.encode (within 1e-6), /rerank and
/predict against sentence-transformers' CrossEncoder, /embed_sparse against its SparseEncoder,
/tokenize against the tokenizer; /info, /health, /metrics; a model's kind decides its routes."""
import asyncio
import base64
import copy

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason="fastbert serve needs the serve extra (fastapi)")
pytest.importorskip("prometheus_client", reason="fastbert serve needs the serve extra (prometheus-client)")

from fastbert.serve.app import create_app  # noqa: E402
from fastbert.serve.runner import load  # noqa: E402
from serve_helpers import call, post, tiny_checkpoints  # noqa: E402

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog near the river bank.",
         "野口里佳 Noguchi Rika", "UNwant\u00E9d,running", "a " * 120 + "end"]
TOL = 1e-6


@pytest.fixture(scope="module")
def runner(model_dir):
    return load(model_dir, device="cpu")


@pytest.fixture(scope="module")
def app(runner):
    return create_app(runner, model_name="minilm")


@pytest.fixture(scope="module")
def encoder(runner):
    return runner.encoder


def close(a, b, tol=TOL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.abs(a - b).max() <= tol, f"max abs diff {np.abs(a - b).max():.2e}"


def test_openai_embeddings_equal_encode(app, encoder):
    r = post(app, "/v1/embeddings", {"input": TEXTS, "model": "any-name"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS))) and body["model"] == "any-name"
    close([d["embedding"] for d in body["data"]], encoder.encode(TEXTS))
    tokens = sum(len(ids) for ids in encoder.tokenizer(TEXTS)["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    one = post(app, "/v1/embeddings", {"input": TEXTS[1]}).json()
    assert len(one["data"]) == 1 and one["model"] == "minilm"
    close(one["data"][0]["embedding"], encoder.encode(TEXTS[1]))


def test_openai_dimensions_base64_and_token_ids(app, encoder):
    b64 = post(app, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64", "dimensions": 64}).json()
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]]
    reference = encoder.encode(TEXTS, truncate_dim=64, normalize_embeddings=True)   # OpenAI's: unit length
    close(vectors, reference)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    ids = encoder.tokenizer(TEXTS[:2])["input_ids"]
    by_ids = post(app, "/v1/embeddings", {"input": ids}).json()
    close([d["embedding"] for d in by_ids["data"]], encoder.encode(TEXTS[:2]))
    single = post(app, "/v1/embeddings", {"input": ids[0]}).json()
    assert len(single["data"]) == 1 and single["usage"]["prompt_tokens"] == len(ids[0])


def test_embed_normalize_dimensions_and_truncation(app, encoder):
    close(post(app, "/embed", {"inputs": TEXTS}).json(), encoder.encode(TEXTS))
    raw = copy.copy(encoder)
    raw.normalize = False                           # TEI's normalize=false: the pooled vectors as they are
    close(post(app, "/embed", {"inputs": TEXTS, "normalize": False}).json(), raw.encode(TEXTS))
    close(post(app, "/embed", {"inputs": TEXTS, "normalize": False, "dimensions": 32}).json(),
          raw.encode(TEXTS, truncate_dim=32))
    close(post(app, "/embed", {"inputs": TEXTS[0]}).json(), encoder.encode(TEXTS[:1]))
    long = "the river " * 200 + "and then a different ending entirely"
    right = post(app, "/embed", {"inputs": long, "truncate": True}).json()
    close(right, encoder.encode([long]))            # Encoder.encode cuts on the right at max_seq_length
    left = post(app, "/embed", {"inputs": long, "truncate": True, "truncation_direction": "Left"}).json()
    ids = encoder.tokenizer(long, add_special_tokens=False)["input_ids"]
    tail = [encoder.tokenizer.cls_token_id] + ids[-(encoder.max_seq_length - 2):] + [encoder.tokenizer.sep_token_id]
    close(left, [post(app, "/v1/embeddings", {"input": tail}).json()["data"][0]["embedding"]])
    assert np.abs(np.array(left) - np.array(right)).max() > 1e-2


def test_json_without_orjson_is_the_same(app, monkeypatch):
    """orjson writes a float32 in its shortest form, the standard library's json the float64 it
    widens to: read back as float32, the same vectors, bit for bit; and the same answer otherwise."""
    import fastbert.serve.app as app_module

    if app_module.orjson is None:
        pytest.skip("orjson is not installed: the standard library's json is the only writer here")
    fast = post(app, "/v1/embeddings", {"input": TEXTS[:3]}).json()
    fast_embed = post(app, "/embed", {"inputs": TEXTS[:3], "dimensions": 16}).json()
    monkeypatch.setattr(app_module, "orjson", None)
    slow = post(app, "/v1/embeddings", {"input": TEXTS[:3]}).json()
    slow_embed = post(app, "/embed", {"inputs": TEXTS[:3], "dimensions": 16}).json()
    vectors = [np.array([d["embedding"] for d in body.pop("data")], dtype=np.float32) for body in (fast, slow)]
    assert np.array_equal(*vectors) and vectors[0].shape == (3, 384) and fast == slow
    assert np.array_equal(np.array(fast_embed, dtype=np.float32), np.array(slow_embed, dtype=np.float32))


def test_embed_prompts_in_one_batch(runner):
    """Requests with different prompts share batches; a prompt pooling leaves out (include_prompt
    false) is skipped per row."""
    encoder = copy.copy(runner.encoder)
    encoder.prompts = {**encoder.prompts, "query": "query: ", "passage": "a passage about: "}
    encoder.include_prompt = False
    encoder._prompt_lengths = {}
    prompted = copy.copy(runner)
    prompted.encoder = encoder
    app = create_app(prompted)
    r = call(app, *[("POST", "/embed", {"inputs": TEXTS, "prompt_name": name}) for name in ("query", "passage")],
             ("POST", "/embed", {"inputs": TEXTS}))
    assert [x.status_code for x in r] == [200, 200, 200]
    close(r[0].json(), encoder.encode(TEXTS, prompt_name="query"))
    close(r[1].json(), encoder.encode(TEXTS, prompt_name="passage"))
    close(r[2].json(), encoder.encode(TEXTS))
    assert np.abs(np.array(r[0].json()) - np.array(r[2].json())).max() > 1e-3


def test_tokenize(app, encoder):
    texts = ["héllo world", "UNwant\u00E9d,running"]
    body = post(app, "/tokenize", {"inputs": texts}).json()
    enc = encoder.tokenizer(texts)
    assert [[t["id"] for t in row] for row in body] == enc["input_ids"]
    assert body[0][0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [(t["text"], t["start"], t["stop"]) for t in body[0][1:-1]] == [("héllo", 0, 5), ("world", 6, 11)]
    bare = post(app, "/tokenize", {"inputs": texts[1], "add_special_tokens": False}).json()
    assert [t["id"] for t in bare[0]] == enc["input_ids"][1][1:-1]


def test_info_health_metrics(app, runner):
    assert call(app, ("GET", "/health"))[0].json() == {"status": "ok"}
    info = call(app, ("GET", "/info"))[0].json()
    assert info["model_type"] == "embedding" and info["max_input_length"] == runner.limit == 256
    assert info["dimensions"] == 384 and info["max_batch_tokens"] == 16384
    assert set(info["routes"]) == {"/v1/embeddings", "/embed", "/tokenize"}
    post(app, "/embed", {"inputs": ["x"]})
    post(app, "/embed", {"inputs": ""})
    text = call(app, ("GET", "/metrics"))[0].text
    for name in ('fastbert_requests_total{route="/embed",status="200"}',
                 'fastbert_requests_total{route="/embed",status="422"}', "fastbert_queue_size 0.0",
                 "fastbert_queue_seconds_count", "fastbert_tokenize_seconds_count",
                 "fastbert_inference_seconds_count", "fastbert_batch_tokens_count", "fastbert_requests_in_flight 0.0"):
        assert name in text, name
    counts = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert counts["fastbert_inference_seconds_count"] >= 1 and counts["fastbert_batch_tokens_sum"] >= 3


def test_routes_follow_the_model_kind(app):
    r = post(app, "/rerank", {"query": "a", "texts": ["b"]})
    assert r.status_code == 400 and "embedding model" in r.json()["error"] and "/embed" in r.json()["error"]
    assert post(app, "/embed_sparse", {"inputs": "a"}).status_code == 400
    assert post(app, "/predict", {"inputs": "a"}).status_code == 400


# ------------------------------------------------------------ rerankers, classifiers, SPLADE
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("serve_tiny"))


@pytest.fixture(scope="module")
def st():
    return pytest.importorskip("sentence_transformers")


PAIRS_Q = "john lives in paris"
DOCS = ["the movie was great !", "a", "what is the weather in new york city today ?", "john lives in paris"]


def test_rerank_and_predict_equal_cross_encoder(tiny, st):
    app = create_app(load(tiny["reranker"], device="cpu"))
    ce = st.CrossEncoder(tiny["reranker"], device="cpu")
    pairs = [(PAIRS_Q, d) for d in DOCS]
    scores = ce.predict(pairs)                                     # sigmoid of the logit
    assert scores.std() > 1e-3
    body = post(app, "/rerank", {"query": PAIRS_Q, "texts": DOCS, "return_text": True}).json()
    assert [x["index"] for x in body] == list(np.argsort(-scores, kind="stable"))
    close([x["score"] for x in body], np.sort(scores)[::-1], 1e-5)
    assert [x["text"] for x in body] == [DOCS[x["index"]] for x in body]
    raw = post(app, "/rerank", {"query": PAIRS_Q, "texts": DOCS, "raw_scores": True}).json()
    close(sorted(x["score"] for x in raw), np.sort(ce.predict(pairs, activation_fn=torch.nn.Identity())), 1e-5)
    assert "text" not in raw[0]
    one = post(app, "/predict", {"inputs": [PAIRS_Q, DOCS[0]]}).json()      # [a, b] is one pair, as TEI reads it
    assert one[0]["label"] == "LABEL_0" and abs(one[0]["score"] - scores[0]) < 1e-5
    many = post(app, "/predict", {"inputs": [[PAIRS_Q, d] for d in DOCS]}).json()
    close([m[0]["score"] for m in many], scores, 1e-5)
    assert post(app, "/embed", {"inputs": "a"}).status_code == 400


def test_predict_classifier_softmax(tiny, st):
    app = create_app(load(tiny["classifier"], device="cpu"))
    ce = st.CrossEncoder(tiny["classifier"], device="cpu")
    probs = ce.predict([(PAIRS_Q, d) for d in DOCS], apply_softmax=True)
    body = post(app, "/predict", {"inputs": [[PAIRS_Q, d] for d in DOCS]}).json()
    for row, ref in zip(body, probs):
        got = {x["label"]: x["score"] for x in row}
        close([got[k] for k in ("contradiction", "neutral", "entailment")], ref, 1e-5)
        assert [x["score"] for x in row] == sorted((x["score"] for x in row), reverse=True)
    single = post(app, "/predict", {"inputs": "the movie was great !"}).json()
    assert len(single) == 3 and abs(sum(x["score"] for x in single) - 1) < 1e-5
    assert post(app, "/rerank", {"query": "a", "texts": ["b"]}).status_code == 400


def test_embed_sparse_equals_sparse_encoder(tiny, st):
    app = create_app(load(tiny["sparse"], device="cpu"))
    ref = st.SparseEncoder(tiny["sparse"], device="cpu").encode(DOCS).to_dense().numpy()
    body = post(app, "/embed_sparse", {"inputs": DOCS}).json()
    dense = np.zeros_like(ref)
    for row, items in zip(dense, body):
        assert all(x["value"] > 0 for x in items)
        row[[x["index"] for x in items]] = [x["value"] for x in items]
    assert (ref > 0).sum() > 10
    assert ((dense > 0) == (ref > 0)).all()
    close(dense, ref, 1e-5)
    assert post(app, "/v1/embeddings", {"input": "a"}).status_code == 400


def test_concurrent_requests_share_batches(runner):
    """Requests that arrive together are answered from shared batches, each with its own rows."""
    from serve_helpers import gated

    slow = gated(runner)
    app = create_app(slow)

    async def main():
        import httpx
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as client:
            first = asyncio.ensure_future(client.post("/embed", json={"inputs": TEXTS[:1]}))
            while not slow.batches:                     # the model thread holds the first batch
                await asyncio.sleep(0.01)
            rest = [asyncio.ensure_future(client.post("/embed", json={"inputs": [t]})) for t in TEXTS[1:]]
            while app.state.server.batcher.queued < len(TEXTS) - 1:
                await asyncio.sleep(0.01)
            slow.gate.set()
            return [r.json() for r in await asyncio.gather(first, *rest)]

    answers = asyncio.run(main())
    assert len(slow.batches) == 2 and len(slow.batches[1]) == len(TEXTS) - 1      # the queued four, together
    assert [len(r) for r in slow.batches[1]] == sorted((len(r) for r in slow.batches[1]), reverse=True)
    close([a[0] for a in answers], runner.encoder.encode(TEXTS))
