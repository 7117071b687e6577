"""Swapped-in modules are honoured: a peft LoRA adapter on a fastbert model trains exactly as on the
transformers model (losses, LoRA gradients, AdamW steps), forward hooks run, and a module whose
output the layer cannot use raises naming it. fastbert.optimize on a model that has adapters already
keeps them, for every family."""
import copy

import pytest
import torch
import transformers as T

import fastbert
from tiny_families import CONFIGS

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


def train_alike(ref, model, inputs, steps):
    """AdamW steps on the trainable parameters of both models (both left in train mode): the same
    loss at each step, and each trainable parameter's gradient within 1e-4 of ref's (relative)."""
    ref.train(), model.train()
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in (ref, model)]
    for step in range(steps):
        losses = []
        for m, opt in zip((ref, model), opts):
            opt.zero_grad()
            loss = m(**inputs).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5, msg=f"loss at step {step}")
        want = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            if p.requires_grad:
                err = (p.grad - want[name].grad).abs().max() / want[name].grad.abs().max()
                assert err < 1e-4, f"step {step} {name}: relative gradient error {err:.2e}"
        for opt in opts:
            opt.step()


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
    train_alike(hf, fast, inputs, steps=3)
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


@pytest.mark.parametrize("given", ["PeftModel", "the model inside it"])
def test_optimize_keeps_a_peft_adapter(tmp_path, given):
    """fastbert.optimize on a model that already has LoRA adapters (a PeftModel, or the transformers
    model peft wrapped): the adapters stay where peft put them and keep working: same outputs,
    losses and adapter gradients as peft on the unoptimized model, adapters that can be disabled,
    and merge_and_unload gives back plain Linears (the fused path) with the merged weights. Before,
    a PeftModel was refused with a TypeError and its inner model with a ConfigError."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    hf, _ = checkpoint(tmp_path)
    lora = dict(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0, init_lora_weights=False)
    ref = peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(**lora))
    model = peft.get_peft_model(hf, peft.LoraConfig(**lora))
    model.load_state_dict(ref.state_dict(), strict=True)        # the same (random, non-zero) LoRA weights
    keys = list(model.state_dict())
    target = model if given == "PeftModel" else model.get_base_model()
    assert fastbert.optimize(target) is target
    base = model.get_base_model().bert
    assert "_fastbert_encoder" in base.__dict__
    query = base.encoder.layer[0].attention.self.query
    assert isinstance(query, peft.tuners.lora.LoraLayer), type(query)
    assert list(model.state_dict()) == keys                      # transformers' and peft's names, same order
    inputs = batch()
    model.eval(), ref.eval()
    with torch.no_grad():
        with model.disable_adapter():
            plain = model(**inputs).logits
        adapted = model(**inputs).logits
        assert (adapted - plain).abs().max() > 1e-3                # the adapter still acts ...
        torch.testing.assert_close(adapted, ref(**inputs).logits, atol=1e-5, rtol=0)   # ... as peft's does
    train_alike(ref, model, inputs, steps=2)
    merged, ref_merged = model.merge_and_unload().eval(), ref.merge_and_unload().eval()
    assert type(merged.bert.encoder.layer[0].attention.self.query) is torch.nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).logits, ref_merged(**inputs).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_optimize_keeps_lora_on_every_linear_of_each_family(family):
    """LoRA on every Linear (peft's "all-linear"), then fastbert.optimize: every adapter is still in
    the model, and the encoder's output is peft's on the unoptimized model, for each family."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    torch.manual_seed(0)
    config = CONFIGS[family]()
    hf = T.AutoModel.from_config(config, attn_implementation="eager").eval()
    lora = peft.LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    ref = peft.get_peft_model(copy.deepcopy(hf), lora).eval()
    model = peft.get_peft_model(hf, lora).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    adapters = sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in ref.modules())
    fastbert.optimize(model)
    assert "_fastbert_encoder" in model.get_base_model().__dict__
    assert sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in model.modules()) == adapters > 0
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    g = torch.Generator().manual_seed(2)
    mask = (torch.arange(9)[None] < torch.tensor([9, 5, 2])[:, None]).long()
    ids = torch.where(mask.bool(), torch.randint(pad + 3, config.vocab_size, (3, 9), generator=g), pad)
    real = mask.bool()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        with model.disable_adapter():
            plain = model(input_ids=ids, attention_mask=mask).last_hidden_state
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (got - plain)[real].abs().max() > 1e-3
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


def test_from_pretrained_loads_a_peft_adapter_folder(tmp_path):
    """A folder peft saved (adapter_config.json, adapter weights, no config.json) loads as transformers
    loads it: the base model it names, then the adapter, with the classifier peft saved beside it
    (modules_to_save); the logits are transformers'. Before, a FileNotFoundError for config.json. A
    config that names no base model is refused naming the file."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    from fastbert.hub import CheckpointFileError

    hf, _ = checkpoint(tmp_path / "base")
    lora = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"], init_lora_weights=False)
    model = peft.get_peft_model(hf, lora)
    with torch.no_grad():   # a trained classifier, saved with the adapter
        model.base_model.model.classifier.modules_to_save["default"].weight.add_(0.5)
    model.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists()
    inputs = batch()
    inputs.pop("labels")
    ref = T.AutoModelForSequenceClassification.from_pretrained(tmp_path / "adapter", attn_implementation="eager")
    with torch.no_grad():
        want = ref.eval()(**inputs).logits
        base = T.BertForSequenceClassification.from_pretrained(tmp_path / "base").eval()(**inputs).logits
    assert (want - base).abs().max() > 1e-2                      # the adapter and its classifier count
    for loader in (fastbert.AutoModelForSequenceClassification, fastbert.BertForSequenceClassification):
        got = loader.from_pretrained(str(tmp_path / "adapter"))
        assert isinstance(got, peft.PeftModel)
        assert isinstance(got.get_base_model(), fastbert.BertForSequenceClassification)
        with torch.no_grad():
            torch.testing.assert_close(got(**inputs).logits, want, atol=1e-5, rtol=0)
    config = tmp_path / "adapter" / "adapter_config.json"
    config.write_text(config.read_text().replace('"base_model_name_or_path"', '"base_model"'))
    with pytest.raises(CheckpointFileError, match=r"adapter_config\.json names no base model"):
        fastbert.AutoModel.from_pretrained(str(tmp_path / "adapter"))


def test_an_adapter_saved_from_a_fastbert_model_loads_in_both_libraries(tmp_path):
    """peft writes the model's name_or_path into a saved adapter as its base model: fastbert's
    from_pretrained records it as transformers does, so an adapter trained on a fastbert model loads
    back with fastbert and with transformers, to the same output. Before, the adapter named no base."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    _, fast = checkpoint(tmp_path / "base")
    assert fast.name_or_path == str(tmp_path / "base") == fast.config.name_or_path
    lora = peft.LoraConfig(r=4, target_modules=["query", "value"], init_lora_weights=False)
    model = peft.get_peft_model(fast.bert, lora).eval()
    model.save_pretrained(tmp_path / "adapter")
    inputs = batch()
    inputs.pop("labels")
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        for loaded in (fastbert.AutoModel.from_pretrained(str(tmp_path / "adapter")),
                       T.AutoModel.from_pretrained(tmp_path / "adapter", attn_implementation="eager")):
            got = loaded.eval()(**inputs).last_hidden_state
            real = inputs["attention_mask"].bool()
            torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
