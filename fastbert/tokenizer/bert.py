"""BertTokenizer: an HF-compatible BERT tokenizer over the C++ WordPiece core (fastbert._C).

It behaves like `transformers.BertTokenizerFast` (same ids, type ids, masks, offsets, overflow
windows, padding), with the batch work done in C++ on a thread pool without the GIL. The pieces it
uses, each in its own module: options (strategies, the named C++ options), encoding (BatchEncoding),
files (loading / saving), pad (tokenizer.pad), alignment (word_ids(), char_to_token(), ...).
"""
from __future__ import annotations

import logging
import operator
import os
import warnings
from typing import Any, Iterable

import numpy as np
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from fastbert import _C
from fastbert.tokenizer import files, pad as pad_module, template
from fastbert.tokenizer.alignment import Aligner
from fastbert.tokenizer.encoding import BatchEncoding, as_tensor
from fastbert.tokenizer.files import SPECIAL_ATTRS
from fastbert.tokenizer.options import (MAX_SIZE, SIDES, VERY_LARGE_INTEGER, OptionsCache, count, enum_value,
                                       resolve_strategies)

logger = logging.getLogger(__name__)

_MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))  # a pool this size still starts; 10**6 threads do not
DEFAULT_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                    "cls_token": "[CLS]", "mask_token": "[MASK]"}
# keyword arguments transformers' __call__ takes beyond its named parameters
_HF_EXTRA_KWARGS = ("tokenizer_kwargs", "max_target_length")
# __call__ arguments transformers' tokenize() takes and ignores (it neither truncates nor pads)
_TOKENIZE_IGNORES = ("truncation", "max_length", "stride", "padding", "pad_to_multiple_of", "padding_side",
                     "return_overflowing_tokens")


def _cleanup(text: str) -> str:
    # transformers' clean_up_tokenization and the WordPiece decoder's cleanup (same replacements)
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _decoder_cleanup(token: str) -> str:
    return _cleanup(token).replace(" do not", " don't")


def _split_flag(value) -> bool:
    """split_special_tokens as given (to the constructor or a call, or set as the attribute): a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"split_special_tokens must be a bool, got {value!r}")
    return value


def _token_str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):
        return v.get("content")
    return str(v)



def _token_id(value, position: int) -> int:
    # an id for decode / convert_ids_to_tokens: no silent int() of 101.5, no negative id dropped
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"token id at position {position} must be an int, got {type(value).__name__} {value!r}") \
            from None
    if i < 0:
        raise ValueError(f"token id at position {position} is negative: {i}")
    return i


def _kind(value) -> str:
    # a type name for error messages, with the fix for array-likes (numpy, pandas)
    name = type(value).__name__
    return f"{name} (convert it with .tolist())" if hasattr(value, "tolist") else name


def _freeze(texts, split_words):
    # str is immutable; the lists holding them (and pre-split words) may change after the call
    if texts is None:
        return None
    if split_words:
        return tuple(None if words is None else tuple(words) for words in texts)  # None: no pair
    return texts if isinstance(texts, tuple) else tuple(texts)



def _is_pair(item, split_words: bool) -> bool:
    # a batch item that is a (text, text_pair) pair: a list / tuple of str, or of word lists when pre-split
    if not isinstance(item, (list, tuple)):
        return False
    return not split_words or (bool(item) and isinstance(item[0], (list, tuple)))


def _unzip_pairs(items, split_words: bool):
    # [(a, b), c, ...] -> (a, c, ...), (b, None, ...), as tokenizers takes a batch of pairs (None: an
    # item without a pair, in a batch mixing texts and pairs)
    firsts, seconds = [], []
    for k, item in enumerate(items):
        if not _is_pair(item, split_words):
            firsts.append(item)
            seconds.append(None)
            continue
        if len(item) != 2:
            raise TypeError(f"batch item {k}: a pair must be (text, text_pair), got a {type(item).__name__} of "
                            f"{len(item)} {'word lists' if split_words else 'texts'}")
        firsts.append(item[0])
        seconds.append(item[1])
    return tuple(firsts), tuple(seconds)


def _token_flags(token, special: bool) -> dict:
    """lstrip, rstrip, single_word and normalized of an AddedToken-like object, as added with `special`.
    tokenizers' AddedToken reports an unset `normalized` as `not token.special`, and adding it as a
    special token makes that False (tokenizers sets `special` first): read the flags that way too."""
    was = getattr(token, "special", None)
    marked = special and was is False
    if marked:
        try:
            token.special = True
        except (AttributeError, TypeError):  # a read-only AddedToken-like object: its flags as they are
            marked = False
    try:
        return {k: bool(getattr(token, k)) for k in ("lstrip", "rstrip", "single_word", "normalized")
                if getattr(token, k, None) is not None}
    finally:
        if marked:
            token.special = was


def _batch_items(text, text_pair, split_words: bool):
    """(batched, texts, pairs) for every input form of transformers' __call__: a str (and a str pair),
    a list of str (and a list of pairs), a list of (text, text_pair) pairs, and with split_words the
    same with word lists in place of str."""
    if split_words:
        batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
    else:
        batched = isinstance(text, (list, tuple))
        if not batched and not isinstance(text, str):
            raise TypeError(f"text must be a str or a list of str, got {_kind(text)}")
    if not batched:
        wanted = (list, tuple) if split_words else str
        if text_pair and not isinstance(text_pair, wanted):  # an empty one is no pair, as in transformers
            raise TypeError(f"text_pair must be {'a list of words' if split_words else 'a str'} "
                            f"like text, got {_kind(text_pair)}")
        return False, [text], ([text_pair] if text_pair else None)
    if isinstance(text_pair, str):
        raise TypeError("when tokenizing batches of text, `text_pair` must be a list or tuple with the "
                        "same length as `text`.")
    if text_pair is not None and not isinstance(text_pair, (list, tuple)):
        raise TypeError(f"text_pair must be a list or tuple with the same length as text, got {_kind(text_pair)}")
    if text_pair is not None and len(text) != len(text_pair):
        raise ValueError(f"batch length of `text`: {len(text)} does not match batch length of "
                         f"`text_pair`: {len(text_pair)}.")
    if text_pair is not None and None in text_pair:  # None marks "no pair" to the core: never from the user
        raise TypeError(f"text_pair item {list(text_pair).index(None)} is NoneType, not str")
    if text_pair is None and text and _is_pair(text[0], split_words):
        return True, *_unzip_pairs(text, split_words)
    return True, text, text_pair


def _rebuild(cls, state):
    return cls(**state)


class _AddedSpecial:
    # a str given to add_special_tokens: transformers makes it AddedToken(normalized=False, special=True)
    __slots__ = ("content",)
    special, lstrip, rstrip, single_word, normalized = True, False, False, False, False

    def __init__(self, content: str):
        self.content = content


class _WordPieceView:
    __slots__ = ("continuing_subword_prefix",)

    def __init__(self, prefix: str):
        self.continuing_subword_prefix = prefix


class _BackendView:
    __slots__ = ("model",)

    def __init__(self, model):
        self.model = model


def _wanted_outputs(model_input_names, return_token_type_ids, return_attention_mask) -> tuple[bool, bool]:
    # token_type_ids / attention_mask: as asked, else as the model's inputs say
    want_types = "token_type_ids" in model_input_names if return_token_type_ids is None \
        else bool(return_token_type_ids)
    want_attn = "attention_mask" in model_input_names if return_attention_mask is None \
        else bool(return_attention_mask)
    return want_types, want_attn


class _OneText:
    """What the one-text path of __call__ / encode reads, mirrored from the tokenizer as it is set (its
    __setattr__): the base class's __getattr__ makes every attribute read on the tokenizer several
    times slower than on a plain object (no specialised lookup), and a loop over single texts read ~15
    per call, a fifth of its time."""

    __slots__ = ("padding_side", "truncation_side", "model_input_names", "model_max_length", "_split_special_tokens",
                 "_core", "_aligner", "_one_text", "warned_long")

    def __init__(self):
        self.warned_long = False   # transformers' too-long notice, given once per tokenizer

    def call(self, text: str, add_special_tokens, return_token_type_ids, return_attention_mask,
             verbose) -> BatchEncoding:
        """__call__ on one str with no padding, truncation or extra outputs: what a loop over single
        texts calls. The same result as the general path, without its per-call argument handling."""
        want_types, want_attn = _wanted_outputs(self.model_input_names, return_token_type_ids, return_attention_mask)
        out, options = self.encode(text, add_special_tokens, want_types, want_attn, verbose)
        enc = BatchEncoding({k: v[0] for k, v in out.items()})
        enc._source = (self._aligner, [text], None, options, False)
        return enc

    def encode(self, text: str, add_special_tokens, want_types: bool, want_attn: bool, verbose):
        """The C++ output (rows of one) and the options it was made with."""
        options = self._one_text[self._split_special_tokens, bool(add_special_tokens), want_types, want_attn]
        out, longest = self._core.encode_batch((text,), None, options)
        if verbose:
            self.warn_if_long(longest)
        return out, options

    def warn_if_long(self, longest: int) -> None:
        # transformers' notice, once per tokenizer, for a sequence longer than the model takes
        if self.warned_long or longest <= self.model_max_length:
            return
        logger.warning("Token indices sequence length is longer than the specified maximum sequence length "
                       f"for this model ({longest} > {self.model_max_length}). Running this sequence through "
                       "the model will result in indexing errors")
        self.warned_long = True


class BertTokenizer(PreTrainedTokenizerBase):
    """A WordPiece BERT tokenizer with `transformers.BertTokenizerFast`'s behaviour and API.

    It is a `transformers.PreTrainedTokenizerBase`, so code that checks for one takes it (Trainer
    pads batches with DataCollatorWithPadding for it). The base's __init__ does not run (its state is
    transformers' own tokenizers'): this class defines the base's public methods over the C++ core,
    and plain attribute access in place of the base's special-token routing."""

    chat_template = None   # BERT tokenizers have none: apply_chat_template says so, as transformers'

    vocab_files_names = {"vocab_file": "vocab.txt"}
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    is_fast = True
    pad_token_type_id = 0

    def __init__(self, vocab_file: str | None = None, do_lower_case: bool = True, unk_token="[UNK]",
                 sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                 tokenize_chinese_chars: bool = True, strip_accents: bool | None = None, *,
                 vocab: list[str] | dict[str, int] | None = None, model_max_length: int | None = None,
                 padding_side: str = "right", truncation_side: str = "right",
                 clean_up_tokenization_spaces: bool = False, added_tokens: Iterable[dict] | None = None,
                 additional_special_tokens: Iterable | None = None, num_threads: int | None = None,
                 clean_text: bool = True, name_or_path: str = "", bos_token=None, eos_token=None,
                 post_processor: dict | None = None, model_input_names: Iterable[str] | None = None,
                 split_special_tokens: bool = False, **kwargs):
        object.__setattr__(self, "_hot", _OneText())
        self._hot.model_input_names = self.model_input_names   # the class's, until __init__ sets its own
        if vocab is None:
            if vocab_file is None:
                raise ValueError("BertTokenizer needs a vocab_file (vocab.txt) or a vocab")
            vocab_file = os.fspath(vocab_file)
            if not os.path.isfile(vocab_file):
                raise OSError(f"vocabulary file not found: {vocab_file}")
            source: Any = vocab_file
        elif isinstance(vocab, dict):
            source = files.vocab_list(vocab, kwargs.get("_source_path") or "vocab")
        else:
            source = list(vocab)
        self.do_lower_case = bool(do_lower_case)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.clean_text = bool(clean_text)
        self.strip_accents = strip_accents
        self.model_max_length = VERY_LARGE_INTEGER if model_max_length is None else int(model_max_length)
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if truncation_side not in ("right", "left"):
            raise ValueError(f"truncation_side must be 'right' or 'left', got {truncation_side!r}")
        self.padding_side = padding_side
        self.truncation_side = truncation_side
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        # transformers' attribute: special tokens written in the text are tokenized as text (every call
        # that does not say otherwise)
        self.split_special_tokens = split_special_tokens
        self.name_or_path = name_or_path
        source_path = kwargs.pop("_source_path", None)  # tokenizer.json, for error messages
        self.init_kwargs = dict(kwargs)
        # transformers' order; bos / eos are None for BERT (and left out of special_tokens_map)
        specials = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token, "sep_token": sep_token,
                    "pad_token": pad_token, "cls_token": cls_token, "mask_token": mask_token}
        self._special = {k: _token_str(v) for k, v in specials.items()}
        self.additional_special_tokens = [_token_str(t) for t in (additional_special_tokens or [])]

        # Added tokens: never split. Flags come from the files (added_tokens_decoder / tokenizer.json)
        # or the special token values; specials not in the vocab get new ids, as in HF.
        entries: dict[str, dict] = {}
        for a in sorted(added_tokens or [], key=lambda a: a.get("id", 0)):
            entries[a["content"]] = a
        for v in list(specials.values()) + list(additional_special_tokens or []):
            content = _token_str(v)
            if content is None or content in entries:
                continue
            flags = v if isinstance(v, dict) else {}
            entries[content] = {"content": content, "special": True, "lstrip": flags.get("lstrip", False),
                                "rstrip": flags.get("rstrip", False),
                                "single_word": flags.get("single_word", False), "normalized": False}
        self._added = list(entries.values())
        self._special_contents = {a["content"] for a in self._added if a.get("special", False)}
        self._num_threads = self._resolve_threads(num_threads)
        resolved_strip = self.do_lower_case if strip_accents is None else bool(strip_accents)
        source_name = vocab_file if vocab is None else (source_path or "the vocabulary")
        try:
            self._core = self._make_core(source, resolved_strip, clean_text, unk_token)
        except ValueError as e:
            if "unknown token" in str(e):
                raise ValueError(f"{source_name}: {e}") from None
            raise
        self._base_size = self._core.base_size()
        self._normalized_ids = {self._core.token_to_id(a["content"]) for a in self._added
                                if a.get("normalized", not a.get("special", False))}
        # what goes around the sequences: tokenizer.json's post-processor, else BERT's (MPNet's
        # RobertaProcessing gives <s> A </s></s> B </s>)
        if model_input_names is not None:
            self.model_input_names = list(model_input_names)
        self._post_processor = post_processor
        single, pair = template.build(post_processor, self._core.token_to_id, self.cls_token, self.sep_token,
                                      source_name)
        try:
            self._core.set_template(single, pair)
        except ValueError as e:
            raise ValueError(f"{source_name}: {e}") from None
        self._templates = (single, pair)
        self._num_specials = (template.specials(single), template.specials(pair))
        self._aligner = Aligner(self._core, self._added, self._special, template.gaps(single, pair))
        self._options = OptionsCache()
        # the options of one text without padding or truncation, by (split_special_tokens,
        # add_special_tokens, token_type_ids, attention_mask): what a loop over single texts calls
        self._one_text = {(split, special, types, attn): self._options.get(
                              split_special_tokens=split, add_special_tokens=special, type_ids=types,
                              attention_mask=attn)
                          for split in (False, True) for special in (False, True) for types in (False, True)
                          for attn in (False, True)}

    def _make_core(self, source, resolved_strip, clean_text, unk_token):
        return _C.Tokenizer(
            source, self.do_lower_case, resolved_strip, self.tokenize_chinese_chars, bool(clean_text),
            _token_str(unk_token) or "[UNK]", "##", 100,
            [(a["content"], bool(a.get("lstrip", False)), bool(a.get("rstrip", False)),
              bool(a.get("single_word", False)), bool(a.get("normalized", not a.get("special", False))),
              bool(a.get("special", False)))
             for a in self._added])

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path, *, subfolder: str | None = None, **overrides) -> "BertTokenizer":
        """Loads vocab.txt / tokenizer.json, tokenizer_config.json and special_tokens_map.json
        from a local directory (or a vocab.txt / tokenizer.json file) or a hub id ("org/name": the
        Hugging Face cache first, so it works offline), with transformers' `subfolder`, `revision`,
        `cache_dir`, `local_files_only` and `token`. Other keyword arguments override the files
        (do_lower_case, strip_accents, tokenize_chinese_chars, model_max_length, special tokens,
        num_threads, ...)."""
        hub = {k: overrides.pop(k) for k in files.HUB_ARGUMENTS if k in overrides}
        kwargs = files.read_pretrained(files.locate(path, subfolder, **hub))
        kwargs["name_or_path"] = os.fspath(path)   # as given (a hub id stays one), as transformers
        kwargs.update(overrides)
        return cls(**kwargs)

    def __getattr__(self, name: str):
        # only for names not found: the base's would look them up in state its __init__ sets
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        # plain setting (the base routes special-token names to its own state), mirrored to _hot
        object.__setattr__(self, name, value)
        if name in _OneText.__slots__:
            setattr(self.__dict__["_hot"], name, value)

    def push_to_hub(self, *args, **kwargs):
        raise NotImplementedError("fastbert.BertTokenizer does not push to the hub: save_pretrained() to a directory "
                                  "and upload it with huggingface_hub")

    @staticmethod
    def _resolve_threads(n):
        if n is None:
            try:
                return max(1, len(os.sched_getaffinity(0)))
            except AttributeError:
                return max(1, os.cpu_count() or 1)
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"num_threads must be an int or None, got {type(n).__name__} {n!r}") from None
        if not 1 <= n <= _MAX_THREADS:
            raise ValueError(f"num_threads must be between 1 and {_MAX_THREADS}, got {n}")
        return n

    def _id_or(self, token, default):
        if token is None:
            return default
        i = self._core.token_to_id(token)
        return default if i is None else i

    def __reduce__(self):
        # the C++ core is rebuilt from the vocabulary and the settings (pickle, copy.deepcopy)
        return (_rebuild, (type(self), self._state()))

    def _state(self) -> dict:
        """The constructor's arguments that rebuild this tokenizer."""
        return dict(vocab=list(self._core.tokens()[:self._core.base_ids()]), do_lower_case=self.do_lower_case,
                     tokenize_chinese_chars=self.tokenize_chinese_chars, strip_accents=self.strip_accents,
                     model_max_length=self.model_max_length, padding_side=self.padding_side,
                     truncation_side=self.truncation_side, clean_text=self.clean_text,
                     clean_up_tokenization_spaces=self.clean_up_tokenization_spaces,
                     added_tokens=[dict(a, id=self._core.token_to_id(a["content"])) for a in self._added],
                     additional_special_tokens=list(self.additional_special_tokens),
                     num_threads=self._num_threads, name_or_path=self.name_or_path,
                     post_processor=self._post_processor, model_input_names=list(self.model_input_names),
                     split_special_tokens=self.split_special_tokens,
                     **{k: self._special[k] for k in SPECIAL_ATTRS}, **self.init_kwargs)

    def clear_cache(self) -> None:
        """Forgets the per-thread word caches (results never depend on them; timings do)."""
        self._core.clear_cache()

    # ------------------------------------------------------------------------------ attributes
    @property
    def split_special_tokens(self) -> bool:
        return self._split_special_tokens

    @split_special_tokens.setter
    def split_special_tokens(self, value) -> None:
        # checked once here, not on every call that reads it
        self._split_special_tokens = _split_flag(value)

    @property
    def _tokenizer(self):
        """What transformers' token-classification pipeline reads of a fast tokenizer's backend
        (`_tokenizer.model.continuing_subword_prefix`) to tell subwords from words next to
        punctuation; without it the pipeline guesses word boundaries from spaces."""
        return _BackendView(_WordPieceView("##"))

    @property
    def num_threads(self) -> int:
        return self._num_threads

    @num_threads.setter
    def num_threads(self, n):
        self._num_threads = self._resolve_threads(n)

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without added tokens), like HF."""
        return self._base_size

    def __len__(self) -> int:
        return len(self._core)

    def get_vocab(self) -> dict[str, int]:
        # a token repeated in vocab.txt keeps its last id, as in HF
        return {t: i for i, t in enumerate(self._core.tokens())}

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {a["content"]: self._core.token_to_id(a["content"]) for a in self._added}

    def _special_token(name):  # noqa: N805  (property factory)
        def get(self):
            return self._special.get(name)

        def set_(self, value):
            self._special[name] = _token_str(value)
        return property(get, set_)

    unk_token = _special_token("unk_token")
    sep_token = _special_token("sep_token")
    pad_token = _special_token("pad_token")
    cls_token = _special_token("cls_token")
    mask_token = _special_token("mask_token")
    bos_token = _special_token("bos_token")
    eos_token = _special_token("eos_token")

    def _special_id(name):  # noqa: N805
        return property(lambda self: None if self._special.get(name) is None
                        else self.convert_tokens_to_ids(self._special[name]))

    unk_token_id = _special_id("unk_token")
    sep_token_id = _special_id("sep_token")
    pad_token_id = _special_id("pad_token")
    cls_token_id = _special_id("cls_token")
    mask_token_id = _special_id("mask_token")
    bos_token_id = _special_id("bos_token")
    eos_token_id = _special_id("eos_token")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        # the named tokens only, as in transformers >= 5; the others are extra_special_tokens
        return {k: v for k, v in self._special.items() if v is not None}

    @property
    def extra_special_tokens(self) -> list[str]:
        return list(self.additional_special_tokens)

    @property
    def all_special_tokens(self) -> list[str]:
        seen = []
        for t in list(self._special.values()) + list(self.additional_special_tokens):
            if t is not None and t not in seen:
                seen.append(t)
        return seen

    @property
    def all_special_ids(self) -> list[int]:
        return [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self._num_specials[bool(pair)]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens: bool = False
                                ) -> list[int]:
        """1 for a special token, 0 for a sequence token. already_has_special_tokens: the ids are a
        finished encoding, marked by membership in all_special_ids (as transformers does, and as
        DataCollatorForLanguageModeling calls it); else where the template puts its special tokens
        around token_ids_0 (and token_ids_1)."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise ValueError("You should not supply a second sequence if the provided sequence of ids is "
                                 "already formatted with special tokens for the model.")
            special = set(self.all_special_ids)
            return [1 if int(t) in special else 0 for t in token_ids_0]
        single, pair = self._templates
        mask = []
        for piece, _ in (single if token_ids_1 is None else pair):
            if piece == template.SEQ_A:
                mask += [0] * len(token_ids_0)
            elif piece == template.SEQ_B:
                mask += [0] * len(token_ids_1)
            else:
                mask.append(1)
        return mask

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        """As transformers' add_tokens: str or AddedToken-like objects (content, lstrip, rstrip,
        single_word, normalized, special), one or a list. Each becomes an added token, never split; one
        missing from the vocabulary gets the next id. Returns how many were added (tokens already added,
        and empty ones, are skipped)."""
        items = new_tokens if isinstance(new_tokens, (list, tuple)) else [new_tokens]
        known = {a["content"] for a in self._added}
        fresh = []
        for token in items:
            if isinstance(token, str):
                entry = {"content": token, "special": bool(special_tokens)}
            elif isinstance(getattr(token, "content", None), str):
                entry = {"content": token.content,
                         "special": bool(special_tokens or getattr(token, "special", False))}
                entry.update(_token_flags(token, entry["special"]))
            else:
                raise TypeError(f"add_tokens takes str or AddedToken tokens, got {type(token).__name__}: {token!r}")
            if not entry["content"] or entry["content"] in known:
                continue
            entry.setdefault("normalized", not entry["special"])
            known.add(entry["content"])
            fresh.append(entry)
        if not fresh:
            return 0
        next_id = len(self)
        for entry in fresh:   # a vocabulary entry keeps its id; the others follow every id in use, in order
            known_id = self._core.token_to_id(entry["content"])
            entry["id"] = known_id if known_id is not None else next_id
            next_id += known_id is None
        self._rebuild(fresh)
        return len(fresh)

    def _rebuild(self, fresh_added: list[dict]) -> None:
        # this tokenizer made again from its state (special tokens, template) with `fresh_added` added
        state = self._state()
        state["added_tokens"] = state["added_tokens"] + fresh_added
        rebuilt = type(self)(**state)
        self.__dict__.update(rebuilt.__dict__)

    def add_special_tokens(self, special_tokens_dict: dict, replace_additional_special_tokens: bool = True,
                           replace_extra_special_tokens: bool | None = None) -> int:
        """As transformers' add_special_tokens: named tokens (cls_token, pad_token, ...) are set (a str
        becomes a special token, never split nor normalized), additional_special_tokens (or
        extra_special_tokens) replace the list, or extend it with replace_additional_special_tokens=False;
        every one missing is added as add_tokens(..., special_tokens=True) adds it. Returns how many
        tokens were added to the vocabulary."""
        if not special_tokens_dict:
            return 0
        replace = replace_additional_special_tokens if replace_extra_special_tokens is None \
            else replace_extra_special_tokens
        special_tokens_dict = dict(special_tokens_dict)
        if "additional_special_tokens" in special_tokens_dict and not special_tokens_dict.get("extra_special_tokens"):
            special_tokens_dict["extra_special_tokens"] = special_tokens_dict.pop("additional_special_tokens")
        allowed = set(SPECIAL_ATTRS) | {"extra_special_tokens"}
        for key, value in special_tokens_dict.items():  # every value checked before anything changes
            if key not in allowed:
                raise ValueError(f"Key {key} is not a valid special token. Valid keys are: {sorted(allowed)}")
            values = value if key == "extra_special_tokens" else [value]
            if (key == "extra_special_tokens" and not isinstance(value, (list, tuple))) or \
                    not all(isinstance(t, str) or isinstance(getattr(t, "content", None), str) for t in values):
                raise ValueError(f"Token {value!r} for key {key} should be "
                                 f"{'a list of' if key == 'extra_special_tokens' else 'a'} str or AddedToken")
        if {"cls_token", "sep_token"} & set(special_tokens_dict):  # the template keeps its tokens, as in HF
            self._post_processor = template.as_post_processor(*self._templates, self._core.id_to_token)
        to_add = []
        for key, value in special_tokens_dict.items():
            if key == "extra_special_tokens":
                new = [t for t in value if replace or _token_str(t) not in self.additional_special_tokens]
                if replace and new:
                    self.additional_special_tokens = [_token_str(t) for t in new]
                else:
                    self.additional_special_tokens += [_token_str(t) for t in new]
                to_add += new
            else:
                self._special[key] = value if isinstance(value, str) else value.content
                to_add.append(value)
        added = self.add_tokens([_AddedSpecial(t) if isinstance(t, str) else t for t in to_add], special_tokens=True)
        if not added:  # nothing new in the vocabulary; the template and the special sets may still change
            self._rebuild([])
        return added

    def get_added_vocab(self) -> dict[str, int]:
        """The added tokens (the special ones included) and their ids, by id, as transformers'."""
        return dict(sorted(self.added_tokens_encoder.items(), key=lambda kv: kv[1]))

    @property
    def added_tokens_decoder(self) -> dict:
        """id -> tokenizers.AddedToken for every added token, by id, as transformers'."""
        from tokenizers import AddedToken

        out = {}
        for a in self._added:
            special = bool(a.get("special", False))
            out[self._core.token_to_id(a["content"])] = AddedToken(
                a["content"], single_word=bool(a.get("single_word", False)), lstrip=bool(a.get("lstrip", False)),
                rstrip=bool(a.get("rstrip", False)), normalized=bool(a.get("normalized", not special)),
                special=special)
        return dict(sorted(out.items()))

    @property
    def max_len_single_sentence(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=False)

    @property
    def max_len_sentences_pair(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=True)

    def __repr__(self) -> str:
        return (f"fastbert.BertTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"model_max_length={self.model_max_length}, do_lower_case={self.do_lower_case}, "
                f"num_threads={self.num_threads})")

    # ---------------------------------------------------------------------------- conversions
    def convert_tokens_to_ids(self, tokens):
        if tokens is None:
            return None
        if isinstance(tokens, str):
            try:
                i = self._core.token_to_id(tokens)
            except TypeError:  # pybind11 could not make UTF-8 of it: say which character
                tokens.encode("utf-8")
                raise
            return self._core.token_to_id(self.unk_token) if i is None else i
        if not isinstance(tokens, Iterable):
            raise TypeError(f"tokens must be a str or a list of str, got {_kind(tokens)}")
        tokens = list(tokens)
        for k, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"token {k} is {type(t).__name__}, not str")
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):  # also a numpy or 0-d torch scalar
            return self._id_to_token(_token_id(ids, 0))
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        ids = [i if type(i) is int and i >= 0 else _token_id(i, k) for k, i in enumerate(ids)]
        return [self._id_to_token(i) for i in ids if i not in skip]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        for k, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"token {k} is {type(t).__name__}, not str")
        return self._decode_tokens(tokens)

    @staticmethod
    def _decode_tokens(tokens) -> str:
        # HF's WordPiece decoder: "##" pieces glue to the previous token, others get a space;
        # its cleanup runs on each piece
        parts = []
        for i, t in enumerate(tokens):
            if i:
                t = t[2:] if t.startswith("##") else " " + t
            parts.append(_decoder_cleanup(t))
        return "".join(parts)

    def decode(self, token_ids, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None, **kwargs) -> str:
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if isinstance(token_ids, (list, tuple)):
            if token_ids and isinstance(token_ids[0], (list, tuple)):
                # a batch of sequences: transformers' decode gives one string per sequence
                return self.batch_decode(token_ids, skip_special_tokens, clean_up_tokenization_spaces)
        elif isinstance(token_ids, str) or not isinstance(token_ids, Iterable):
            raise TypeError(f"token_ids must be an int or a sequence of ints, got {_kind(token_ids)}")
        skip = {self._core.token_to_id(t) for t in self._special_contents} if skip_special_tokens else set()
        tokens = []
        for k, i in enumerate(token_ids):
            if type(i) is not int or i < 0:  # the checks and messages, off the common path
                i = _token_id(i, k)
            if i in skip:
                continue
            t = self._id_to_token(i)
            if t is not None:
                tokens.append(t)
        text = self._decode_tokens(tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return _cleanup(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None, **kwargs) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        if isinstance(sequences, (list, tuple)) and sequences and isinstance(sequences[0], (int, np.integer)):
            # one flat sequence: transformers decodes it as a single sequence (with a deprecation warning)
            return [self.decode(sequences, skip_special_tokens, clean_up_tokenization_spaces)]
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    # -------------------------------------------------------------------------------- encoding
    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs) -> list[str]:
        kwargs.pop("return_offsets_mapping", None)
        for name in _TOKENIZE_IGNORES:  # transformers' tokenize() returns every token whatever these say
            kwargs.pop(name, None)
        enc = self(text, pair, add_special_tokens=add_special_tokens, return_offsets_mapping=True, **kwargs)
        if pair is not None:  # an added token's text may come from either sequence: the alignment knows which
            return enc.tokens()
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        if ids and isinstance(ids[0], list):
            ids, offsets = ids[0], offsets[0]
        added = self._aligner.added_by_id()
        out = []
        for k, i in enumerate(ids):
            a = added.get(i)
            if a is None:
                out.append(self._core.id_to_token(i))
                continue
            out.append(self._aligner.added_token_string(a, i, text[offsets[k][0]:offsets[k][1]]))
        return out

    def _id_to_token(self, i: int):
        # HF gives a normalized added token back in its normalized form (the core's normalizer)
        t = self._core.id_to_token(i) if i <= MAX_SIZE else None  # beyond the vocabulary, as HF
        if t is not None and self._normalized_ids and i in self._normalized_ids:
            return self._core.normalize(t)
        return t

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, padding=False, truncation=None,
               max_length: int | None = None, stride: int = 0, padding_side: str | None = None,
               return_tensors=None, **kwargs):
        if (type(text) is str and text_pair is None and padding is False and truncation is None
                and max_length is None and stride == 0 and padding_side is None and return_tensors is None
                and not kwargs):
            out, _ = self._hot.encode(text, add_special_tokens, False, False, True)
            return out["input_ids"][0]
        enc = self(text, text_pair, add_special_tokens=add_special_tokens, padding=padding,
                   truncation=truncation, max_length=max_length, stride=stride, padding_side=padding_side,
                   return_tensors=return_tensors, **kwargs)
        return enc["input_ids"]

    def __call__(self, text=None, text_pair=None, text_target=None, text_pair_target=None,
                 add_special_tokens: bool = True, padding=False, truncation=None, max_length: int | None = None,
                 stride: int = 0, is_split_into_words: bool = False, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, return_tensors=None, return_token_type_ids=None,
                 return_attention_mask=None, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, return_offsets_mapping: bool = False,
                 return_length: bool = False, verbose: bool = True, packed: bool = False,
                 split_special_tokens: bool | None = None, **kwargs) -> BatchEncoding:
        """transformers' BertTokenizerFast.__call__ (same arguments, same outputs), plus `packed=True`:
        every sequence's real tokens back to back (input_ids, token_type_ids, position_ids, 1-D),
        `cu_seqlens` (int32, batch + 1: where each sequence starts) and `max_seqlen` (an int), for
        varlen attention; no padding, no attention_mask. split_special_tokens (None: the tokenizer's
        own setting): special tokens written in the text are tokenized as text, as in transformers."""
        if (type(text) is str and text_pair is None and padding is False and truncation is None
                and max_length is None and stride == 0 and not is_split_into_words and pad_to_multiple_of is None
                and padding_side is None and return_tensors is None and not kwargs and not packed
                and text_target is None and text_pair_target is None and split_special_tokens is None
                and not (return_overflowing_tokens or return_special_tokens_mask or return_offsets_mapping
                         or return_length)
                and (hot := self._hot).padding_side in SIDES and hot.truncation_side in SIDES):
            return hot.call(text, add_special_tokens, return_token_type_ids, return_attention_mask, verbose)
        if kwargs or text_target is not None or text_pair_target is not None:
            args = dict(locals())  # the parameters only: nothing else is assigned yet
            del args["self"], args["kwargs"]
            return self._call_with_extras(args, kwargs)
        if text is None:
            raise ValueError("You need to specify either `text` or `text_target`.")
        max_length, stride = count("max_length", max_length), count("stride", stride) or 0
        pad_to_multiple_of = count("pad_to_multiple_of", pad_to_multiple_of)
        if packed and enum_value(padding) not in (False, None, "do_not_pad"):
            raise ValueError(f"packed=True puts the sequences back to back without padding; it cannot be combined "
                             f"with padding={padding!r} (leave padding unset)")
        if packed and return_attention_mask:
            raise ValueError("packed=True returns no attention_mask (nothing is padded; cu_seqlens says where each "
                             "sequence starts): leave return_attention_mask unset")
        pad, trunc, max_length = resolve_strategies(padding, truncation, max_length, pad_to_multiple_of,
                                                    self.model_max_length,
                                                    self.pad_token is not None and self.pad_token_id is not None)
        batched, texts, pairs = _batch_items(text, text_pair, is_split_into_words)
        side = padding_side if padding_side is not None else self.padding_side
        if side not in SIDES:
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        if self.truncation_side not in SIDES:
            raise ValueError(f"truncation_side must be 'left' or 'right', got {self.truncation_side!r}")
        kind = enum_value(return_tensors)
        if kind not in (None, "np", "pt"):
            raise ValueError(f"return_tensors must be None, 'np' or 'pt', got {kind!r}")
        if trunc != "do_not_truncate":
            # tokenizers' own check, made with the single-sequence special count whatever the input;
            # a max_length below that count wraps around in Rust and means "no truncation"
            effective = max_length - self.num_special_tokens_to_add(False)
            if effective >= 0 and stride > effective:
                raise ValueError(f"tokenizer stride set to {stride}, which is greater than or equal to its "
                                 f"effective max length of {effective} (= {max_length} original max length - "
                                 f"{self.num_special_tokens_to_add(False)} added special tokens), ")
        want_types, want_attn = _wanted_outputs(self.model_input_names, return_token_type_ids, return_attention_mask)
        split = self._split_special_tokens if split_special_tokens is None else _split_flag(split_special_tokens)
        options = self._options.get(
            split_words=bool(is_split_into_words), add_special_tokens=bool(add_special_tokens),
            split_special_tokens=split, truncation=trunc,
            max_length=max_length or 0, stride=stride, truncate_left=self.truncation_side == "left", padding=pad,
            pad_to_multiple_of=pad_to_multiple_of or 0, pad_left=side == "left", pad_id=int(self.pad_token_id or 0),
            packed=bool(packed), type_ids=want_types, attention_mask=want_attn and not packed,
            special_tokens_mask=bool(return_special_tokens_mask), offsets=bool(return_offsets_mapping),
            length=bool(return_length), overflow=bool(return_overflowing_tokens), numpy=kind is not None,
            num_threads=self._num_threads)
        try:
            out, longest = self._core.encode_batch(texts, pairs, options)
        except TypeError:
            # a pair after the first item of a batch of texts: a batch mixing texts and pairs
            if not (batched and pairs is None and any(_is_pair(t, is_split_into_words) for t in texts)):
                raise
            texts, pairs = _unzip_pairs(texts, is_split_into_words)
            out, longest = self._core.encode_batch(texts, pairs, options)
        if max_length is None and verbose:
            self._hot.warn_if_long(longest)
        enc = BatchEncoding(out)
        if packed:
            for k, v in list(enc.items()):  # 1-D arrays from C++; max_seqlen stays an int
                if k != "max_seqlen":
                    enc[k] = v.tolist() if kind is None and isinstance(v, np.ndarray) else as_tensor(k, v, kind)
        elif kind is not None:
            if "offset_mapping" in enc and not isinstance(enc["offset_mapping"], np.ndarray):
                enc["offset_mapping"] = [[list(p) for p in row] for row in enc["offset_mapping"]]
            enc.convert_to_tensors(kind)
        else:
            numpy_keys = [k for k, v in enc.items() if isinstance(v, np.ndarray)]
            for k in numpy_keys:  # padded numpy rows -> lists (only when the C++ side made arrays)
                enc[k] = enc[k].tolist()
            if not batched and not return_overflowing_tokens:
                enc = BatchEncoding({k: (v[0] if v and isinstance(v[0], list) else v) for k, v in enc.items()})
        if texts:
            # alignment (word_ids() ...) is computed on first use, from the input as it is now: the
            # caller's lists (and pre-split words) may change, the str in them cannot
            if batched or is_split_into_words:
                texts, pairs = _freeze(texts, is_split_into_words), _freeze(pairs, is_split_into_words)
            enc._source = (self._aligner, texts, pairs, options, return_overflowing_tokens)
        return enc

    def _call_with_extras(self, args: dict, kwargs: dict) -> BatchEncoding:
        """__call__ with keyword arguments beyond the named ones, or with targets. transformers'
        extras are honoured (tokenizer_kwargs, max_target_length);
        any other name is ignored with a warning (BertTokenizerFast ignores it without one)."""
        kwargs = dict(kwargs)
        extra = kwargs.pop("tokenizer_kwargs", None)
        max_target_length = kwargs.pop("max_target_length", None)
        if kwargs:
            warnings.warn(f"BertTokenizer: unknown keyword argument(s) {', '.join(sorted(kwargs))} ignored "
                          "(transformers' BertTokenizerFast ignores them too)", UserWarning, stacklevel=3)
        if extra:  # as transformers merges them: over the named arguments
            unknown = sorted(k for k in extra if k not in args and k not in _HF_EXTRA_KWARGS)
            if unknown:
                warnings.warn(f"BertTokenizer: unknown tokenizer_kwargs {', '.join(unknown)} ignored "
                              "(transformers' BertTokenizerFast ignores them too)", UserWarning, stacklevel=3)
            args.update({k: v for k, v in extra.items() if k in args})
            max_target_length = extra.get("max_target_length", max_target_length)
        text_target, text_pair_target = args.pop("text_target"), args.pop("text_pair_target")
        if text_target is None:
            if text_pair_target is not None:
                raise ValueError("text_pair_target is the pair of text_target: give text_target too")
            if max_target_length is not None:
                warnings.warn("BertTokenizer: max_target_length is ignored without text_target", UserWarning,
                              stacklevel=3)
            return self(**args)
        # transformers' targets: encoded like the inputs (a BERT tokenizer has no target mode), to
        # max_target_length when given; with text, their input_ids become "labels"
        target_args = dict(args, text=text_target, text_pair=text_pair_target)
        if max_target_length is not None:
            target_args["max_length"] = max_target_length
        targets = self(**target_args)
        if args["text"] is None:
            return targets
        encodings = self(**args)
        encodings["labels"] = targets["input_ids"]
        return encodings

    # ---------------------------------------------------------------------------------- saving
    def pad(self, encoded_inputs, padding=True, max_length: int | None = None,
            pad_to_multiple_of: int | None = None, padding_side: str | None = None,
            return_attention_mask: bool | None = None, return_tensors=None, verbose: bool = True) -> BatchEncoding:
        """Pads encodings made without padding (one dict of lists, or a list of dicts such as dataset
        rows) as transformers' tokenizer.pad does; DataCollatorWithPadding calls this."""
        return pad_module.pad(self, encoded_inputs, padding, max_length, pad_to_multiple_of, padding_side,
                   return_attention_mask, return_tensors, verbose)

    def save_vocabulary(self, save_directory, filename_prefix: str | None = None) -> tuple[str]:
        """Writes vocab.txt (the base vocabulary, without added tokens), as transformers' BertTokenizer."""
        return (files.write_vocab(save_directory, self._core.tokens()[:self._core.base_ids()], filename_prefix),)

    def save_pretrained(self, save_directory, legacy_format: bool | None = None, filename_prefix: str | None = None,
                        push_to_hub: bool = False, **kwargs) -> tuple[str, ...]:
        """Writes vocab.txt, tokenizer_config.json and special_tokens_map.json (loadable by fastbert
        and by transformers), each name after `filename_prefix` and "-" when given (as transformers).
        push_to_hub=True, legacy_format=False (tokenizer.json only) and hub arguments are refused by name."""
        if push_to_hub:
            raise ValueError("save_pretrained(push_to_hub=True) is not supported by fastbert.BertTokenizer: save to a "
                             "directory and upload it with huggingface_hub")
        if legacy_format is False:
            raise ValueError("save_pretrained(legacy_format=False) asks for tokenizer.json alone, which "
                             "fastbert.BertTokenizer does not write: it writes vocab.txt (legacy_format=None or True)")
        if kwargs:
            raise TypeError(f"save_pretrained() got unsupported argument(s) {', '.join(sorted(kwargs))} (fastbert."
                            "BertTokenizer takes save_directory, legacy_format, filename_prefix, push_to_hub)")
        if filename_prefix is not None and not isinstance(filename_prefix, str):
            raise TypeError(f"filename_prefix must be a str, got {type(filename_prefix).__name__} {filename_prefix!r}")
        config = {"do_lower_case": self.do_lower_case, "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.tokenize_chinese_chars, "model_max_length": self.model_max_length,
                  "padding_side": self.padding_side, "truncation_side": self.truncation_side,
                  "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
                  **({} if self.clean_text else {"clean_text": False}),  # fastbert's own option
                  **({"split_special_tokens": True} if self.split_special_tokens else {})}
        # vocab.txt holds no post-processor: the class name says which template to build
        single, pair = self._templates
        as_bert = template.build(None, self._core.token_to_id, self.cls_token, self.sep_token)
        as_mpnet = template.build({"type": "RobertaProcessing"}, self._core.token_to_id, self.cls_token,
                                  self.sep_token)
        if (single, pair) == as_mpnet and (single, pair) != as_bert:
            config.update(tokenizer_class="MPNetTokenizer", model_input_names=list(self.model_input_names))
        elif list(self.model_input_names) != list(type(self).model_input_names):   # DistilBERT's: no token types
            config["model_input_names"] = list(self.model_input_names)
        elif (single, pair) != as_bert:
            raise ValueError(f"save_pretrained writes vocab.txt, which cannot hold this tokenizer's post-processor "
                             f"template (single {single}, pair {pair}): keep the checkpoint's tokenizer.json")
        specials = dict(self.special_tokens_map)
        if self.additional_special_tokens:  # the key every transformers version reads
            specials["additional_special_tokens"] = list(self.additional_special_tokens)
        added = [dict(a, id=self._core.token_to_id(a["content"])) for a in self._added]
        return files.write_pretrained(save_directory, self._core.tokens()[:self._core.base_ids()], added, config,
                                      specials, filename_prefix)
