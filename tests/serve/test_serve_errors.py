"""Bad input and overload in `fastbert serve`: every case is a 4xx JSON error that names the field
(OpenAI's error shape under /v1/, TEI's elsewhere), never a 500 or a hang; 429 at once above
--max-concurrent; a client that disconnects has its queued rows dropped; the API key is checked."""
import asyncio
import json

import pytest

pytest.importorskip("fastapi", reason="fastbert serve needs the serve extra (fastapi)")
pytest.importorskip("prometheus_client", reason="fastbert serve needs the serve extra (prometheus-client)")

from fastbert.serve.app import create_app  # noqa: E402
from fastbert.serve.runner import load  # noqa: E402
from serve_helpers import call, gated, post  # noqa: E402

LIMIT = 64 << 10       # the test app's body limit


@pytest.fixture(scope="module")
def runner(model_dir):
    return load(model_dir, device="cpu")


@pytest.fixture(scope="module")
def app(runner):
    return create_app(runner, max_body_bytes=LIMIT, api_key=None)


LONG = "word " * 300          # 302 tokens with [CLS] and [SEP]; MiniLM's limit is 256

BAD = [  # (path, body, status, field, words the message must hold)
    ("/v1/embeddings", {"input": ""}, 422, "input", "empty string"),
    ("/v1/embeddings", {"input": []}, 422, "input", "empty list"),
    ("/v1/embeddings", {"input": ["ok", ""]}, 422, "input", "input[1] is an empty string"),
    ("/v1/embeddings", {"input": 5}, 422, "input", "got int"),
    ("/v1/embeddings", {"input": [1.5]}, 422, "input", "input[0] must be a string"),
    ("/v1/embeddings", {"input": ["a", 3]}, 422, "input", "input[1] must be a string"),
    ("/v1/embeddings", {"input": [[101, "x"]]}, 422, "input", "input[0][1] must be a token id"),
    ("/v1/embeddings", {"input": ["a", [101]]}, 422, "input", "mixes strings and token ids"),
    ("/v1/embeddings", {"input": [101, 99999999, 102]}, 422, "input", "not a token id of this model"),
    ("/v1/embeddings", {"input": [[]]}, 422, "input", "empty list of token ids"),
    ("/v1/embeddings", {"input": ["a"] * 2049}, 422, "input", "at most 2048"),
    ("/v1/embeddings", {}, 422, "input", "Field required"),
    ("/v1/embeddings", {"input": "a", "dimensions": "3"}, 422, "dimensions", "valid integer"),
    ("/v1/embeddings", {"input": "a", "dimensions": 0}, 422, "dimensions", "greater than or equal to 1"),
    ("/v1/embeddings", {"input": "a", "dimensions": 385}, 422, "dimensions", "more than the model's 384"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "base65"}, 422, "encoding_format", "'float' or 'base64'"),
    ("/v1/embeddings", {"input": "a", "model": 7}, 422, "model", "valid string"),
    ("/v1/embeddings", {"input": "a", "extra_thing": 1}, 422, "extra_thing", "unknown field"),
    ("/v1/embeddings", {"input": LONG}, 413, "input", "302 tokens, more than the model's limit of 256"),
    ("/v1/embeddings", [1, 2], 422, "body", "must be a JSON object"),
    ("/v1/embeddings", b'{"input": "caf\xe9"}', 400, "body", "not valid UTF-8"),
    ("/v1/embeddings", b'{"input": "abc"', 400, "body", "not valid JSON"),
    ("/v1/embeddings", b"", 400, "body", "not valid JSON"),
    ("/v1/embeddings", json.dumps({"input": "x" * LIMIT}).encode(), 413, "body", "limit of 65536"),
    ("/embed", {"inputs": LONG}, 413, "inputs",
     '302 tokens, more than the model\'s limit of 256; send shorter input or set "truncate": true'),
    ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "normalize", "valid boolean"),
    ("/embed", {"inputs": "a", "truncate": 1}, 422, "truncate", "valid boolean"),
    ("/embed", {"inputs": "a", "truncation_direction": "up"}, 422, "truncation_direction", "'right'"),
    ("/embed", {"inputs": "a", "prompt_name": "nope"}, 422, "prompt_name", "not one of this model's prompts"),
    ("/embed", {"inputs": None}, 422, "inputs", "got NoneType"),
    ("/embed", {"input": "a"}, 422, "inputs", "inputs: Field required; input: unknown field"),
    ("/tokenize", {"inputs": ["a", None]}, 422, "inputs", "inputs[1] must be a string"),
    ("/tokenize", {"inputs": "a", "add_special_tokens": "no"}, 422, "add_special_tokens", "valid boolean"),
    ("/rerank", {"query": "a", "texts": ["b"]}, 400, None, "does not serve /rerank"),
]


@pytest.mark.parametrize("path,body,status,field,words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_a_4xx_naming_the_field(app, path, body, status, field, words):
    r = post(app, path, body)
    assert r.status_code == status, r.text
    data = r.json()
    if path.startswith("/v1/"):                            # OpenAI's shape, which its client reads
        assert data["error"]["param"] == field and data["error"]["type"] == "invalid_request_error"
        message = data["error"]["message"]
    else:
        assert data["field"] == field and data["error_type"]
        message = data["error"]
    assert words in message, message


def test_server_still_answers_after_bad_input(app, runner):
    for path, body, *_ in BAD[:5]:
        post(app, path, body)
    r = post(app, "/embed", {"inputs": ["still here"]})
    assert r.status_code == 200 and len(r.json()[0]) == 384


def test_over_the_cap_answers_429_at_once(runner):
    slow = gated(runner)
    app = create_app(slow, max_concurrent=2)

    async def main():
        import httpx
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as client:
            held = [asyncio.ensure_future(client.post("/embed", json={"inputs": [f"text {i}"]})) for i in range(2)]
            while app.state.server.in_flight < 2:
                await asyncio.sleep(0.01)
            over = await asyncio.wait_for(client.post("/v1/embeddings", json={"input": "one more"}), 5)
            tei = await asyncio.wait_for(client.post("/embed", json={"inputs": "one more"}), 5)
            health = await client.get("/health")                 # not counted against the cap
            slow.gate.set()
            done = await asyncio.gather(*held)
            after = await client.post("/embed", json={"inputs": "after"})
            return over, tei, health, done, after

    over, tei, health, done, after = asyncio.run(main())
    assert over.status_code == 429 and over.headers["retry-after"] == "1"
    assert over.json()["error"]["type"] == "rate_limit_error"
    assert "--max-concurrent 2" in over.json()["error"]["message"]
    assert tei.status_code == 429 and tei.json()["error_type"] == "Overloaded"
    assert health.status_code == 200
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200


def test_disconnected_client_cancels_its_queued_rows(runner):
    """Request A holds the model thread; B queues, then its client goes away: B's rows never run."""
    slow = gated(runner)
    app = create_app(slow)
    sent = []

    async def request(text, disconnect: asyncio.Event):
        body = json.dumps({"inputs": [text, text + " again"]}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/embed", "raw_path": b"/embed", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append((text, message))
        await app(scope, receive, send)

    async def main():
        a_gone, b_gone = asyncio.Event(), asyncio.Event()
        a = asyncio.ensure_future(request("first", a_gone))
        while not slow.batches:
            await asyncio.sleep(0.01)
        b = asyncio.ensure_future(request("second", b_gone))
        while app.state.server.batcher.queued < 2:
            await asyncio.sleep(0.01)
        b_gone.set()                                        # B's client disconnects while B waits
        await asyncio.wait_for(b, 5)
        slow.gate.set()
        await asyncio.wait_for(a, 30)
        await asyncio.sleep(0.2)                            # the model thread looks at the queue again

    asyncio.run(main())
    assert len(slow.batches) == 1                           # B's rows were dropped, never run
    assert app.state.server.batcher.queued == 0
    statuses = {text: m["status"] for text, m in sent if m["type"] == "http.response.start"}
    assert statuses == {"first": 200, "second": 499}
    metrics = call(app, ("GET", "/metrics"))[0].text
    assert 'fastbert_requests_total{route="/embed",status="499"} 1.0' in metrics
    assert "fastbert_queue_size 0.0" in metrics


def test_api_key(runner):
    app = create_app(runner, api_key="s3cret")
    assert post(app, "/embed", {"inputs": "a"}).status_code == 401
    wrong = post(app, "/v1/embeddings", {"input": "a"}, {"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert post(app, "/embed", {"inputs": "a"}, {"Authorization": "Bearer s3cret"}).status_code == 200
    assert call(app, ("GET", "/metrics"))[0].status_code == 401
    assert call(app, ("GET", "/health"))[0].status_code == 200          # probes need no key


def test_wrong_method_and_route(app):
    r = call(app, ("GET", "/embed"), ("POST", "/nowhere", {"inputs": "a"}))
    assert [x.status_code for x in r] == [405, 404]
