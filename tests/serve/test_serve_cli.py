"""`fastbert serve`'s command line: its options, and mistakes that end with a usage error (exit 2)
before any model loads."""
import pytest

from fastbert.cli import build_parser, main


def test_options_and_defaults():
    args = build_parser().parse_args(["serve"])
    assert args.model is None and (args.host, args.port) == ("127.0.0.1", 8080)
    assert (args.max_batch_tokens, args.max_batch_requests, args.max_concurrent) == (16384, None, 512)
    assert (args.quantize, args.device, args.dtype, args.api_key, args.ray, args.replicas) == (None,) * 5 + (1,)
    args = build_parser().parse_args(["serve", "some/model", "--port", "9000", "--max-batch-tokens", "4096",
                                      "--max-batch-requests", "64", "--max-concurrent", "8", "--quantize", "int8",
                                      "--device", "cpu", "--api-key", "k", "--ray", "auto", "--replicas", "2"])
    assert (args.model, args.port, args.max_batch_tokens, args.max_batch_requests, args.max_concurrent,
            args.quantize, args.api_key, args.ray, args.replicas) == ("some/model", 9000, 4096, 64, 8, "int8",
                                                                      "k", "auto", 2)


@pytest.mark.parametrize("argv,words", [
    (["serve", "--replicas", "2"], "--replicas and --num-gpus need --ray"),
    (["serve", "--quantize", "int8", "--dtype", "float16"], "--quantize int8 runs on the CPU in float32"),
    (["serve", "--max-batch-tokens", "0"], "expected a positive integer, got 0"),
    (["serve", "--port", "http"], "expected a positive integer, got 'http'"),
    (["serve", "--quantize", "int4"], "invalid choice: 'int4'"),
])
def test_usage_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_model_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(path)])
    assert exc.value.code == 2 and "not a directory" in capsys.readouterr().err
