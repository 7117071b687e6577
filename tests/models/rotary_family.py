"""Checks the rotary families' tests (test_modernbert.py, test_nomic_bert.py) share."""
import copy

import pytest
import torch
import transformers as T

import fastbert

ATOL = 1e-4


def pair(config, prefix, module, task="Model", seed=0):
    """(transformers `prefix + task`, the fastbert class of that name in `module`, same weights), in eval mode."""
    torch.manual_seed(seed)
    hf = getattr(T, prefix + task)(config).eval()
    fast = getattr(module, prefix + task)(copy.deepcopy(config)).eval()
    fast.load_state_dict(hf.state_dict(), strict=True)
    return hf, fast


def max_diff(a, b, mask=None):
    """Max abs difference, on the real tokens only when a mask is given."""
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return (a.float() - b.float()).abs().max().item()


def check_gradients(hf, fast, names):
    """The named parameters' gradients agree (after both models' backward)."""
    ours = dict(fast.named_parameters())
    for name in names:
        ga, gb = hf.get_parameter(name).grad, ours[name].grad
        assert gb is not None and (ga - gb).abs().max() <= 1e-5 + 1e-3 * ga.abs().max(), name


def check_save_pretrained(fast, hf_class, path, ids, mask):
    """fast.save_pretrained(path) loads in transformers' `hf_class` with the same logits; -> that model."""
    fast.save_pretrained(str(path))
    back = hf_class.from_pretrained(str(path)).eval()
    with torch.no_grad():
        assert max_diff(back(input_ids=ids, attention_mask=mask).logits,
                        fast(input_ids=ids, attention_mask=mask).logits, mask) <= ATOL
    return back


def check_sentence_transformers_and_encoder(path, hidden_size, texts):
    """A SentenceTransformer (Transformer + mean Pooling) on the checkpoint at `path` gives the same
    embeddings after fastbert.optimize, and so does fastbert.Encoder on the same checkpoint."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    import fastbert
    model = st.SentenceTransformer(modules=[Transformer(str(path)), Pooling(hidden_size, "mean")], device="cpu")
    ref = model.encode(texts, convert_to_tensor=True)
    fastbert.optimize(model)
    assert "_fastbert_encoder" in model[0].auto_model.__dict__
    assert max_diff(model.encode(texts, convert_to_tensor=True), ref) <= ATOL
    enc = fastbert.Encoder.from_pretrained(str(path), device="cpu")
    assert max_diff(torch.as_tensor(enc.encode(texts)), ref) <= ATOL


def check_host_reads(fast, ids, mask, **extra):
    """No host read in model code on the packed path; the padded forward reads once (input ranges and
    mask lengths together). `extra`: padded (batch, seq) inputs such as token_type_ids."""
    from test_forward_packed import HostReads
    real = mask.bool()
    lengths = mask.sum(1)
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    args = (ids[real], cu, int(lengths.max()))                  # read here, before counting
    packed_extra = {k: v[real] for k, v in extra.items()}
    with torch.no_grad():
        with HostReads() as packed_reads:
            fast.forward_packed(*args, **packed_extra)
        with HostReads() as padded_reads:
            fast(input_ids=ids, attention_mask=mask, **extra)
    assert packed_reads.outside_ops() == [], packed_reads.outside_ops()
    assert len(padded_reads.outside_ops()) == 1, padded_reads.outside_ops()


def check_swapped_linears(hf, fast, targets, ids, mask):
    """Modules swapped into the layers run, never read for .weight: a peft LoRA adapter on `targets`
    gives what it gives on the transformers model (and changes the output), and fastbert.quantize's
    int8 Linears stay within cosine 0.999 of fp32."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    with torch.no_grad():
        base = fast(input_ids=ids, attention_mask=mask).last_hidden_state
    lora = peft.LoraConfig(target_modules=list(targets), r=4, init_lora_weights=False)
    torch.manual_seed(0)
    theirs = peft.get_peft_model(copy.deepcopy(hf), lora)
    ours = peft.get_peft_model(copy.deepcopy(fast), lora)
    ours.load_state_dict(theirs.state_dict(), strict=True)          # the same LoRA weights
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_diff(got, want, mask) <= ATOL
    assert max_diff(got, base, mask) > 1e-2, "the adapter was not applied"
    quantized = fastbert.quantize(copy.deepcopy(fast), "int8")
    with torch.no_grad():
        q = quantized(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert torch.nn.functional.cosine_similarity(q[real], base[real], dim=-1).min() >= 0.999
