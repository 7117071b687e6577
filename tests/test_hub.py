"""Checkpoint files: local directories, the Hugging Face cache (offline), shards, .bin, and bad files."""
import json
import shutil

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import fastbert
from fastbert.hub import CheckpointFileError
from fastbert.models.config import ConfigError
from hub_cache import cached_snapshot

CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=64)


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    model = T.BertModel(T.BertConfig(**CONFIG)).eval()
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    return model, path


def _same_output(hf, fast):
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        diff = (hf(ids).last_hidden_state - fast(ids).last_hidden_state).abs().max().item()
    assert diff <= 1e-4


def test_sharded_safetensors(checkpoint, tmp_path):
    hf, path = checkpoint
    state = load_file(str(path / "model.safetensors"))
    keys = sorted(state)
    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(path / "config.json", out / "config.json")
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _same_output(hf, fastbert.AutoModel.from_pretrained(out))
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        fastbert.AutoModel.from_pretrained(out)


def test_pytorch_model_bin_weights_only(checkpoint, tmp_path):
    hf, path = checkpoint
    out = tmp_path / "bin"
    out.mkdir()
    shutil.copy(path / "config.json", out / "config.json")
    torch.save({f"bert.{k}": v for k, v in hf.state_dict().items()}, out / "pytorch_model.bin")
    _same_output(hf, fastbert.AutoModel.from_pretrained(out))
    torch.save({"weights": hf.state_dict(), "note": object()}, out / "pytorch_model.bin")
    with pytest.raises(CheckpointFileError, match=r"pytorch_model\.bin.*weights_only=True"):
        fastbert.AutoModel.from_pretrained(out)


def test_bad_files_are_named(checkpoint):
    _, path = checkpoint
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFileError, match=r"model\.safetensors"):
        fastbert.AutoModel.from_pretrained(path)
    weights.write_bytes(b"\x01")
    with pytest.raises(CheckpointFileError, match=r"model\.safetensors"):
        fastbert.AutoModel.from_pretrained(path)
    (path / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON"):
        fastbert.AutoModel.from_pretrained(path)
    (path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(ConfigError, match=r"config\.json has no 'model_type'"):
        fastbert.AutoModel.from_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match=r"'gpt2' is not supported"):
        fastbert.AutoModel.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        fastbert.AutoModel.from_pretrained(path)
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        fastbert.AutoModel.from_pretrained(str(path / "nowhere"))


def test_no_weights_file(checkpoint):
    _, path = checkpoint
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights in"):
        fastbert.AutoModel.from_pretrained(path)


def test_hf_cache_offline(checkpoint, tmp_path, monkeypatch):
    hf, path = checkpoint
    cache = tmp_path / "hub"
    cached_snapshot(cache, "someone/tiny-bert", path, ("config.json", "model.safetensors"), "0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _same_output(hf, fastbert.AutoModel.from_pretrained("someone/tiny-bert"))
    with pytest.raises(FileNotFoundError, match="someone/not-cached"):
        fastbert.AutoModel.from_pretrained("someone/not-cached")


def test_malformed_shard_index_and_non_float_dtypes_are_named(checkpoint, tmp_path):
    """A shard index whose weight_map is not a name -> file map names the index (it was a bare
    AttributeError); an integer dtype, given or in config.json, is refused by name (it was torch's
    'Only Tensors of floating point ... can require gradients')."""
    _, path = checkpoint
    bad = tmp_path / "bad_index"
    bad.mkdir()
    shutil.copy(path / "config.json", bad / "config.json")
    for weight_map in (["a"], {"w": 3}):
        (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(CheckpointFileError, match=r"model\.safetensors\.index\.json is not a valid shard index"):
            fastbert.AutoModel.from_pretrained(bad)
    with pytest.raises(ValueError, match=r"dtype is torch\.int8; a model's weights need a floating dtype"):
        fastbert.AutoModel.from_pretrained(path, dtype=torch.int8)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "int64"}))
    with pytest.raises(ValueError, match=r"config\.json's dtype is torch\.int64"):
        fastbert.AutoModel.from_pretrained(path)
