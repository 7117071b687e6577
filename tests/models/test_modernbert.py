"""ModernBERT against transformers' own implementation: tiny random checkpoints made here, padded
batches with rows longer and shorter than the local window and a fully padded row."""
import copy
import json

import pytest
import torch
import transformers as T

from fastbert.models import modernbert as MB
from rotary_family import (ATOL, check_gradients, check_host_reads, check_save_pretrained,
                           check_sentence_transformers_and_encoder, check_swapped_linears, max_diff, pair)

BASE = dict(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            local_attention=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2, num_labels=3)
LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
STYLES = {  # transformers 5's layer_types + rope_parameters, and the older keys still on the Hub
    "new": {**BASE, "layer_types": LAYER_TYPES,
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}},
    "old": {**BASE, "global_attn_every_n_layers": 3, "global_rope_theta": 500.0, "local_rope_theta": 50.0},
}
TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForMultipleChoice")


def make_config(style="new", attn="eager", **extra):
    return T.ModernBertConfig(**copy.deepcopy({**STYLES[style], **extra}), attn_implementation=attn)


def make_pair(task="Model", style="new", attn="eager", seed=0, **extra):
    """(transformers model, fastbert model with the same weights), both in eval mode."""
    return pair(make_config(style, attn, **extra), "ModernBert", MB, task, seed)


def batch(seed=1, seq=21):
    """Rows: longer than the window (21 > 8), 13, shorter than it (3), fully padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, BASE["vocab_size"], (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, 13:] = 0
    mask[2, 3:] = 0
    mask[3, :] = 0
    return ids, mask


def real(t, mask):
    return t[mask.bool()]


# ---- config ------------------------------------------------------------------------------------------
def test_both_config_styles_give_the_same_layers():
    for style in STYLES:
        _, fast = make_pair(style=style)
        layers = list(fast.layers)
        assert [layer.attention_type for layer in layers] == LAYER_TYPES, style
        assert [layer.theta for layer in layers] == [500.0, 50.0, 50.0, 500.0], style
        assert [layer.window for layer in layers] == [None, 4, 4, None], style
        assert isinstance(layers[0].attn_norm, torch.nn.Identity)
        assert all(m.bias is None for m in fast.modules() if isinstance(m, torch.nn.LayerNorm))


def test_config_object_without_layer_types_reads_old_keys():
    config = make_config("old")
    assert MB.layer_types(config) == LAYER_TYPES
    del config.layer_types, config.rope_parameters
    config.global_attn_every_n_layers, config.global_rope_theta = 2, 7.0
    assert MB.layer_types(config) == ["full_attention", "sliding_attention"] * 2
    assert MB.rope_theta(config, "full_attention", "x") == 7.0
    assert MB.rope_theta(config, "sliding_attention", "x") == 10_000.0


def test_unsupported_rope_settings_are_named():
    """Every rope_type transformers implements runs (test_modernbert_rope.py); others, and a partial
    rotation (which transformers' ModernBERT does not do either), are refused by name."""
    config = make_config()
    config.rope_parameters["sliding_attention"] = {"rope_type": "made-up", "rope_theta": 50.0}
    with pytest.raises(ValueError, match="rope_type='made-up'"):
        MB.ModernBertModel(config)
    config.rope_parameters["sliding_attention"] = {"rope_type": "default", "rope_theta": 50.0,
                                                   "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
        MB.ModernBertModel(config)


# ---- the window really applies on the transformers side ------------------------------------------------
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_transformers_window_applies(attn):
    ids, mask = batch()
    hf, _ = make_pair(attn=attn)
    wide, _ = make_pair(attn=attn, local_attention=1000)
    wide.load_state_dict(hf.state_dict())
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        b = wide(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_diff(a[0], b[0]) > 1e-3                     # long row: the window changes it
    assert max_diff(a[2, :3], b[2, :3]) < 1e-5             # row shorter than the window: it does not


# ---- parity ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_encoder_matches_transformers(style, attn):
    ids, mask = batch()
    hf, fast = make_pair(style=style, attn=attn)
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        b = fast(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert max_diff(a.last_hidden_state, b.last_hidden_state, mask) <= ATOL
    assert len(a.hidden_states) == len(b.hidden_states) == 5
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert max_diff(x, y, mask) <= ATOL
    assert (b.last_hidden_state[3] == 0).all()             # fully padded row: zeros, no NaN


def _labels(task, ids, mask, g):
    if task == "ForMaskedLM":
        labels = torch.randint(0, BASE["vocab_size"], ids.shape, generator=g)
        return {"labels": labels.masked_fill(~mask.bool(), -100)}
    if task == "ForSequenceClassification":
        return {"labels": torch.randint(0, 3, (ids.shape[0],), generator=g)}
    if task == "ForTokenClassification":
        return {"labels": torch.randint(0, 3, ids.shape, generator=g).masked_fill(~mask.bool(), -100)}
    if task == "ForQuestionAnswering":
        return {"start_positions": torch.tensor([2, 5, 1]), "end_positions": torch.tensor([7, 12, 2])}
    if task == "ForMultipleChoice":
        return {"labels": torch.tensor([1, 0, 1])}
    return {}


@pytest.mark.parametrize("task,pooling", [(t, "cls") for t in TASKS[1:]] +
                         [("ForSequenceClassification", "mean"), ("ForMultipleChoice", "mean")])
def test_heads_match_transformers(task, pooling):
    extra = {"num_labels": 2} if task == "ForQuestionAnswering" else {}
    hf, fast = make_pair(task, classifier_pooling=pooling, **extra)
    ids, mask = batch()
    g = torch.Generator().manual_seed(3)
    if task in ("ForQuestionAnswering", "ForMultipleChoice", "ForSequenceClassification"):
        ids, mask = ids[:3], mask[:3]                      # no empty row: transformers' pooling divides by 0
    if task == "ForMultipleChoice":
        ids = torch.stack([ids, ids.flip(1)], 1)
        mask = torch.stack([mask, mask], 1)
    inputs = {"input_ids": ids, "attention_mask": mask, **_labels(task, ids, mask, g)}
    with torch.no_grad():
        a, b = hf(**inputs), fast(**inputs)
        if task == "ForQuestionAnswering":
            # with padding transformers' span softmax also covers the padding logits (fastbert's are
            # the head on zeros there), so the loss is compared on an unpadded batch
            full = {**inputs, "attention_mask": torch.ones_like(mask)}
            assert abs(hf(**full).loss.item() - fast(**full).loss.item()) <= ATOL
        else:
            assert abs(a.loss.item() - b.loss.item()) <= ATOL
    if task in ("ForMaskedLM", "ForTokenClassification"):
        assert max_diff(a.logits, b.logits, mask) <= ATOL
    elif task == "ForQuestionAnswering":
        assert max_diff(a.start_logits, b.start_logits, mask) <= ATOL
        assert max_diff(a.end_logits, b.end_logits, mask) <= ATOL
    else:
        assert a.logits.shape == b.logits.shape and max_diff(a.logits, b.logits) <= ATOL


def test_sparse_prediction_logits_only_for_labelled_tokens():
    hf, fast = make_pair("ForMaskedLM", sparse_prediction=True)
    ids, mask = batch()
    labels = torch.full(ids.shape, -100)
    labels[0, [1, 9, 17]] = torch.tensor([5, 6, 7])
    labels[1, 4] = 8
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, labels=labels)
        b = fast(input_ids=ids, attention_mask=mask, labels=labels)
    assert b.logits.shape == a.logits.shape == (4, BASE["vocab_size"])
    assert max_diff(a.logits, b.logits) <= ATOL and abs(a.loss - b.loss) <= ATOL


def test_output_attentions_match_eager():
    hf, fast = make_pair()
    ids, mask = batch()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        b = fast(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert len(a) == len(b) == 4
    for layer, (x, y) in enumerate(zip(a, b)):
        keep = mask[:3].bool()
        # real query rows of the non-empty rows; keys at padding get 0 probability on both sides
        assert (x[:3] - y[:3]).abs().amax(dim=(1, 3))[keep].max() <= ATOL, layer
    local = b[1][0, 0]
    assert (local[0, 5:] == 0).all() and (local[0, :5] > 0).all()   # window: |i - j| <= 4


def test_position_ids_rotate_like_transformers():
    hf, fast = make_pair()
    ids, mask = batch()
    pos = (torch.arange(21) + 7)[None].expand(4, 21)
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        b = fast(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    assert max_diff(a, b, mask) <= ATOL


def test_inputs_embeds():
    hf, fast = make_pair()
    ids, mask = batch()
    emb = hf.embeddings.tok_embeddings(ids)
    with torch.no_grad():
        a = hf(inputs_embeds=emb, attention_mask=mask).last_hidden_state
        b = fast(inputs_embeds=emb, attention_mask=mask).last_hidden_state
    assert max_diff(a, b, mask) <= ATOL


def test_forward_packed_matches_padded_forward():
    _, fast = make_pair()
    ids, mask = batch()
    lengths = mask.sum(1)
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    with torch.no_grad():
        padded = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        packed = fast.forward_packed(ids[mask.bool()], cu, int(lengths.max())).last_hidden_state
    assert packed.shape == (int(lengths.sum()), BASE["hidden_size"])
    assert max_diff(packed, padded[mask.bool()]) <= 1e-5


# ---- training -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_loss_and_gradients_match(checkpointing):
    hf, fast = make_pair("ForMaskedLM")
    hf.train(), fast.train()
    if checkpointing:
        fast.gradient_checkpointing_enable()
    ids, mask = batch()
    labels = _labels("ForMaskedLM", ids, mask, torch.Generator().manual_seed(5))["labels"]
    la = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    lb = fast(input_ids=ids, attention_mask=mask, labels=labels).loss
    la.backward(), lb.backward()
    assert abs(la.item() - lb.item()) <= ATOL
    check_gradients(hf, fast, ("model.embeddings.tok_embeddings.weight", "model.layers.1.attn.Wqkv.weight",
                               "model.layers.2.mlp.Wi.weight", "model.layers.0.attn.Wo.weight",
                               "model.final_norm.weight", "head.dense.weight", "decoder.bias"))


# ---- checkpoints both ways ----------------------------------------------------------------------------
def test_save_pretrained_loads_in_transformers(tmp_path):
    _, fast = make_pair("ForMaskedLM")
    ids, mask = batch()
    back = check_save_pretrained(fast, T.ModernBertForMaskedLM, tmp_path, ids, mask)
    assert set(back.state_dict()) == set(fast.state_dict())


# ---- checkpoints on disk, tokenizer, fastbert.optimize, sentence-transformers, Encoder ----------------
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank today.",
         "Short one.",
         "Local attention only sees a few neighbours, global layers see the whole sequence of tokens here.",
         "x"]


def save_checkpoint(path, style="new", vocab_size=320):
    """A tiny ModernBERT checkpoint with a byte-level BPE tokenizer trained here; config.json in `style`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]            # ids 0..4, as BASE's pad/cls/sep
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    fast_tok = T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]",
                                         sep_token="[SEP]", unk_token="[UNK]", mask_token="[MASK]",
                                         model_input_names=["input_ids", "attention_mask"])
    fast_tok.save_pretrained(str(path))
    torch.manual_seed(0)
    hf = T.ModernBertModel(make_config(style, "sdpa", vocab_size=vocab_size))
    hf.save_pretrained(str(path))
    if style == "old":   # what older Hub checkpoints carry: no layer_types / rope_parameters
        data = {"model_type": "modernbert", "architectures": ["ModernBertModel"],
                **{k: v for k, v in STYLES["old"].items()}, "vocab_size": vocab_size}
        (path / "config.json").write_text(json.dumps(data))
    return path


def test_bpe_tokenizer_goes_through_transformers(tmp_path):
    import fastbert
    from tokenizers import Tokenizer
    path = save_checkpoint(tmp_path)
    tok = fastbert.AutoTokenizer.from_pretrained(str(path))
    assert isinstance(tok, T.PreTrainedTokenizerBase)                         # transformers' fast tokenizer
    ref = Tokenizer.from_file(str(path / "tokenizer.json"))
    enc = tok(TEXTS)
    assert enc["input_ids"] == [ref.encode(t).ids for t in TEXTS]
    assert all(ids[0] == 1 and ids[-1] == 2 for ids in enc["input_ids"])


@pytest.mark.parametrize("style", list(STYLES))
def test_from_pretrained_reads_both_config_styles(tmp_path, style):
    import fastbert
    path = save_checkpoint(tmp_path, style)
    fast = fastbert.AutoModel.from_pretrained(str(path))
    hf = T.AutoModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
    assert type(fast).__name__ == "ModernBertModel"
    assert [layer.theta for layer in fast.layers] == [500.0, 50.0, 50.0, 500.0]
    ids, mask = batch()
    with torch.no_grad():
        assert max_diff(hf(input_ids=ids, attention_mask=mask).last_hidden_state,
                        fast(input_ids=ids, attention_mask=mask).last_hidden_state, mask) <= ATOL


@pytest.mark.parametrize("task", ["Model", "ForMaskedLM", "ForSequenceClassification", "ForMultipleChoice"])
def test_optimize_transformers_model(task):
    import fastbert
    hf, _ = make_pair(task, attn="sdpa")
    ids, mask = batch()
    inputs = {"input_ids": ids[:3], "attention_mask": mask[:3]}
    if task == "ForMultipleChoice":
        inputs = {k: torch.stack([v, v.flip(1)], 1) for k, v in inputs.items()}
    with torch.no_grad():
        ref = hf(**inputs)[0]
    assert fastbert.optimize(hf) is hf
    base = hf.base_model
    assert "_fastbert_encoder" in base.__dict__ and isinstance(base.layers[1], MB.ModernBertEncoderLayer)
    with torch.no_grad():
        out = hf(**inputs)[0]
    m = inputs["attention_mask"]
    assert max_diff(ref, out, m if ref.dim() == m.dim() + 1 else None) <= ATOL
    assert set(hf.state_dict()) >= {k for k in hf.state_dict() if "rotary" not in k}


def test_sentence_transformers_and_encoder(tmp_path):
    check_sentence_transformers_and_encoder(save_checkpoint(tmp_path), BASE["hidden_size"], TEXTS)


def test_forward_packed_reads_no_device_value():
    """No host read in model code on the packed path (local and global layers both run); the padded
    forward reads once (input ranges and mask lengths together)."""
    _, fast = make_pair()
    ids, mask = batch()
    check_host_reads(fast, ids, mask)


def test_forward_packed_traces_without_graph_breaks_in_this_family():
    """torch.compile can trace the packed path: no graph break in the family's code, rotary or the
    sliding window (breaks inside the other fastbert.ops are theirs to remove, as custom ops)."""
    import os
    _, fast = make_pair()
    ids, mask = batch()
    lengths = mask.sum(1)
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(fast.forward_packed)(ids[mask.bool()], cu, int(lengths.max()))
    ours = {"modernbert.py", "rotary_encoder.py", "rotary.py", "sliding_window.py"}
    breaks = [(r.user_stack[-1].filename, r.reason.splitlines()[0]) for r in explained.break_reasons
              if r.user_stack and os.path.basename(r.user_stack[-1].filename) in ours]
    assert breaks == [], breaks


def test_lora_and_int8_linears_run_in_the_layers():
    """peft LoRA and fastbert.quantize swap the Linears; the fused layer must call them, not read .weight."""
    hf, fast = make_pair()
    ids, mask = batch()
    check_swapped_linears(hf, fast, ("Wqkv", "Wo", "Wi"), ids, mask)
