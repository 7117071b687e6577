"""NomicBERT against transformers' own implementation: tiny random checkpoints made here, padded
batches with a fully padded row, every head transformers has, training gradients."""
import copy

import pytest
import torch
import transformers as T

from fastbert.models import nomic_bert as NB
from rotary_family import (ATOL, check_gradients, check_host_reads, check_save_pretrained,
                           check_sentence_transformers_and_encoder, check_swapped_linears, max_diff, pair)

BASE = dict(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=64, type_vocab_size=2, num_labels=3,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
TASKS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")


def make_pair(task="Model", attn="eager", seed=0, **extra):
    config = T.NomicBertConfig(**copy.deepcopy({**BASE, **extra}), attn_implementation=attn)
    return pair(config, "NomicBert", NB, task, seed)


def batch(seed=1, seq=19):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, BASE["vocab_size"], (4, seq), generator=g)
    types = torch.randint(0, 2, (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, 11:] = 0
    mask[2, 2:] = 0
    mask[3, :] = 0
    return ids, types, mask


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_encoder_matches_transformers(attn):
    hf, fast = make_pair(attn=attn)
    ids, types, mask = batch()
    with torch.no_grad():
        a = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        b = fast(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
    assert max_diff(a.last_hidden_state, b.last_hidden_state, mask) <= ATOL
    assert len(a.hidden_states) == len(b.hidden_states) == 4
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert max_diff(x, y, mask) <= ATOL
    assert a.pooler_output is None and b.pooler_output is None
    with torch.no_grad():  # token types default to 0, as transformers
        assert max_diff(hf(input_ids=ids, attention_mask=mask).last_hidden_state,
                        fast(input_ids=ids, attention_mask=mask).last_hidden_state, mask) <= ATOL


def test_head_dim_and_activation_options():
    hf, fast = make_pair(head_dim=8, hidden_act="gelu")
    ids, types, mask = batch()
    with torch.no_grad():
        assert max_diff(hf(input_ids=ids, attention_mask=mask).last_hidden_state,
                        fast(input_ids=ids, attention_mask=mask).last_hidden_state, mask) <= ATOL


@pytest.mark.parametrize("task", TASKS[1:])
def test_heads_match_transformers(task):
    hf, fast = make_pair(task)
    ids, types, mask = batch()
    g = torch.Generator().manual_seed(3)
    if task == "ForSequenceClassification":   # a fully padded row has no sequence to classify
        ids, types, mask = ids[:3], types[:3], mask[:3]
        labels = torch.randint(0, 3, (3,), generator=g)
    else:
        hi = BASE["vocab_size"] if task == "ForMaskedLM" else 3
        labels = torch.randint(0, hi, ids.shape, generator=g).masked_fill(~mask.bool(), -100)
    inputs = dict(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
    with torch.no_grad():
        a, b = hf(**inputs), fast(**inputs)
    assert abs(a.loss.item() - b.loss.item()) <= ATOL
    if task == "ForSequenceClassification":
        assert max_diff(a.logits, b.logits) <= ATOL
    else:
        assert max_diff(a.logits, b.logits, mask) <= ATOL


def test_transformers_has_no_other_heads():
    assert not hasattr(T, "NomicBertForQuestionAnswering") and not hasattr(NB, "NomicBertForQuestionAnswering")


def test_position_ids_and_packed_forward():
    hf, fast = make_pair()
    ids, types, mask = batch()
    pos = (torch.arange(19) + 3)[None].expand(4, 19)
    with torch.no_grad():
        assert max_diff(hf(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state,
                        fast(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state, mask) <= ATOL
        lengths = mask.sum(1)
        cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        padded = fast(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
        packed = fast.forward_packed(ids[mask.bool()], cu, int(lengths.max()),
                                     token_type_ids=types[mask.bool()]).last_hidden_state
    assert max_diff(packed, padded[mask.bool()]) <= 1e-5


def test_output_attentions_match_eager():
    hf, fast = make_pair()
    ids, types, mask = batch()
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        b = fast(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for x, y in zip(a, b):
        assert (x[:3] - y[:3]).abs().amax(dim=(1, 3))[mask[:3].bool()].max() <= ATOL


def test_training_loss_and_gradients_match():
    hf, fast = make_pair("ForMaskedLM")
    hf.train(), fast.train()
    ids, types, mask = batch()
    labels = torch.randint(0, BASE["vocab_size"], ids.shape, generator=torch.Generator().manual_seed(4))
    labels = labels.masked_fill(~mask.bool(), -100)
    la = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss
    lb = fast(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels).loss
    la.backward(), lb.backward()
    assert abs(la.item() - lb.item()) <= ATOL
    check_gradients(hf, fast, ("nomic_bert.embeddings.word_embeddings.weight",
                               "nomic_bert.embeddings.token_type_embeddings.weight",
                               "nomic_bert.layers.0.self_attn.q_proj.weight",
                               "nomic_bert.layers.1.self_attn.k_proj.weight",
                               "nomic_bert.layers.2.mlp.gate_proj.weight", "nomic_bert.layers.2.mlp.up_proj.weight",
                               "nomic_bert.layers.1.post_mlp_layernorm.bias", "cls.predictions.bias"))


def test_save_pretrained_loads_in_transformers(tmp_path):
    _, fast = make_pair("ForMaskedLM")
    ids, types, mask = batch()
    check_save_pretrained(fast, T.NomicBertForMaskedLM, tmp_path, ids, mask)


# ---- checkpoints on disk, WordPiece tokenizer, fastbert.optimize, sentence-transformers, Encoder ----------
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world", "unwanted running dogs and foxes", "a"]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "un", "##want",
         "##ed", "runn", "##ing", "##s", "and", "foxes", "a", ","]


def save_checkpoint(path):
    """A tiny NomicBERT checkpoint with a WordPiece vocab.txt (and transformers' tokenizer files)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    T.BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(str(path))
    torch.manual_seed(0)
    T.NomicBertModel(T.NomicBertConfig(**copy.deepcopy({**BASE, "vocab_size": len(vocab)}))).save_pretrained(str(path))
    return path


def test_wordpiece_goes_through_the_cpp_tokenizer(tmp_path):
    import fastbert
    from fastbert.tokenizer import BertTokenizer
    path = save_checkpoint(tmp_path)
    tok = fastbert.AutoTokenizer.from_pretrained(str(path))
    assert isinstance(tok, BertTokenizer)
    ref = T.BertTokenizerFast.from_pretrained(str(path))
    assert tok(TEXTS)["input_ids"] == ref(TEXTS)["input_ids"]


def test_from_pretrained_and_auto_classes(tmp_path):
    """transformers writes nomic-ai's original names (fused attn.Wqkv, fc11/fc12/fc2, norm1/2, emb_ln);
    fastbert converts them on load as transformers does, and its own save loads back too."""
    import fastbert
    from safetensors.torch import load_file
    path = save_checkpoint(tmp_path)
    assert any(k.endswith("attn.Wqkv.weight") for k in load_file(str(path / "model.safetensors")))
    fast = fastbert.AutoModel.from_pretrained(str(path))
    fast.save_pretrained(str(tmp_path / "again"))
    again = fastbert.AutoModel.from_pretrained(str(tmp_path / "again"))
    assert all(torch.equal(a, b) for a, b in zip(fast.state_dict().values(), again.state_dict().values()))
    hf = T.AutoModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
    assert type(fast).__name__ == "NomicBertModel"
    tok = fastbert.AutoTokenizer.from_pretrained(str(path))
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        a = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        b = fast(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    assert max_diff(a, b, enc["attention_mask"]) <= ATOL


@pytest.mark.parametrize("task", TASKS)
def test_optimize_transformers_model(task):
    import fastbert
    hf, _ = make_pair(task, attn="sdpa")
    ids, types, mask = batch()
    inputs = dict(input_ids=ids[:3], token_type_ids=types[:3], attention_mask=mask[:3])
    with torch.no_grad():
        ref = hf(**inputs)[0]
    assert fastbert.optimize(hf) is hf
    assert isinstance(hf.base_model.layers[0], NB.NomicBertLayer)
    with torch.no_grad():
        out = hf(**inputs)[0]
    assert max_diff(ref, out, mask[:3] if ref.dim() == 3 else None) <= ATOL


def test_sentence_transformers_and_encoder(tmp_path):
    check_sentence_transformers_and_encoder(save_checkpoint(tmp_path), BASE["hidden_size"], TEXTS)


def test_forward_packed_reads_no_device_value():
    _, fast = make_pair()
    ids, types, mask = batch()
    check_host_reads(fast, ids, mask, token_type_ids=types)


def test_lora_and_int8_linears_run_in_the_layers():
    """peft LoRA and fastbert.quantize swap the Linears; the fused layer must call them, not read .weight."""
    hf, fast = make_pair()
    ids, _, mask = batch()
    check_swapped_linears(hf, fast, ("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"), ids, mask)


def test_fused_linears_follow_edits_through_data():
    """The q/k/v and gate/up GEMMs read the Linears' current weights after an inference call,
    also when they are edited through `.data` (which bumps no version counter)."""
    hf, fast = make_pair()
    ids, types, mask = batch()
    with torch.no_grad():
        fast(input_ids=ids, attention_mask=mask)  # builds the concatenations
        for m in (hf, fast):
            layer = m.layers[1]
            layer.self_attn.k_proj.weight.data.mul_(-2.0)
            layer.mlp.up_proj.weight.data.copy_(torch.ones_like(layer.mlp.up_proj.weight) * 0.01)
        assert max_diff(hf(input_ids=ids, attention_mask=mask).last_hidden_state,
                        fast(input_ids=ids, attention_mask=mask).last_hidden_state, mask) <= ATOL
