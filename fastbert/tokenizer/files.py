"""Tokenizer files: reading a checkpoint's vocab.txt / tokenizer.json, tokenizer_config.json and
special_tokens_map.json into BertTokenizer arguments, and writing them back (loadable by fastbert
and by transformers). Every malformed value is an error naming its file."""
from __future__ import annotations

import json
import os
from typing import Any

SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# MPNetTokenizer's defaults (a vocab.txt whose tokenizer_config.json names that class)
MPNET_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]", "sep_token": "</s>",
                  "pad_token": "<pad>", "cls_token": "<s>",
                  "mask_token": {"content": "<mask>", "lstrip": True, "special": True}}
NO_TYPE_INPUTS = ["input_ids", "attention_mask"]
GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")  # apply tokenizer.json's post-processor
# what the C++ core does besides its options: tokenizers' BertNormalizer defaults (a key left out of the file),
# BERT's pre-tokenizer, WordPiece with "##" and 100 characters a word, the WordPiece decoder with cleanup
BERT_NORMALIZER = {"clean_text": True, "handle_chinese_chars": True, "strip_accents": None, "lowercase": True}
CORE_WORDPIECE = {"continuing_subword_prefix": "##", "max_input_chars_per_word": 100}
CORE_DECODER = {"type": "WordPiece", "prefix": "##", "cleanup": True}


def read_json(path):
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot parse {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def vocab_list(vocab: dict, where: str) -> list[str]:
    # tokenizer.json ids may have gaps, which HF keeps (a gap id decodes to nothing). A gap slot
    # holds the token of the highest id: a repeated token maps to its last position, so the slot
    # has no token of its own, as a line repeated in vocab.txt. Shared ids are ambiguous: refused.
    by_id: dict[int, str] = {}
    for t, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{where}: the id of token {t!r} must be an int, got {type(i).__name__} {i!r}")
        if i < 0:
            raise ValueError(f"{where}: token {t!r} has a negative id {i}")
        if i in by_id:
            raise ValueError(f"{where}: tokens {by_id[i]!r} and {t!r} have the same id {i}")
        by_id[i] = t
    if not by_id:
        return []
    top = max(by_id)
    if top >= 2 * len(by_id) + 1024:
        raise ValueError(f"{where}: token {by_id[top]!r} has id {top}, far beyond the {len(by_id)} tokens")
    tokens = [by_id[top]] * (top + 1)
    for i, t in by_id.items():
        tokens[i] = t
    return tokens


def added_entry(a, where: str, i=None) -> dict:
    # an added token from tokenizer.json / added_tokens_decoder: a dict with a str content and an int id
    i = a.get("id") if i is None and isinstance(a, dict) else i
    try:
        i = int(i)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: an added token needs an int id, got {a!r}") from None
    if not isinstance(a, dict) or not isinstance(a.get("content"), str):
        raise ValueError(f"{where}: added token {i} needs a str 'content', got {a!r}")
    return dict(a, id=i)


def config_value(key: str, value, where: str):
    # tokenizer_config.json values, typed as transformers reads them: bool("no") would be True
    if key in ("do_lower_case", "tokenize_chinese_chars", "clean_up_tokenization_spaces", "strip_accents",
               "clean_text", "split_special_tokens"):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
    elif key == "model_max_length":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: model_max_length must be an int, got {value!r}")
    return value


def auto_class(directory) -> str:
    """The tokenizer class transformers.AutoTokenizer names for `directory`: tokenizer_config.json's
    tokenizer_class, else config.json's; "" where neither names one and config.json has no
    model_type (transformers then builds its generic class from tokenizer.json); "model_type:<type>"
    where the model type picks a named class."""
    config = read_json(os.path.join(directory, "tokenizer_config.json")) or {}
    model_config = read_json(os.path.join(directory, "config.json")) or {}
    name = config.get("tokenizer_class") or model_config.get("tokenizer_class")
    if name:
        return str(name)
    return f"model_type:{model_config['model_type']}" if model_config.get("model_type") else ""


def generic_arguments(tokenizer_json: dict, where: str) -> dict | str:
    """BertTokenizer's arguments that apply all of `tokenizer_json` as transformers' generic class does
    (PreTrainedTokenizerFast / TokenizersBackend: normalizer, pre-tokenizer, model, post-processor and
    decoder from the file), or a str saying which part the C++ core cannot apply exactly."""
    normalizer = tokenizer_json.get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        kind = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
        return f"{where}: normalizer {kind!r} (fastbert.BertTokenizer applies a BertNormalizer only)"
    settings = {k: normalizer.get(k, v) for k, v in BERT_NORMALIZER.items()}
    for k, v in settings.items():
        if not (isinstance(v, bool) or (k == "strip_accents" and v is None)):
            return f"{where}: normalizer {k} {v!r} (expected true or false)"
    pre = tokenizer_json.get("pre_tokenizer")
    if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
        kind = pre.get("type") if isinstance(pre, dict) else pre
        return f"{where}: pre_tokenizer {kind!r} (fastbert.BertTokenizer applies a BertPreTokenizer only)"
    model = tokenizer_json.get("model") or {}
    for k, v in CORE_WORDPIECE.items():
        if model.get(k, v) != v:
            return f"{where}: model {k} {model.get(k)!r} (fastbert.BertTokenizer uses {v!r})"
    decoder = tokenizer_json.get("decoder")
    if not isinstance(decoder, dict) or {k: decoder.get(k, v) for k, v in CORE_DECODER.items()} != CORE_DECODER:
        return f"{where}: decoder {decoder!r} (fastbert.BertTokenizer decodes as {CORE_DECODER})"
    post_processor = tokenizer_json.get("post_processor")
    if post_processor is None:  # no special tokens at all, where None means BERT's template to fastbert
        return f"{where}: no post_processor (fastbert.BertTokenizer adds a template's special tokens)"
    return {"do_lower_case": settings["lowercase"], "strip_accents": settings["strip_accents"],
            "clean_text": settings["clean_text"], "tokenize_chinese_chars": settings["handle_chinese_chars"],
            "post_processor": post_processor}


# what a tokenizer's files can be called; a hub download of a tokenizer fetches only these
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "config.json")
HUB_ARGUMENTS = ("revision", "cache_dir", "local_files_only", "token")


def locate(path, subfolder: str | None = None, **hub) -> str:
    """The local folder (or file) a tokenizer loads from, as transformers' from_pretrained finds it: a
    local path (with `subfolder` under it), else a hub id ("org/name") from the Hugging Face cache,
    then downloaded unless offline (`hub`: revision, cache_dir, local_files_only, token)."""
    unknown = set(hub) - set(HUB_ARGUMENTS)
    if unknown:
        raise TypeError(f"unsupported hub argument(s) {sorted(unknown)}; supported: {HUB_ARGUMENTS}")
    path = os.path.expanduser(os.fspath(path))
    sub = subfolder or ""
    if os.path.exists(path):
        local = os.path.join(path, sub) if sub else path
        if not os.path.exists(local):
            raise OSError(f"tokenizer subfolder not found: {local}")
        return local
    from fastbert.hub import resolve_directory

    patterns = [f"{sub}/{name}" if sub else name for name in TOKENIZER_FILES]
    try:
        directory = resolve_directory(path, patterns, **hub)
    except FileNotFoundError as e:
        raise OSError(f"tokenizer path not found: {path} (not a local directory or file, nor a hub id found "
                      f"in the Hugging Face cache or on the hub): {e}") from e
    local = os.path.join(directory, sub) if sub else directory
    if not os.path.isdir(local):
        raise OSError(f"{path!r}: no subfolder {sub!r} in {directory}")
    return local


def read_pretrained(path) -> dict[str, Any]:
    """BertTokenizer's keyword arguments from a local directory (or a vocab.txt / tokenizer.json file)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        directory, file = path, None
    elif os.path.isfile(path):
        directory, file = os.path.dirname(path) or ".", path
    else:
        raise OSError(f"tokenizer path not found: {path} (expected a directory with vocab.txt or "
                      "tokenizer.json, or one of those files)")
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = read_json(config_path) or {}
    special_map = read_json(os.path.join(directory, "special_tokens_map.json")) or {}
    kwargs: dict[str, Any] = {}
    for k in ("do_lower_case", "tokenize_chinese_chars", "strip_accents", "model_max_length",
              "padding_side", "truncation_side", "clean_up_tokenization_spaces", "clean_text", "split_special_tokens"):
        if k in config and config[k] is not None:
            kwargs[k] = config_value(k, config[k], config_path)
    if "strip_accents" in config:
        kwargs["strip_accents"] = config["strip_accents"]
    tokenizer_class = str(config.get("tokenizer_class") or "")
    mpnet = tokenizer_class.startswith("MPNet")
    for k in SPECIAL_ATTRS:
        v = special_map.get(k, config.get(k))
        if v is None and mpnet:
            v = MPNET_SPECIALS[k]
        if v is not None:
            kwargs[k] = v
    if "model_input_names" in config or mpnet or tokenizer_class.startswith("DistilBert"):
        # transformers' MPNet and DistilBERT tokenizers return no token_type_ids (their models take none)
        kwargs["model_input_names"] = config.get("model_input_names") or NO_TYPE_INPUTS
    extra = special_map.get("additional_special_tokens", config.get("additional_special_tokens"))
    if not extra:  # transformers >= 5 saves them as extra_special_tokens (a list, or named tokens)
        extra = special_map.get("extra_special_tokens", config.get("extra_special_tokens"))
        if isinstance(extra, dict):
            extra = list(extra.values())
    if extra:
        kwargs["additional_special_tokens"] = extra
    added: dict[int, dict] = {}
    tok_json_path = file if file and file.endswith(".json") else os.path.join(directory, "tokenizer.json")
    vocab_path = file if file and not file.endswith(".json") else os.path.join(directory, "vocab.txt")
    tj = read_json(tok_json_path) if (file is None or file == tok_json_path) else None
    if tj is not None:
        model = tj.get("model") or {}
        if not isinstance(model, dict) or model.get("type", "WordPiece") != "WordPiece" or "vocab" not in model:
            kind = model.get("type") if isinstance(model, dict) else type(model).__name__
            raise ValueError(f"{tok_json_path}: not a WordPiece tokenizer (model type {kind!r})")
        vocab = model["vocab"]
        kwargs["vocab"] = vocab if isinstance(vocab, dict) else [v[0] if isinstance(v, list) else v for v in vocab]
        kwargs["_source_path"] = tok_json_path
        if config.get("tokenizer_class") in GENERIC_CLASSES:
            kwargs["post_processor"] = tj.get("post_processor")
        for a in tj.get("added_tokens") or []:
            a = added_entry(a, tok_json_path)
            added[a["id"]] = a
    elif os.path.isfile(vocab_path):
        kwargs["vocab_file"] = vocab_path
    else:
        raise OSError(f"no vocab.txt or tokenizer.json in {directory}")
    if mpnet:
        # transformers' named tokenizer classes build their own post-processor, whatever tokenizer.json
        # holds: BertTokenizer BERT's (the default here), MPNetTokenizer RobertaProcessing with its cls /
        # sep tokens (<s> A </s></s> B </s>, every type id 0); only the generic classes keep the file's
        kwargs["post_processor"] = {"type": "RobertaProcessing"}
    for id_str, a in (config.get("added_tokens_decoder") or {}).items():
        a = added_entry(a, config_path, id_str)
        added[a["id"]] = a
    kwargs["added_tokens"] = [dict(a, id=i) for i, a in sorted(added.items())]
    kwargs["name_or_path"] = path
    return kwargs


def write_vocab(save_directory, tokens: list[str], filename_prefix: str | None = None) -> str:
    """Writes vocab.txt (after `filename_prefix` and "-" when given), one token a line; -> its path."""
    save_directory = os.fspath(save_directory)
    if os.path.isfile(save_directory):
        raise OSError(f"saving a tokenizer needs a directory, {save_directory} is a file")
    os.makedirs(save_directory, exist_ok=True)
    vocab_path = os.path.join(save_directory, (f"{filename_prefix}-" if filename_prefix else "") + "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
        for t in tokens:
            f.write(t + "\n")
    return vocab_path


def write_pretrained(save_directory, tokens: list[str], added: list[dict], config: dict,
                     specials: dict, filename_prefix: str | None = None) -> tuple[str, str, str]:
    """Writes vocab.txt (the base vocabulary `tokens`), tokenizer_config.json (`config`, the added
    tokens with their ids and the special tokens) and special_tokens_map.json (`specials`), each
    name after `filename_prefix` and "-" when given (transformers' names)."""
    prefix = f"{filename_prefix}-" if filename_prefix else ""
    save_directory = os.fspath(save_directory)
    vocab_path = write_vocab(save_directory, tokens, filename_prefix)
    decoder = {}
    for a in added:
        decoder[str(a["id"])] = {"content": a["content"], "lstrip": bool(a.get("lstrip", False)),
                                 "normalized": bool(a.get("normalized", False)),
                                 "rstrip": bool(a.get("rstrip", False)),
                                 "single_word": bool(a.get("single_word", False)),
                                 "special": bool(a.get("special", False))}
    config = {"tokenizer_class": "BertTokenizer", **config,
              "added_tokens_decoder": dict(sorted(decoder.items(), key=lambda kv: int(kv[0]))), **specials}
    config_path = os.path.join(save_directory, prefix + "tokenizer_config.json")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    map_path = os.path.join(save_directory, prefix + "special_tokens_map.json")
    with open(map_path, "w", encoding="utf-8") as f:
        json.dump(specials, f, indent=2, ensure_ascii=False)
    return vocab_path, config_path, map_path
