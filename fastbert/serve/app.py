"""The ASGI app of `fastbert serve`: OpenAI- and TEI-compatible routes over one runner and batcher.

    app = create_app(fastbert.serve.runner.load(path))     # then uvicorn.run(app) or httpx in-process

Every inference route runs the same steps: the API key (when one is set), whether this model's kind
serves the route (else 400 naming the routes it does serve), the concurrency cap (429 at once above
`max_concurrent` requests in flight), the body (at most `max_body_bytes`, UTF-8, JSON, validated by
the route's pydantic schema: 413 / 400 / 422 naming the field), tokenization on the tokenizer
threads (413 for an input over the model's limit unless the request asks to truncate; a request of
short texts is tokenized on the event loop, which costs less than the hop to a thread), the batcher,
and the answer (JSON written by orjson when it is installed: a 384-float vector in ~10 us instead of
~160 us). Errors are JSON: OpenAI's shape ({"error": {"message", "type", "param", "code"}})
under /v1/, TEI's ({"error", "error_type"}, plus "field") elsewhere. A client that disconnects while
its rows wait cancels them.
"""

import asyncio
import base64
import hmac
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from fastbert.serve import schemas
from fastbert.serve.batcher import Batcher
from fastbert.serve.metrics import Metrics
from fastbert.serve.runner import TooLong

try:
    import orjson
except ImportError:         # the serve extra installs it; without it, the standard library's json
    orjson = None

MAX_BODY_BYTES = 8 << 20
# a request whose texts hold at most this many characters in all is tokenized on the event loop:
# ~10-40 us, less than the round trip to a tokenizer thread and back (~50-100 us)
INLINE_TOKENIZE_CHARS = 1024


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: Optional[str] = None, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.field, self.kind = status, message, field, kind


def _json_response(content, status: int = 200, headers: Optional[dict] = None):
    """A JSON response; numpy arrays in `content` are written as lists (float32 ones, with orjson,
    in float32's shortest form: the same float32 when read back)."""
    from starlette.responses import Response

    if orjson is not None:
        body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    else:       # as Starlette's JSONResponse writes it
        body = json.dumps(content, default=lambda o: o.tolist(), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def _error_response(exc: ApiError, openai: bool):
    if openai:
        kind = {401: "authentication_error", 429: "rate_limit_error"}.get(exc.status, "invalid_request_error")
        body = {"error": {"message": exc.message, "type": kind, "param": exc.field, "code": None}}
    else:
        body = {"error": exc.message, "error_type": exc.kind, "field": exc.field}
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    return _json_response(body, exc.status, headers)


def _field(loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _validation_error(exc) -> ApiError:
    """pydantic's errors as one ApiError naming the first one's field (the validators' own messages
    as they are; several errors are joined: a misspelt field is both missing and unknown)."""
    messages, fields = [], []
    for err in exc.errors()[:5]:
        field = _field(err.get("loc", ()))
        if err["type"] == "value_error":
            message = str(err.get("ctx", {}).get("error", err["msg"]))
        elif err["type"] == "extra_forbidden":
            message = f"{field}: unknown field"
        else:
            given = err.get("input")
            message = f"{field}: {err['msg']}" + ("" if given is None or isinstance(given, (dict, list))
                                                  else f" (got {given!r})")
        messages.append(message)
        fields.append(field.split("[")[0].split(".")[0])
    return ApiError(422, "; ".join(messages), fields[0])


async def _read_body(request, schema, limit: int):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body has {length} bytes, more than the limit of {limit}", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes", "body")
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start}: {exc.reason})", "body") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(422, f"the request body must be a JSON object, got {type(data).__name__}", "body")
    from pydantic import ValidationError
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


async def _disconnected(request) -> None:
    """Returns when the client goes away (the body has been read: only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _too_long(exc: TooLong, field: str) -> ApiError:
    hint = "" if field == "input" else '; send shorter input or set "truncate": true'   # OpenAI's has no such flag
    return ApiError(413, f"{field}[{exc.index}] has {exc.length} tokens, more than the model's limit of "
                         f"{exc.limit}{hint}", field)


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)   # as torch's F.normalize


class Server:
    """The state one app holds: runner, batcher, tokenizer threads, metrics, limits."""

    def __init__(self, runner, model_name: Optional[str] = None, max_batch_tokens: int = 16384,
                 max_batch_requests: Optional[int] = None, max_concurrent: int = 512,
                 api_key: Optional[str] = None, max_body_bytes: int = MAX_BODY_BYTES,
                 tokenization_workers: Optional[int] = None):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be positive, got {max_concurrent}")
        self.runner, self.max_concurrent, self.api_key = runner, max_concurrent, api_key
        self.model_name = model_name or runner.path.name
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics()
        self.batcher = Batcher(runner.run, runner.padded, max_batch_tokens, max_batch_requests, self.metrics)
        self.tokenization_workers = tokenization_workers or min(4, os.cpu_count() or 1)
        self.tokenizers = ThreadPoolExecutor(self.tokenization_workers, thread_name_prefix="fastbert-serve-tokenize")
        self.in_flight = 0

    def close(self):
        self.batcher.close()
        self.tokenizers.shutdown(wait=True)

    # ------------------------------------------------------------------------------ the steps
    async def tokenize(self, fn, *args, field: str = "inputs", **kwargs):
        """fn(*args, **kwargs) on a tokenizer thread; on the event loop when args' texts are short and
        the tokenizer takes calls without a lock."""
        start = time.perf_counter()
        try:
            if self.runner.lock_free and sum(len(t) for a in args if isinstance(a, list)
                                             for t in a) <= INLINE_TOKENIZE_CHARS:
                return fn(*args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self.tokenizers, lambda: fn(*args, **kwargs))
        except TooLong as exc:
            raise _too_long(exc, field) from None
        finally:
            self.metrics.tokenize_time.observe(time.perf_counter() - start)

    async def infer(self, request, seqs) -> list:
        job = self.batcher.submit(seqs)
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if job.future.done():
                return job.future.result()
            self.batcher.cancel(job)
            raise ApiError(499, "the client closed the connection", kind="Cancelled")
        except asyncio.CancelledError:
            self.batcher.cancel(job)
            raise
        finally:
            watcher.cancel()

    def prompt(self, prompt_name: Optional[str]) -> tuple:
        """(prompt text, tokens pooling skips); only embedding models have prompts."""
        known = getattr(getattr(self.runner, "encoder", None), "prompts", {})
        if prompt_name is not None and prompt_name not in known:
            raise ApiError(422, f"prompt_name {prompt_name!r} is not one of this model's prompts {sorted(known)}",
                           "prompt_name")
        return self.runner.prompt(prompt_name) if known else ("", 0)

    def check_dimensions(self, dimensions: Optional[int]):
        if dimensions is not None and dimensions > self.runner.dim:
            raise ApiError(422, f"dimensions {dimensions} is more than the model's {self.runner.dim}", "dimensions")

    async def embed_texts(self, request, texts: list, truncate: bool, direction: str, prompt_name, field: str):
        prompt, skip = self.prompt(prompt_name)
        seqs = await self.tokenize(self.runner.tokenize, [prompt + t for t in texts], truncate=truncate,
                                   direction=direction, skip=skip, field=field)
        return seqs, await self.infer(request, seqs)

    # ------------------------------------------------------------------------------ the routes
    async def embeddings(self, request, req: schemas.EmbeddingsRequest):
        self.check_dimensions(req.dimensions)
        value = req.input
        if isinstance(value, str) or isinstance(value[0], str):
            texts = [value] if isinstance(value, str) else value
            seqs, vectors = await self.embed_texts(request, texts, False, "right", None, "input")
        else:
            rows = [value] if isinstance(value[0], int) else value
            try:
                seqs = self.runner.check_ids(rows)
            except TooLong as exc:
                raise _too_long(exc, "input") from None
            except ValueError as exc:
                raise ApiError(422, str(exc), "input") from None
            vectors = await self.infer(request, seqs)
        x = np.stack(vectors)
        if req.dimensions is not None:
            x = x[:, :req.dimensions]
        if self.runner.encoder.normalize:      # the checkpoint's Normalize, after any truncation (as OpenAI)
            x = _normalize(x)
        x = x.astype(np.float32)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
                 if req.encoding_format == "base64" else row} for i, row in enumerate(x)]
        tokens = sum(len(s.ids) for s in seqs)
        return {"object": "list", "data": data, "model": req.model or self.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def embed(self, request, req: schemas.EmbedRequest):
        self.check_dimensions(req.dimensions)
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        _, vectors = await self.embed_texts(request, texts, bool(req.truncate), req.direction, req.prompt_name,
                                            "inputs")
        x = np.stack(vectors)
        if req.dimensions is not None:
            x = x[:, :req.dimensions]
        return (_normalize(x) if req.normalize else x).astype(np.float32)

    async def embed_sparse(self, request, req: schemas.EmbedSparseRequest):
        self.prompt(req.prompt_name)                 # a sparse model has none: any name is a 422
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        seqs = await self.tokenize(self.runner.tokenize, texts, truncate=bool(req.truncate), direction=req.direction)
        out = await self.infer(request, seqs)
        return [[{"index": int(i), "value": float(v)} for i, v in zip(idx, val)] for idx, val in out]

    async def rerank(self, request, req: schemas.RerankRequest):
        seqs = await self.tokenize(self.runner.tokenize, [req.query] * len(req.texts), req.texts,
                                   truncate=bool(req.truncate), direction=req.direction, field="texts")
        logits = np.stack(await self.infer(request, seqs))
        scores = self.runner.scores(logits[:, 0], req.raw_scores)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"index": i, "score": float(scores[i]), **({"text": req.texts[i]} if req.return_text else {})}
                for i in order]

    async def predict(self, request, req: schemas.PredictRequest):
        single, items = req.items()
        pairs = [p for _, p in items]
        if any(p is None for p in pairs) and any(p is not None for p in pairs):
            raise ApiError(422, "inputs mixes single texts and pairs", "inputs")
        seqs = await self.tokenize(self.runner.tokenize, [t for t, _ in items],
                                   None if pairs[0] is None else pairs, truncate=bool(req.truncate),
                                   direction=req.direction)
        probs = self.runner.probabilities(np.stack(await self.infer(request, seqs)), req.raw_scores)
        labels = self.runner.labels
        out = [sorted(({"score": float(p), "label": labels[j]} for j, p in enumerate(row)), key=lambda d: -d["score"])
               for row in probs]
        return out[0] if single else out

    async def tokenize_route(self, request, req: schemas.TokenizeRequest):
        prompt, _ = self.prompt(req.prompt_name)
        texts = [prompt + t for t in ([req.inputs] if isinstance(req.inputs, str) else req.inputs)]
        return await self.tokenize(self.runner.tokens, texts, req.add_special_tokens)

    def info(self) -> dict:
        from fastbert import __version__ as version

        b = self.batcher
        return {"model_id": self.model_name, "model_path": str(self.runner.path), **self.runner.info(),
                "routes": list(self.runner.routes), "max_concurrent_requests": self.max_concurrent,
                "max_batch_tokens": b.max_batch_tokens, "max_batch_requests": b.max_batch_requests,
                "max_client_batch_size": schemas.MAX_INPUTS, "tokenization_workers": self.tokenization_workers,
                "version": version, "worker": f"{socket.gethostname()}:{os.getpid()}"}


ROUTES = {   # path -> (Server method, schema)
    "/v1/embeddings": ("embeddings", schemas.EmbeddingsRequest),
    "/embed": ("embed", schemas.EmbedRequest),
    "/embed_sparse": ("embed_sparse", schemas.EmbedSparseRequest),
    "/rerank": ("rerank", schemas.RerankRequest),
    "/predict": ("predict", schemas.PredictRequest),
    "/tokenize": ("tokenize_route", schemas.TokenizeRequest),
}


def create_app(runner, **options):
    """A FastAPI app serving `runner` (fastbert.serve.runner.load(path)); options: Server's. Its
    lifespan's end drains the batcher (uvicorn first lets the requests in flight finish)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    server = Server(runner, **options)

    @asynccontextmanager
    async def lifespan(app):
        yield
        server.close()

    app = FastAPI(title="fastbert serve", lifespan=lifespan)
    app.state.server = server

    def authorized(request) -> bool:
        if server.api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {server.api_key}".encode())

    def route(path: str, method_name: str, schema):
        openai = path.startswith("/v1/")

        async def endpoint(request: Request):
            status, counted = 200, False
            try:
                if not authorized(request):
                    raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                                   "authorization", "Unauthorized")
                if path not in runner.routes:
                    article = "an" if runner.kind[0] in "ae" else "a"
                    raise ApiError(400, f"this server runs {article} {runner.kind} model, which does not serve "
                                        f"{path}; it serves {', '.join(runner.routes)}", kind="Backend")
                if server.in_flight >= server.max_concurrent:
                    raise ApiError(429, f"{server.in_flight} requests are in flight, the most this server takes "
                                        f"(--max-concurrent {server.max_concurrent}); retry later", kind="Overloaded")
                server.in_flight += 1
                server.metrics.in_flight.inc()
                counted = True
                req = await _read_body(request, schema, server.max_body_bytes)
                return _json_response(await getattr(server, method_name)(request, req))
            except ApiError as exc:
                status = exc.status
                return _error_response(exc, openai)
            except asyncio.CancelledError:
                status = 499
                raise
            except Exception:
                status = 500
                raise
            finally:
                if counted:
                    server.in_flight -= 1
                    server.metrics.in_flight.dec()
                server.metrics.requests.labels(path, str(status)).inc()

        endpoint.__name__ = method_name
        app.add_route(path, endpoint, methods=["POST"])

    for path, (method_name, schema) in ROUTES.items():
        route(path, method_name, schema)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def info(request: Request):
        if not authorized(request):
            return _error_response(ApiError(401, "missing or wrong API key", "authorization", "Unauthorized"), False)
        return server.info()

    @app.get("/metrics")
    async def metrics(request: Request):
        if not authorized(request):
            return _error_response(ApiError(401, "missing or wrong API key", "authorization", "Unauthorized"), False)
        body, content_type = server.metrics.render()
        return Response(body, media_type=content_type)

    return app
