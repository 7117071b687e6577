"""The tokenizer tests' shared pair: fastbert's and transformers' tokenizers of the real MiniLM vocabulary."""
import pytest
from transformers import BertTokenizerFast

import fastbert


@pytest.fixture(scope="module")
def tok(model_dir):
    """fastbert.BertTokenizer, one per test module (tests set attributes on it)."""
    return fastbert.BertTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def hf(model_dir):
    """transformers.BertTokenizerFast on the same files: the reference."""
    return BertTokenizerFast.from_pretrained(model_dir)
