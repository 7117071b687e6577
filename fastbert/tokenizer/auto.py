"""fastbert.AutoTokenizer: the C++ WordPiece tokenizer where it applies, HF's fast tokenizer elsewhere.

WordPiece vocabularies (BERT, DistilBERT, ELECTRA, MiniLM, bge, e5, and MPNet with its
<s> A </s></s> B </s> template) get `fastbert.BertTokenizer`;
BPE (RoBERTa) and SentencePiece/Unigram (XLM-R, CamemBERT, ALBERT) get `transformers.AutoTokenizer`,
which reads the same files. The choice is made from the files in the checkpoint directory:
  tokenizer.json present  -> its "model.type" decides (WordPiece -> fastbert; under a generic class,
                             which applies the whole file, only when the C++ core applies all of it:
                             a BertNormalizer, BertPreTokenizer, "##" and 100 characters a word, the
                             WordPiece decoder, a Bert-, Roberta- or TemplateProcessing post-processor)
  only vocab.txt present  -> fastbert (a WordPiece vocabulary)
  anything else           -> transformers.AutoTokenizer
and only where the tokenizer class transformers would build (tokenizer_config.json's, or the one
config.json's model_type picks) is BERT's, DistilBERT's, MPNet's or a generic one: a WordPiece
vocabulary under another class (Funnel's <cls>/<sep> and type id 2, BertJapanese's MeCab) goes to
transformers.
"""
import json
from pathlib import Path

from fastbert.tokenizer.bert import BertTokenizer
from fastbert.tokenizer.files import (GENERIC_CLASSES, HUB_ARGUMENTS, NO_TYPE_INPUTS, auto_class, generic_arguments,
                                     read_json)
from fastbert.tokenizer.template import supported


def _read_tokenizer_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise OSError(f"cannot read tokenizer file {path}: {e}") from e


def generic_overrides(directory, data: dict | None = None) -> dict | str | None:
    """For a WordPiece tokenizer.json that transformers serves with its generic class (tokenizer_class
    PreTrainedTokenizerFast / TokenizersBackend, or no class at all), which applies the whole file:
    BertTokenizer.from_pretrained's arguments that apply it too, or a str saying why the C++ core
    cannot. None for any other checkpoint (a named class such as BertTokenizer builds its own
    normalizer, pre-tokenizer, model settings and post-processor from its arguments). `data`: the
    file already parsed."""
    directory = Path(directory)
    tokenizer_json = directory / "tokenizer.json"
    if not tokenizer_json.is_file() or auto_class(directory) not in GENERIC_CLASSES + ("",):
        return None
    data = _read_tokenizer_json(tokenizer_json) if data is None else data
    if (data.get("model") or {}).get("type") != "WordPiece":
        return None
    arguments = generic_arguments(data, str(tokenizer_json))
    if isinstance(arguments, str):
        return arguments
    if not supported(arguments["post_processor"]):  # e.g. a Sequence of post-processors
        return f"{tokenizer_json}: post_processor {arguments['post_processor'].get('type')!r}"
    config = read_json(directory / "tokenizer_config.json") or {}
    if "model_input_names" not in config:  # the generic class's own: transformers 5 returns no token_type_ids
        from importlib.metadata import version

        if int(version("transformers").split(".")[0]) >= 5:
            arguments["model_input_names"] = NO_TYPE_INPUTS
    return arguments


# transformers' tokenizer classes that fastbert.BertTokenizer reproduces (DistilBERT's drops the token
# type ids, MPNet's has its own template: files.read_pretrained applies both), "Fast" names included
_SERVED_CLASSES = ("BertTokenizer", "DistilBertTokenizer", "MPNetTokenizer")


def _served_class(name: str) -> bool:
    """Whether the tokenizer class auto_class names is one fastbert.BertTokenizer reproduces: "" or
    a generic class (tokenizer.json decides), one of _SERVED_CLASSES, or another name for BERT's
    (transformers' ElectraTokenizer, LayoutLMTokenizer ... are BertTokenizer itself)."""
    if name in ("",) + GENERIC_CLASSES:
        return True
    if name.startswith("model_type:"):
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

        model_type = name.split(":", 1)[1]
        if model_type not in TOKENIZER_MAPPING_NAMES:  # not transformers' (remote code): the files decide
            return True
        named = TOKENIZER_MAPPING_NAMES[model_type]
        named = next((n for n in named if n), None) if isinstance(named, (tuple, list)) else named
        # a model type that names no class, or only the generic one, is left to transformers
        return bool(named) and named not in GENERIC_CLASSES and _served_class(named)
    name = name.removesuffix("Fast")
    if name in _SERVED_CLASSES:
        return True
    import transformers

    return getattr(transformers, name, None) is transformers.BertTokenizer


def _plan(directory: Path) -> tuple[str, dict]:
    """("wordpiece" | "hf", BertTokenizer arguments that a generic tokenizer.json adds), with the
    file read once."""
    if not _served_class(auto_class(directory)):
        return "hf", {}
    tokenizer_json = directory / "tokenizer.json"
    if not tokenizer_json.is_file():
        return ("wordpiece" if (directory / "vocab.txt").is_file() else "hf"), {}
    data = _read_tokenizer_json(tokenizer_json)
    if (data.get("model") or {}).get("type") != "WordPiece":
        return "hf", {}
    # a generic class applies the whole file: one the C++ core cannot apply exactly (a cased or
    # Sequence normalizer the options cannot say, another pre-tokenizer, other WordPiece settings, a
    # Sequence of post-processors) goes to transformers
    overrides = generic_overrides(directory, data)
    return ("hf", {}) if isinstance(overrides, str) else ("wordpiece", overrides or {})


def _has_tokenizer_files(directory: Path) -> bool:
    names = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer_config.json", "tekken.json")
    return any((directory / name).is_file() for name in names) or any(directory.glob("*.model"))


def tokenizer_kind(directory) -> str:
    """"wordpiece" when fastbert.BertTokenizer can serve `directory`, "hf" otherwise."""
    return _plan(Path(directory))[0]


def local_dir(path, subfolder=None, **hub) -> Path:
    """The local directory for a checkpoint path or hub id (fastbert.hub's one resolver: the HF
    cache first, then a download of the whole repository unless HF_HUB_OFFLINE is set; `hub`: its
    revision, cache_dir, local_files_only and token), `subfolder` under it. Errors are OSErrors
    naming the path."""
    from fastbert.hub import resolve_directory

    directory = Path(resolve_directory(path, patterns=None, **hub)) / (subfolder or "")
    if not directory.is_dir():
        raise OSError(f"{path!r}: tokenizer subfolder not found: {directory}")
    return directory


_HUB_ARGUMENTS = HUB_ARGUMENTS + ("subfolder",)


class AutoTokenizer:
    """Picks the tokenizer class for a checkpoint; not instantiable itself (as transformers')."""

    def __init__(self):
        raise TypeError("use fastbert.AutoTokenizer.from_pretrained(path)")

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        # where a hub id comes from, as transformers takes it; the files then come from that directory
        directory = local_dir(path, **{k: kwargs.pop(k) for k in _HUB_ARGUMENTS if k in kwargs})
        kind, overrides = _plan(directory)
        if kind == "wordpiece":
            return BertTokenizer.from_pretrained(str(directory), **{**overrides, **kwargs})
        if not _has_tokenizer_files(directory):
            # transformers would build the model type's class with no vocabulary (only its special
            # tokens), and every word would come out [UNK]
            raise OSError(f"{directory}: no tokenizer files (tokenizer.json, vocab.txt, vocab.json, a "
                          "SentencePiece .model or tokenizer_config.json); save the tokenizer next to the model")
        import transformers
        return transformers.AutoTokenizer.from_pretrained(str(directory), use_fast=True, **kwargs)
