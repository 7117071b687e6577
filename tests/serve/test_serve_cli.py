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


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "auto"])
def test_ray_address_where_no_cluster_answers(address, monkeypatch, capsys):
    """An address where nothing listens ends the command at once with exit 1 and one line (Ray itself
    retries for minutes); "auto" checks $RAY_ADDRESS alike. No cluster starts, no network is used."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
    from serve_helpers import free_port

    port = free_port()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")        # the command sets it; undone after the test
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    given = address.format(port=port)
    assert main(["serve", "--ray", given]) == 1
    err = capsys.readouterr().err
    assert f"fastbert serve --ray {given}: no Ray cluster answers at " in err and f"127.0.0.1:{port}" in err, err


def test_ray_address_that_is_not_one(monkeypatch, capsys):
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert main(["serve", "--ray", "headnode"]) == 1
    assert "'headnode' is not a Ray cluster address" in capsys.readouterr().err
    from fastbert.integrations.ray_serve import _init_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)      # ray.init's own search, else a new local cluster
    assert _init_address("auto") is None and _init_address("local") == "local"
