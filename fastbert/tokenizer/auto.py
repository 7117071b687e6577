"""fastbert.AutoTokenizer: the C++ WordPiece tokenizer where it applies, HF's fast tokenizer elsewhere.

WordPiece vocabularies (BERT, DistilBERT, ELECTRA, MiniLM, bge, e5, and MPNet with its
<s> A </s></s> B </s> template) get `fastbert.BertTokenizer`;
BPE (RoBERTa) and SentencePiece/Unigram (XLM-R, CamemBERT, ALBERT) get `transformers.AutoTokenizer`,
which reads the same files. The choice is made from the files in the checkpoint directory:
  tokenizer.json present  -> its "model.type" decides (WordPiece -> fastbert, when its post-processor
                             is Bert-, Roberta- or TemplateProcessing)
  only vocab.txt present  -> fastbert (a WordPiece vocabulary)
  anything else           -> transformers.AutoTokenizer
"""
import json
from pathlib import Path

from fastbert.tokenizer.bert import BertTokenizer
from fastbert.tokenizer.files import GENERIC_CLASSES, read_json
from fastbert.tokenizer.template import supported


def tokenizer_kind(directory) -> str:
    """"wordpiece" when fastbert.BertTokenizer can serve `directory`, "hf" otherwise."""
    directory = Path(directory)
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        try:
            with open(tokenizer_json, encoding="utf-8") as f:
                data = json.load(f)
            model = data.get("model") or {}
        except (OSError, ValueError) as e:
            raise OSError(f"cannot read tokenizer file {tokenizer_json}: {e}") from e
        if model.get("type") != "WordPiece":
            return "hf"
        # a generic class applies the file's post-processor: one the C++ core cannot apply exactly (e.g. a
        # Sequence of them) goes to transformers (named classes such as BertTokenizer build their own)
        config = read_json(directory / "tokenizer_config.json") or {}
        generic = config.get("tokenizer_class") in GENERIC_CLASSES
        return "hf" if generic and not supported(data.get("post_processor")) else "wordpiece"
    if (directory / "vocab.txt").is_file():
        return "wordpiece"
    return "hf"


def local_dir(path) -> Path:
    """The local directory for a checkpoint path or hub id (fastbert.hub's one resolver: the HF
    cache first, then a download of the whole repository unless HF_HUB_OFFLINE is set). Errors
    are OSErrors naming the path."""
    from fastbert.hub import resolve_directory

    return Path(resolve_directory(path, patterns=None))


class AutoTokenizer:
    """Picks the tokenizer class for a checkpoint; not instantiable itself (as transformers')."""

    def __init__(self):
        raise TypeError("use fastbert.AutoTokenizer.from_pretrained(path)")

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        directory = local_dir(path)
        if tokenizer_kind(directory) == "wordpiece":
            return BertTokenizer.from_pretrained(str(directory), **kwargs)
        import transformers
        return transformers.AutoTokenizer.from_pretrained(str(directory), use_fast=True, **kwargs)
