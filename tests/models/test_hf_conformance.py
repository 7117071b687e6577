"""What transformers' own model tests found fastbert doing differently from transformers (one test per
cause), checked against transformers itself: initialisation, from_pretrained's arguments, gradients
into returned hidden states, checkpointing through GradientCheckpointingLayer, hidden-state selection,
MPNet's tuple outputs, transformers' model attributes and attention implementation names."""
import copy
import unittest.mock

import pytest
import torch
import transformers as T
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

import fastbert
import fastbert.models as fm
from tiny_families import CONFIGS, SMALL

BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def bert_config(**kw):
    return T.BertConfig(**{**BERT, **kw})


def batch(seed=0, vocab=99, shape=(2, 7)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[1, 4:] = 0
    return dict(input_ids=ids, attention_mask=mask)


def both_modes(cls_name, config):
    """(fastbert's own class, transformers' class after optimize()), built from the same config."""
    fast = getattr(fm, cls_name)(copy.deepcopy(config))
    hf = fastbert.optimize(getattr(T, cls_name)(copy.deepcopy(config)))
    return {"native": fast, "optimize": hf}


# ---- 2: initialisation ----------------------------------------------------------------------------------
def test_model_config_initialises_as_transformers():
    torch.manual_seed(0)
    fast = fm.BertForMaskedLM(bert_config())
    q = fast.bert.encoder.layer[0].attention.self.query
    assert abs(fast.bert.embeddings.word_embeddings.weight.std().item() - 0.02) < 0.003
    assert abs(q.weight.std().item() - 0.02) < 0.004
    assert q.bias.abs().max().item() == 0.0
    assert torch.equal(fast.bert.embeddings.LayerNorm.weight, torch.ones(32))
    before = {k: v.clone() for k, v in fast.state_dict().items()}
    fast.post_init()                                  # transformers': once initialised, left alone
    assert all(torch.equal(before[k], v) for k, v in fast.state_dict().items())


# the bare models that build their own encoder (no BERT parts): each calls post_init() itself
BARE = {
    "DebertaV2Model": CONFIGS["deberta-v2"],
    "DebertaModel": lambda: T.DebertaConfig(**SMALL, relative_attention=True,
                                            pos_att_type=["p2c", "c2p"], max_relative_positions=20),
    "ModernBertModel": CONFIGS["modernbert"],
    "NomicBertModel": CONFIGS["nomic_bert"],
}


@pytest.mark.parametrize("cls_name", BARE)
def test_bare_model_config_initialises_as_transformers(cls_name):
    """Every parameter as transformers' own init leaves it: zeros and ones exactly, random ones with
    transformers' mean and std (ModernBERT's depends on the module: truncated, 'out' ones scaled)."""
    config = BARE[cls_name]()
    torch.manual_seed(0)
    want = dict(getattr(T, cls_name)(copy.deepcopy(config)).named_parameters())
    torch.manual_seed(0)
    got = dict(getattr(fm, cls_name)(copy.deepcopy(config)).named_parameters())
    assert got.keys() == want.keys()
    with torch.no_grad():
        for name, w in want.items():
            g = got[name]
            if torch.all(w == w.flatten()[0]):                     # biases, norms, q_bias / v_bias
                assert torch.equal(g, w), name
            else:
                assert abs(g.std() - w.std()) < 0.15 * w.std(), (name, g.std().item(), w.std().item())
                assert abs(g.mean()) < 0.2 * w.std(), (name, g.mean().item())


@pytest.mark.parametrize("cls_name", BARE)
def test_bare_model_config_gradient_checkpointing_switches_it_on(cls_name):
    config = BARE[cls_name]()
    config.gradient_checkpointing = True
    model = getattr(fm, cls_name)(config)
    assert model.is_activation_checkpointing and not hasattr(config, "gradient_checkpointing")


def test_distilbert_sinusoidal_table_as_transformers():
    config = T.DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=4, hidden_dim=37,
                                max_position_embeddings=24, sinusoidal_pos_embds=True)
    want = T.DistilBertModel(config).embeddings.position_embeddings.weight
    got = fm.DistilBertModel(config).embeddings.position_embeddings.weight
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_resized_embeddings_survive_post_init():
    fast = fm.BertForMaskedLM(bert_config(tie_word_embeddings=False))
    fast.resize_token_embeddings(109)
    rows = fast.get_input_embeddings().weight.clone()
    decoder = fast.get_output_embeddings().weight.clone()
    fast.post_init()
    assert torch.equal(rows, fast.get_input_embeddings().weight)
    assert torch.equal(decoder, fast.get_output_embeddings().weight)
    assert fast.vocab_size == fast.config.vocab_size == 109
    with pytest.raises(ValueError, match="integer"):
        fast.resize_token_embeddings(110, pad_to_multiple_of=1.3)


# ---- 3: from_pretrained's arguments -------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_classifier(tmp_path_factory):
    path = tmp_path_factory.mktemp("cls")
    torch.manual_seed(0)
    model = fm.BertForSequenceClassification(bert_config(num_labels=3))
    model.save_pretrained(path)
    return path, model


def test_from_pretrained_takes_transformers_arguments(saved_classifier):
    path, model = saved_classifier
    loaded = fm.BertForSequenceClassification.from_pretrained(pretrained_model_name_or_path=path)
    assert torch.equal(loaded.classifier.weight, model.classifier.weight)
    again = fm.BertForSequenceClassification.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    assert torch.equal(again.classifier.weight, model.classifier.weight)
    with pytest.raises(ValueError, match="config= and state_dict="):
        fm.BertForSequenceClassification.from_pretrained(None, config=model.config)
    loaded, info = fm.BertForSequenceClassification.from_pretrained(path, output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}
    # a bare checkpoint into a head: transformers reports the head's weights as missing
    bare = fm.BertModel(bert_config())
    _, info = fm.BertForSequenceClassification.from_pretrained(None, config=bert_config(), state_dict=bare.state_dict(),
                                                               output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}


def test_state_dict_without_checkpoint_initialises_what_is_missing(saved_classifier, tmp_path, caplog):
    """Strict for a checkpoint on disk; from_pretrained(None, config=, state_dict=) takes the state_dict as
    transformers does: missing encoder weights initialised (as Model(config) would), with a warning."""
    path, model = saved_classifier
    partial = {k: v for k, v in model.state_dict().items() if "layer.1." not in k}
    with pytest.raises(RuntimeError, match="missing: bert.encoder.layer.1"):
        fm.BertForSequenceClassification.from_state_dict(model.config, partial)
    with caplog.at_level("WARNING"):
        again = fm.BertForSequenceClassification.from_pretrained(None, config=model.config, state_dict=partial)
    assert "bert.encoder.layer.1.attention.self.query.weight" in caplog.text
    kept = dict(again.named_parameters())
    assert torch.equal(kept["bert.encoder.layer.0.attention.self.query.weight"],
                       model.bert.encoder.layer[0].attention.self.query.weight)
    fresh = kept["bert.encoder.layer.1.attention.self.query.weight"]
    assert abs(fresh.std().item() - model.config.initializer_range) < 0.3 * model.config.initializer_range
    assert not fresh.is_meta and torch.count_nonzero(kept["bert.encoder.layer.1.attention.self.query.bias"]) == 0
    empty = fm.BertModel.from_pretrained(None, config=model.config, state_dict={})   # transformers' own test does this
    assert abs(empty.embeddings.word_embeddings.weight.std().item() - model.config.initializer_range) < 0.005


@pytest.mark.parametrize("name, family", [("BertForMaskedLM", "bert"), ("ModernBertForMaskedLM", "modernbert"),
                                          ("ModernBertForSequenceClassification", "modernbert"),
                                          ("DebertaV2Model", "deberta-v2"), ("MPNetForMaskedLM", "mpnet")])
def test_initialisation_goes_module_by_module_through_transformers_hook(name, family, monkeypatch):
    """Model(config) and from_pretrained(None, state_dict={}) initialise each module through transformers'
    per-module entry point (PreTrainedModel._initialize_weights), as transformers does: with that method
    seeded on every call, both give the same weights, bit for bit (they drew in another order before)."""
    original = T.PreTrainedModel._initialize_weights

    def seeded(self, module, *args, **kwargs):
        torch.manual_seed(7)
        original(self, module, *args, **kwargs)

    monkeypatch.setattr(T.PreTrainedModel, "_initialize_weights", seeded)
    cls, config = getattr(fm, name), CONFIGS[family]()
    built = cls(copy.deepcopy(config)).state_dict()
    loaded = cls.from_pretrained(None, config=copy.deepcopy(config), state_dict={}).state_dict()
    assert sorted(built) == sorted(loaded)
    assert [k for k in built if not torch.equal(built[k], loaded[k])] == []
    assert any(v.std() > 0.01 for k, v in built.items() if k.endswith("weight"))   # random, not all constants


@pytest.mark.parametrize("name, family", [("BertForMaskedLM", "bert"), ("RobertaForMaskedLM", "roberta"),
                                          ("ModernBertForMaskedLM", "modernbert"),
                                          ("DebertaV2ForMaskedLM", "deberta-v2"), ("MPNetForMaskedLM", "mpnet")])
def test_tied_word_embeddings_keep_their_own_initialisation(name, family):
    """transformers initialises, then ties: the table an MLM decoder shares has the embeddings' init, its
    padding row as transformers leaves it (zero; drawn in ModernBERT), not the decoder's init (a drawn padding
    row, and ModernBERT's decoder std, 2.4x smaller here)."""
    config = CONFIGS[family]()
    torch.manual_seed(0)
    ours = getattr(fm, name)(copy.deepcopy(config))
    torch.manual_seed(1)
    theirs = getattr(T, name)(copy.deepcopy(config))
    table, ref = ours.get_input_embeddings().weight, theirs.get_input_embeddings().weight
    assert ours.get_output_embeddings().weight is table
    pad = config.pad_token_id
    assert bool(table[pad].any()) == bool(ref[pad].any())
    assert abs(table.std().item() - ref.std().item()) < 0.1 * ref.std().item()


def test_shape_mismatch_is_a_runtime_error_unless_ignored(saved_classifier):
    path, _ = saved_classifier
    with pytest.raises(RuntimeError, match="shape mismatch: classifier.weight"):
        fm.BertForSequenceClassification.from_pretrained(path, num_labels=5)
    with CaptureLogger(hf_logging.get_logger("transformers.modeling_utils")) as log:   # where transformers reports it
        model, info = fm.BertForSequenceClassification.from_pretrained(path, num_labels=5, output_loading_info=True,
                                                                       ignore_mismatched_sizes=True)
    assert "classifier.weight: Reinit due to size mismatch - ckpt: (3, 32) vs model: (5, 32)" in log.out
    assert model.classifier.weight.shape == (5, 32) and info["mismatched_keys"] == {"classifier.weight",
                                                                                    "classifier.bias"}


def test_from_pretrained_refuses_the_meta_device(saved_classifier):
    path, _ = saved_classifier
    with torch.device("meta"), pytest.raises(RuntimeError, match="meta device"):
        fm.BertForSequenceClassification.from_pretrained(path)


# ---- 4, 6: returned hidden states ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["native", "optimize"])
def test_gradients_reach_returned_hidden_states(mode):
    torch.manual_seed(0)
    model = both_modes("BertModel", bert_config())[mode]
    out = model(**batch(), output_hidden_states=True, output_attentions=True)
    out.hidden_states[0].retain_grad()
    out.attentions[0].retain_grad()
    out[0].flatten()[0].backward()
    assert out.hidden_states[0].grad is not None and out.hidden_states[0].grad.abs().sum() > 0
    assert out.attentions[0].grad is not None


@pytest.mark.parametrize("mode", ["native", "optimize"])
def test_output_hidden_states_selects_layers(mode):
    torch.manual_seed(0)
    model = both_modes("BertModel", bert_config())[mode].eval()
    full = model(**batch(), output_hidden_states=True).hidden_states
    some = model(**batch(), output_hidden_states=[0, -1]).hidden_states
    assert len(some) == len(full) == 3 and some[1] is None
    torch.testing.assert_close(some[0], full[0])
    torch.testing.assert_close(some[2], full[2])


# ---- 5: gradient checkpointing ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["native", "optimize"])
def test_checkpointing_through_transformers_layers(mode):
    torch.manual_seed(0)
    model = both_modes("BertForSequenceClassification", bert_config())[mode].train()
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert len(layers) == 2 and not model.is_activation_checkpointing
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_activation_checkpointing and all(layer.gradient_checkpointing for layer in layers)
    real = layers[0]._gradient_checkpointing_func
    with unittest.mock.patch.object(layers[0], "_gradient_checkpointing_func", side_effect=real) as mocked:
        model(**batch(), labels=torch.tensor([0, 1])).loss.backward()
    assert mocked.call_count == 1
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing


def test_config_gradient_checkpointing_switches_it_on():
    config = bert_config()
    config.gradient_checkpointing = True
    model = fm.BertModel(config)
    assert model.is_activation_checkpointing and not hasattr(config, "gradient_checkpointing")


# ---- 7: MPNet tuples -------------------------------------------------------------------------------------
def test_optimized_mpnet_heads_keep_transformers_tuple_order():
    config = T.MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37)
    torch.manual_seed(0)
    hf = T.MPNetForSequenceClassification(config).eval()
    fast = fastbert.optimize(copy.deepcopy(hf))
    inputs = dict(input_ids=batch()["input_ids"], output_hidden_states=True, output_attentions=True,
                  return_dict=False)
    want, got = hf(**inputs), fast(**inputs)
    assert len(got) == len(want) == 3                 # (logits, hidden_states, attentions)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert len(got[1]) == len(want[1]) == 3 and len(got[2]) == len(want[2]) == 2


# ---- 9: transformers' model attributes -----------------------------------------------------------------
def test_transformers_model_attributes():
    model = fm.BertForMaskedLM(bert_config())
    assert len(model._keep_in_fp32_modules) == 0 and len(model._keep_in_fp32_modules_strict) == 0
    assert model._tied_weights_keys == {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                                        "cls.predictions.decoder.bias": "cls.predictions.bias"}
    assert model._tied_weights_keys == T.BertForMaskedLM._tied_weights_keys
    assert model.tp_plan == {}                        # fused layers: nothing for tensor parallelism to shard
    assert {"hidden_states", "attentions"} <= set(model._can_record_outputs)   # per layer, selectable by index
    distil = fm.DistilBertForQuestionAnswering(T.DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=4,
                                                                  hidden_dim=37))
    assert distil.get_position_embeddings() is distil.distilbert.embeddings.position_embeddings


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_distilbert_resize_position_embeddings(sinusoidal):
    config = T.DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=4, hidden_dim=37,
                                max_position_embeddings=20, sinusoidal_pos_embds=sinusoidal)
    model = fm.DistilBertForQuestionAnswering(config)
    rows = model.get_position_embeddings().weight.clone()
    model.resize_position_embeddings(30)
    table = model.get_position_embeddings().weight
    assert table.shape == (30, 32) and model.config.max_position_embeddings == 30
    assert torch.equal(table[:20], rows)
    if sinusoidal:   # the longer table is the one transformers computes for that length
        want = T.DistilBertModel(T.DistilBertConfig(**{**config.to_dict(), "max_position_embeddings": 30}))
        torch.testing.assert_close(table, want.embeddings.position_embeddings.weight, rtol=0, atol=1e-6)
    ids = torch.randint(3, 99, (1, 25))                # longer than before: accepted now
    assert model(input_ids=ids).start_logits.shape == (1, 25)


# ---- 10: attention implementation names --------------------------------------------------------------------
def test_attn_implementation_names():
    torch.manual_seed(0)
    sdpa = fm.BertModel._from_config(bert_config(), attn_implementation="sdpa").eval()
    assert sdpa.config._attn_implementation == "sdpa"
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    assert eager.config._attn_implementation == "eager"
    unfused = fastbert.models.layers.padded_attention
    with unittest.mock.patch("fastbert.models.layers.padded_attention", side_effect=unfused) as called:
        out = eager(**batch())
    assert called.call_count == 2, "eager did not take the unfused path in both layers"
    torch.testing.assert_close(out.last_hidden_state, sdpa(**batch()).last_hidden_state, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="attn_implementation"):
        fm.BertModel(bert_config(attn_implementation="no_such_attention"))
    config = bert_config()
    fm.BertModel(config)
    assert config._attn_implementation is None, "the config (maybe a transformers model's too) was changed"


def test_loaded_model_names_its_attention_as_transformers(saved_classifier):
    path, _ = saved_classifier
    assert fm.BertForSequenceClassification.from_pretrained(path).config._attn_implementation == "sdpa"
    eager = fm.BertForSequenceClassification.from_pretrained(path, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
