"""DeBERTa v1 (model_type "deberta") against transformers on tiny random checkpoints saved here: every
head transformers has (no MultipleChoice for v1), c2p / p2c / both, position_biased_input on and off,
embedding_size != hidden_size, the non-legacy MLM head, absolute positions only; rows longer than the
relative span and a fully padded row; strict loading both ways, forward_packed, training (loss,
gradients, AdamW steps), fastbert.optimize, and talking_head refused by name."""
import pytest
import torch
import transformers as T
from test_deberta import SEQ, check_optimize, compare, inputs, save_model
from test_models import close, labels_for

import fastbert
from fastbert.models.config import ConfigError
from fastbert.models.registry import model_class

TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
BASE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            relative_attention=True, max_relative_positions=12)    # span 12 < SEQ: distances are clamped
VARIANTS = {
    "base": dict(pos_att_type="c2p|p2c", type_vocab_size=2),
    "c2p-no-abs-factorised": dict(pos_att_type=["c2p"], position_biased_input=False, embedding_size=24),
    "p2c-nonlegacy": dict(pos_att_type=["p2c"], legacy=False, max_relative_positions=-1),   # span = 64
    "absolute-only": dict(relative_attention=False, pos_att_type=["c2p", "p2c"]),
    # as transformers' own model tests; v1 counts "none" in its scale (1 + len(pos_att_type)), v2 does not
    "no-terms": dict(relative_attention=False, pos_att_type="None"),
    "relative-no-terms": dict(pos_att_type="None"),
}


def config(variant, **extra):
    return T.DebertaConfig(**{**BASE, **VARIANTS[variant], **extra})


CASES = [(t, "base") for t in TASKS] + [("Model", v) for v in VARIANTS if v != "base"] + \
        [("ForMaskedLM", "c2p-no-abs-factorised"), ("ForMaskedLM", "p2c-nonlegacy")]


@pytest.mark.parametrize("task,variant", CASES)
def test_parity(task, variant, tmp_path):
    hf, fast = save_model("Deberta", task, config(variant), tmp_path)
    assert type(fast).__name__ == "Deberta" + task
    x = inputs(hf.config)
    real = x["attention_mask"].bool()
    labels = labels_for(task, hf.config, x, torch.Generator().manual_seed(2)) if "Question" not in task else {}
    with torch.no_grad():
        compare(task, hf(**x, **labels, output_hidden_states=True), fast(**x, **labels, output_hidden_states=True),
                real)
        if task == "Model":   # the attentions path (padded probabilities) too
            a, b = hf(**x, output_attentions=True), fast(**x, output_attentions=True)
            for p, q in zip(a.attentions, b.attentions, strict=True):
                close(p.transpose(1, 2)[real], q.transpose(1, 2)[real])
    type(fast).from_hf_config(hf.config).load_state_dict(hf.state_dict(), strict=True)
    hf.load_state_dict(fast.state_dict(), strict=True)


def test_forward_packed_equals_padded(tmp_path):
    hf, fast = save_model("Deberta", "Model", config("base"), tmp_path)
    x = inputs(hf.config)
    real = x["attention_mask"].bool()
    cu = torch.nn.functional.pad(real.sum(1).cumsum(0), (1, 0)).int()
    fast.check_packed(x["input_ids"][real], cu, SEQ, x["token_type_ids"][real])
    with torch.no_grad():
        packed = fast.forward_packed(x["input_ids"][real], cu, SEQ, x["token_type_ids"][real]).last_hidden_state
        padded = fast(**x).last_hidden_state[real]
        ref = hf(**x).last_hidden_state[real]
    close(padded, packed, atol=1e-5)
    close(ref, packed)


def test_training_loss_gradients_and_adamw_steps(tmp_path):
    hf, fast = save_model("Deberta", "ForTokenClassification", config("base"), tmp_path)
    hf.train(), fast.train()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01) for m in (hf, fast)]
    for step in range(3):
        x = inputs(hf.config, seed=10 + step)
        labels = labels_for("ForTokenClassification", hf.config, x, torch.Generator().manual_seed(step))
        a, b = hf(**x, **labels), fast(**x, **labels)
        close(a.loss, b.loss)
        a.loss.backward(), b.loss.backward()
        if step == 0:
            grads_a = {n: p.grad for n, p in hf.named_parameters()}
            for name, p in fast.named_parameters():     # every parameter, v1's in_proj / q_bias / v_bias included
                assert p.grad is not None or grads_a[name] is None, name
                if p.grad is not None:
                    close(grads_a[name], p.grad, atol=1e-5)
            assert grads_a["deberta.encoder.layer.0.attention.self.q_bias"].abs().max() > 0
        for opt in opts:
            opt.step(), opt.zero_grad()
    params_a = dict(hf.named_parameters())
    for name, p in fast.named_parameters():
        close(params_a[name], p, atol=1e-5)


@pytest.mark.parametrize("variant", ["c2p-no-abs-factorised", "no-terms"])
def test_optimize_transformers_model(variant):
    check_optimize(T.DebertaForSequenceClassification, config(variant))


V2_ONLY = dict(position_buckets=12, share_att_key=True, norm_rel_ebd="layer_norm", conv_kernel_size=3,
               attention_head_size=16)


def test_v2_only_settings_are_ignored_as_transformers_v1_does(tmp_path):
    """transformers' v1 reads none of V2_ONLY: no log buckets (position_buckets equal to
    max_relative_positions keeps the table's shape, so a v1 that bucketed would load and be wrong),
    no shared keys, no conv layer, no rel-embedding norm, and hidden / heads per head."""
    hf, fast = save_model("Deberta", "Model", config("base", **V2_ONLY), tmp_path)
    x = inputs(hf.config)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        compare("Model", hf(**x, output_hidden_states=True), fast(**x, output_hidden_states=True), real)
    check_optimize(T.DebertaForSequenceClassification, config("base", **V2_ONLY))


def test_refused_settings_are_named():
    with pytest.raises(ConfigError, match="talking_head"):
        fastbert.DebertaModel(config("base", talking_head=True))
    with pytest.raises(ConfigError, match="p2p"):
        fastbert.DebertaModel(config("base", pos_att_type=["c2p", "p2p"]))
    with pytest.raises(ConfigError, match="no ForMultipleChoice"):   # transformers has none for v1 either
        model_class("deberta", "ForMultipleChoice")
