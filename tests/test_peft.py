"""Swapped-in modules are honoured: a peft LoRA adapter on a fastbert model trains exactly as on the
transformers model (losses, LoRA gradients, AdamW steps), forward hooks run, and a module whose
output the layer cannot use raises naming it."""
import pytest
import torch
import transformers as T

import fastbert

CONFIG = dict(vocab_size=67, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
              max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)


def checkpoint(tmp_path):
    torch.manual_seed(0)
    T.BertForSequenceClassification(T.BertConfig(**CONFIG)).save_pretrained(tmp_path)
    hf = T.BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")
    return hf, fastbert.BertForSequenceClassification.from_pretrained(tmp_path)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, CONFIG["vocab_size"], (4, 10), generator=g)
    mask = (torch.arange(10)[None] < torch.tensor([10, 6, 3, 8])[:, None]).long()
    return dict(input_ids=ids * mask, attention_mask=mask, labels=torch.tensor([0, 2, 1, 2]))


def test_lora_trains_like_peft_on_transformers(tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    hf, fast = checkpoint(tmp_path)
    lora = dict(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0, init_lora_weights=False)
    hf = peft.get_peft_model(hf, peft.LoraConfig(**lora))
    fast = peft.get_peft_model(fast, peft.LoraConfig(**lora))
    fast.load_state_dict(hf.state_dict(), strict=True)           # the same (random, non-zero) LoRA weights
    trainable = [n for n, p in fast.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():                                        # the adapter changes the output ...
        with fast.disable_adapter():
            plain = fast(**inputs, output_hidden_states=True).hidden_states[-1]
        adapted = fast(**inputs, output_hidden_states=True)
        assert (adapted.hidden_states[-1] - plain)[real].abs().max() > 1e-2
        ref = hf(**inputs, output_hidden_states=True)          # ... as peft's does on transformers
        torch.testing.assert_close(adapted.hidden_states[-1][real], ref.hidden_states[-1][real], atol=1e-5, rtol=0)
        torch.testing.assert_close(adapted.logits, ref.logits, atol=1e-5, rtol=0)
    hf.train(), fast.train()
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in (hf, fast)]
    for step in range(3):
        losses = []
        for model, opt in zip((hf, fast), opts):
            opt.zero_grad()
            loss = model(**inputs).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5, msg=f"loss at step {step}")
        hf_grads = dict(hf.named_parameters())
        for name, p in fast.named_parameters():
            if p.requires_grad:
                want = hf_grads[name].grad
                err = (p.grad - want).abs().max() / want.abs().max()
                assert err < 1e-4, f"step {step} {name}: relative gradient error {err:.2e}"
        for opt in opts:
            opt.step()
    fast.eval(), hf.eval()
    with torch.no_grad():
        torch.testing.assert_close(fast(**inputs).logits, hf(**inputs).logits, atol=1e-5, rtol=0)


def test_forward_hooks_on_a_linear_are_honoured(tmp_path):
    hf, fast = checkpoint(tmp_path)
    inputs = batch()
    inputs.pop("labels")
    for model in (hf, fast):   # the same hook on both: doubles layer 0's value projection
        model.eval()
        model.bert.encoder.layer[0].attention.self.value.register_forward_hook(lambda m, args, out: out * 2)
    with torch.no_grad():
        torch.testing.assert_close(fast(**inputs).logits, hf(**inputs).logits, atol=1e-5, rtol=0)


def test_a_module_the_layer_cannot_use_is_named(tmp_path):
    _, fast = checkpoint(tmp_path)
    fast.bert.encoder.layer[1].intermediate.dense = torch.nn.Sequential(torch.nn.Linear(32, 7))
    inputs = batch()
    inputs.pop("labels")
    with pytest.raises(ValueError, match=r"intermediate\.dense \(Sequential\) returned \(27, 7\)"):
        fast(**inputs)


def test_lora_with_reentrant_checkpointing_gets_gradients(tmp_path):
    """Found by use: Trainer(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant":
    True}) on a LoRA model trained none of the encoder's adapters (the checkpointed layers' input, from
    frozen embeddings, did not require grad). transformers makes the embeddings' output require grad
    then; fastbert now does too, and the adapters get transformers' gradients."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    hf, fast = checkpoint(tmp_path)
    lora = dict(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0, init_lora_weights=False)
    hf = peft.get_peft_model(hf, peft.LoraConfig(**lora))
    fast = peft.get_peft_model(fast, peft.LoraConfig(**lora))
    fast.load_state_dict(hf.state_dict(), strict=True)
    grads = {}
    for name, model in (("hf", hf), ("fast", fast)):
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model(**batch()).loss.backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if "lora_" in n and "encoder" in n}
    assert grads["fast"] and all(g is not None for g in grads["fast"].values()), "an adapter got no gradient"
    for n, g in grads["fast"].items():
        assert torch.allclose(g, grads["hf"][n], atol=1e-5), n
    fast.base_model.model.disable_input_require_grads()
    assert "_require_grads_hook" not in fast.base_model.model.__dict__
