"""fastbert.BertTokenizer is a transformers.PreTrainedTokenizerBase and its output a
transformers.BatchEncoding, so transformers code that checks types takes them: Trainer given the
tokenizer as processing_class and no collator pads ragged rows (before: default_data_collator failed
with "expected sequence of length ... at dim 1"), the same batches as with BertTokenizerFast."""
import pickle

import pytest
import torch
import transformers as T

import fastbert

TEXTS = ["UNwant\u00e9d,running", "a", "Hello World, a somewhat longer text for padding"]


@pytest.fixture(scope="module")
def tokenizers(model_dir):
    return fastbert.BertTokenizer.from_pretrained(model_dir), T.BertTokenizerFast.from_pretrained(model_dir)


def test_transformers_types(tokenizers):
    tok, _ = tokenizers
    assert isinstance(tok, T.PreTrainedTokenizerBase)
    out = tok(TEXTS)
    assert isinstance(out, T.BatchEncoding) and isinstance(out, dict)
    assert out.data is out and out.input_ids is out["input_ids"]
    assert isinstance(tok.pad([dict(zip(out, row)) for row in zip(*out.values())]), T.BatchEncoding)
    assert isinstance(pickle.loads(pickle.dumps(out)), T.BatchEncoding)


def test_plain_attributes_not_the_bases_routing(tokenizers, tmp_path):
    """transformers' base routes special-token names through state its own __init__ sets: here they
    are the tokenizer's properties; a missing name is an AttributeError; BERT has no chat template."""
    tok, hf = tokenizers
    tok = pickle.loads(pickle.dumps(tok))
    tok.pad_token = "[MASK]"
    assert tok.pad_token_id == hf.mask_token_id
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.bos_token_id, hf.eos_token_id) == (None, None)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = tok.no_such_attribute
    assert not hasattr(tok, "deprecation_warnings")   # what DataCollatorWithPadding's helper checks
    with pytest.raises(ValueError, match="chat_template is not set"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(NotImplementedError, match="save_pretrained"):
        tok.push_to_hub("someone/tok")
    (path,) = tok.save_vocabulary(str(tmp_path), filename_prefix="x")
    with open(path, encoding="utf-8") as f:
        assert f.read().splitlines() == sorted(hf.get_vocab(), key=hf.get_vocab().get)   # one token a line, by id


def _rows(tok):
    """Unpadded rows as a dataset holds them (lists of ids of different lengths) with a label."""
    return [{**{k: v[i] for k, v in tok(TEXTS).items()}, "label": i % 2} for i in range(len(TEXTS))]


def test_trainer_pads_with_the_tokenizer_and_no_collator(tokenizers, tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    tok, hf = tokenizers
    config = T.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=37)
    args = T.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, max_steps=1,
                               report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = T.Trainer(model=T.BertForSequenceClassification(config), args=args, train_dataset=_rows(tok),
                        processing_class=tok)
    assert isinstance(trainer.data_collator, T.DataCollatorWithPadding)
    ours = trainer.data_collator(_rows(tok))
    theirs = T.DataCollatorWithPadding(hf)(_rows(hf))     # what Trainer builds for BertTokenizerFast
    assert sorted(ours) == sorted(theirs) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    assert trainer.train().global_step == 1               # its dataloader pads the ragged rows


def test_attributes_set_later_reach_the_one_text_path(tokenizers):
    """The one-text path reads a mirror of the tokenizer's attributes (see _OneText): what is set on the
    tokenizer after it is built applies there as on the general path."""
    tok = pickle.loads(pickle.dumps(tokenizers[0]))
    tok.model_input_names = ["input_ids", "attention_mask"]
    tok.split_special_tokens = True
    text = "a [SEP] b"
    assert dict(tok(text)) == {k: v[0] for k, v in tok([text]).items()}
    assert "token_type_ids" not in tok(text) and tok(text)["input_ids"] != tokenizers[0](text)["input_ids"]
    tok.padding_side = "middle"
    with pytest.raises(ValueError, match="padding_side"):
        tok(text)
