"""What a served model is, and what it computes on one batch: the part of `fastbert serve` that
touches torch.

A checkpoint is one of four kinds, read from its own files (the choices fastbert.Encoder and the
Auto classes already make, joined to the head config.json names):
- "sparse": a sentence-transformers SparseEncoder (modules.json with a SpladePooling module) over a
  masked-LM model -> /embed_sparse;
- "reranker": a sequence-classification model with one label (a CrossEncoder) -> /rerank, /predict;
- "classifier": a sequence-classification model with several labels -> /predict;
- "embedding": everything else fastbert.Encoder loads (sentence-transformers embedding models and
  bare encoders) -> /v1/embeddings, /embed.
Every kind serves /tokenize.

A runner tokenizes (on the caller's thread: the server calls it from its tokenizer threads; the C++
tokenizer releases the GIL) into `Seq` rows, and runs a list of rows as one batch (on the server's
model thread): the embedding runner on fastbert.Encoder's packed path (real tokens only), the others
on the fastbert model's padded forward over length-sorted rows (little padding, none computed).
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np

KINDS = ("embedding", "sparse", "reranker", "classifier")
ROUTES = {
    "embedding": ("/v1/embeddings", "/embed"),
    "sparse": ("/embed_sparse",),
    "reranker": ("/rerank", "/predict"),
    "classifier": ("/predict",),
}
DIRECTIONS = ("right", "left")
SPARSE_CHUNK_TOKENS = 2048   # MLM logits are tokens x vocab floats: 2,048 x 30,522 x 4 B = 250 MB at most


class Seq(NamedTuple):
    """One tokenized input: ids (specials included), token types or None, and how many leading
    tokens (an excluded prompt) pooling leaves out."""
    ids: list
    types: Optional[list] = None
    skip: int = 0


class TooLong(ValueError):
    """An input over the model's limit that the request did not ask to truncate."""

    def __init__(self, index: int, length: int, limit: int):
        super().__init__(f"input {index} has {length} tokens, more than the model's limit of {limit}; "
                         "send shorter input or ask for truncation")
        self.index, self.length, self.limit = index, length, limit


def model_kind(path: Path) -> str:
    """"embedding" | "sparse" | "reranker" | "classifier" for a checkpoint directory."""
    from fastbert.encoder import _read_json
    from fastbert.models.config import read_config_dict

    path = Path(path)
    model_dir = path
    modules_file = path / "modules.json"
    if modules_file.is_file():
        modules = _read_json(modules_file, list)
        types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        if "SpladePooling" in types:
            return "sparse"
        model_dir = next((path / m.get("path", "") for m, t in zip(modules, types)
                          if t in ("Transformer", "MLMTransformer")), path)
    config = read_config_dict(str(model_dir / "config.json"))
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or ()):
        return "reranker" if _num_labels(config) == 1 else "classifier"
    return "embedding"


def _num_labels(config: dict) -> int:
    labels = config.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else int(config.get("num_labels", 2))


def load(path, device: Optional[str] = None, dtype=None, quantize: Optional[str] = None):
    """The runner for a checkpoint directory (or hub id), by its kind."""
    import torch

    from fastbert.tokenizer.auto import local_dir

    path = local_dir(path)
    kind = model_kind(path)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if kind == "embedding":
        from fastbert.encoder import Encoder
        return EmbeddingRunner(Encoder.from_pretrained(path, device=device, dtype=dtype, quantize=quantize), path)
    if kind == "sparse":
        return SparseRunner.from_pretrained(path, device, dtype, quantize)
    return ScoreRunner.from_pretrained(path, kind, device, dtype, quantize)


def _load_head(auto_class, model_dir: Path, device, dtype, quantize):
    """A fastbert head model on its device, quantized as Encoder.from_pretrained does."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() and quantize is None else "cpu"
    if quantize is not None:
        from fastbert import quantize as quantize_model
        model = auto_class.from_pretrained(str(model_dir), dtype=torch.float32, device=device)
        quantize_model(model, quantize)
    else:
        model = auto_class.from_pretrained(str(model_dir), dtype=dtype, device=device)
    return model.eval()


class Runner:
    """Shared by every kind: the tokenizer, the length limit, tokenization with the limit checked."""
    kind = "embedding"
    padded = True          # True: a batch costs rows x longest row (padded forward); False: sum of rows

    def __init__(self, model, tokenizer, limit: int, path: Path, do_lower_case: bool = False):
        from fastbert.tokenizer.bert import BertTokenizer

        self.model, self.tokenizer, self.limit, self.path = model, tokenizer, int(limit), Path(path)
        self.do_lower_case = do_lower_case
        self._left = None     # a tokenizer that truncates on the left, made on first use
        # fastbert's tokenizer takes calls from many threads at once; transformers' fast tokenizers
        # set their truncation on the shared Rust object per call ("Already borrowed"): one at a time
        self.lock_free = isinstance(tokenizer, BertTokenizer)
        self._lock = contextlib.nullcontext() if self.lock_free else threading.Lock()

    @property
    def routes(self) -> tuple:
        return ROUTES[self.kind] + ("/tokenize",)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype

    def _tokenizer_for(self, direction: str):
        if direction == "right":
            return self.tokenizer
        if self._left is None:    # a race makes two, harmlessly: truncation_side is per object
            from fastbert.tokenizer.auto import AutoTokenizer
            self._left = AutoTokenizer.from_pretrained(str(self.tokenizer.name_or_path), truncation_side="left")
        return self._left

    def tokenize(self, texts: Sequence[str], pairs: Optional[Sequence[str]] = None, truncate: bool = False,
                 direction: str = "right", skip: int = 0) -> list:
        """[Seq] for texts (or text pairs), specials included. An input over `limit` tokens raises
        TooLong unless truncate, then it is cut on `direction`'s side as the tokenizer cuts it."""
        with self._lock:
            return self._tokenize(texts, pairs, truncate, direction, skip)

    def _tokenize(self, texts, pairs, truncate, direction, skip) -> list:
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        args = (list(texts),) if pairs is None else (list(texts), list(pairs))
        # one token over the limit is enough to know an input is too long
        enc = self.tokenizer(*args, padding=False, truncation=True, max_length=self.limit + 1)
        ids = list(enc["input_ids"])
        types = list(enc["token_type_ids"]) if pairs is not None and "token_type_ids" in enc else None
        over = [i for i, row in enumerate(ids) if len(row) > self.limit]
        if over and not truncate:
            first = over[0]
            one = (args[0][first],) if pairs is None else (args[0][first], args[1][first])
            length = len(self.tokenizer(*one, padding=False, truncation=False)["input_ids"])
            raise TooLong(first, length, self.limit)
        if over:
            cut = self._tokenizer_for(direction)(*[[a[i] for i in over] for a in args], padding=False,
                                                 truncation=True, max_length=self.limit)
            for k, i in enumerate(over):
                ids[i] = cut["input_ids"][k]
                if types is not None:
                    types[i] = cut["token_type_ids"][k]
        return [Seq(list(r), None if types is None else list(types[i]), skip) for i, r in enumerate(ids)]

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list:
        """/tokenize: per text, [{id, text, special, start, stop}] (character offsets; a special
        token's text is the token itself, with no offsets)."""
        with self._lock:
            enc = self.tokenizer(list(texts), padding=False, truncation=False, add_special_tokens=add_special_tokens,
                                 return_offsets_mapping=True, return_special_tokens_mask=True)
            pieces = [self.tokenizer.convert_ids_to_tokens(ids) for ids in enc["input_ids"]]
        out = []
        for text, ids, names, offsets, special in zip(texts, enc["input_ids"], pieces, enc["offset_mapping"],
                                                      enc["special_tokens_mask"]):
            out.append([{"id": int(i), "text": name if s else text[a:b], "special": bool(s),
                         "start": None if s else int(a), "stop": None if s else int(b)}
                        for i, name, (a, b), s in zip(ids, names, offsets, special)])
        return out

    def check_ids(self, rows: Sequence[Sequence[int]]) -> list:
        """[Seq] for token id rows given by a client: ids inside the vocabulary, within the limit."""
        vocab = self.model.config.vocab_size
        out = []
        for i, row in enumerate(rows):
            if len(row) > self.limit:
                raise TooLong(i, len(row), self.limit)
            bad = next((j for j, t in enumerate(row) if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"input[{i}][{bad}] = {row[bad]} is not a token id of this model (0..{vocab - 1})")
            out.append(Seq(list(row)))
        return out

    def info(self) -> dict:
        return {"model_type": self.kind, "max_input_length": self.limit,
                "model_dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device)}

    def _padded(self, seqs: Sequence[Seq]):
        """input_ids, attention_mask, token_type_ids (or None) padded to the longest row, on the device."""
        import torch

        width = max(len(s.ids) for s in seqs)
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        types = torch.zeros((len(seqs), width), dtype=torch.long) if seqs[0].types is not None else None
        for i, s in enumerate(seqs):
            ids[i, :len(s.ids)] = torch.tensor(s.ids)
            mask[i, :len(s.ids)] = 1
            if types is not None:
                types[i, :len(s.ids)] = torch.tensor(s.types)
        device = self.device
        return ids.to(device), mask.to(device), None if types is None else types.to(device)


class EmbeddingRunner(Runner):
    """Pooled sentence embeddings from fastbert.Encoder (its pooling, packed forward, prompts)."""
    kind = "embedding"
    padded = False

    def __init__(self, encoder, path: Path):
        super().__init__(encoder.model, encoder.tokenizer, encoder.max_seq_length, path, encoder.do_lower_case)
        self.encoder = encoder
        self.dim = encoder.model.config.hidden_size * len(encoder.pooling)
        self.packed = hasattr(encoder.model, "forward_packed")

    def prompt(self, prompt_name: Optional[str]) -> tuple:
        """(prompt text, tokens pooling skips) by sentence-transformers' rule (Encoder's own)."""
        text = self.encoder._resolve_prompt(None, prompt_name) or ""
        skip = 0 if self.encoder.include_prompt or not text else self.encoder._prompt_length(text)
        return text, skip

    def info(self) -> dict:
        return {**super().info(), "pooling": list(self.encoder.pooling), "dimensions": self.dim,
                "normalize": self.encoder.normalize, "prompts": sorted(self.encoder.prompts)}

    def run(self, seqs: Sequence[Seq]) -> np.ndarray:
        """(len(seqs), dim) float32 pooled vectors, before any normalization."""
        import torch

        from fastbert.encoder import pool, pool_packed

        enc = self.encoder
        rows = [s.ids for s in seqs]
        tokens = sum(map(len, rows)) if self.packed else len(rows) * max(map(len, rows))
        # a small batch (one short text) on one intra-op thread, as Encoder.encode runs it
        with torch.inference_mode(), enc._threads_for(tokens):
            if self.packed:
                hidden = enc._forward_packed(*enc._host_batch(rows, packed=True))      # (tokens, hidden)
                lengths = [len(r) for r in rows]
                skips = {s.skip for s in seqs}
                if len(skips) == 1:
                    vectors = pool_packed(hidden, lengths, enc.pooling, skips.pop())
                else:   # prompts of different lengths left out: pool each group of rows alike
                    starts = np.concatenate([[0], np.cumsum(lengths)])
                    vectors = torch.empty((len(rows), self.dim), dtype=torch.float32, device=hidden.device)
                    for skip in skips:
                        idx = [i for i, s in enumerate(seqs) if s.skip == skip]
                        part = torch.cat([hidden[starts[i]:starts[i + 1]] for i in idx])
                        vectors[idx] = pool_packed(part, [lengths[i] for i in idx], enc.pooling, skip)
            else:
                ids, mask, _ = self._padded(seqs)
                hidden = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state
                keep = mask.clone()
                for i, s in enumerate(seqs):
                    keep[i, :s.skip] = 0
                vectors = pool(hidden, keep, enc.pooling)
        return vectors.float().cpu().numpy()


class ScoreRunner(Runner):
    """Logits of a sequence-classification model (a CrossEncoder or a classifier), per text or pair."""

    def __init__(self, model, tokenizer, limit: int, path: Path, kind: str, activation: str):
        super().__init__(model, tokenizer, limit, path)
        self.kind, self.activation = kind, activation
        labels = getattr(model.config, "id2label", None) or {}
        self.labels = [str(labels.get(i, labels.get(str(i), f"LABEL_{i}"))) for i in range(model.config.num_labels)]

    @classmethod
    def from_pretrained(cls, path: Path, kind: str, device, dtype, quantize):
        from fastbert.auto import AutoModelForSequenceClassification
        from fastbert.encoder import Encoder, _read_json
        from fastbert.tokenizer.auto import AutoTokenizer

        model = _load_head(AutoModelForSequenceClassification, path, device, dtype, quantize)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        # sentence-transformers' CrossEncoder: its activation_fn from config.json, else sigmoid for one label
        st = _read_json(path / "config.json").get("sentence_transformers") or {}
        name = str(st.get("activation_fn") or ("Sigmoid" if kind == "reranker" else "Identity")).rsplit(".", 1)[-1]
        return cls(model, tokenizer, Encoder._default_max_length(model.config, tokenizer), path, kind,
                   "sigmoid" if name == "Sigmoid" else "identity")

    def info(self) -> dict:
        return {**super().info(), "labels": self.labels, "activation": self.activation}

    def run(self, seqs: Sequence[Seq]) -> np.ndarray:
        """(len(seqs), num_labels) float32 raw logits."""
        import torch

        ids, mask, types = self._padded(seqs)
        extra = {} if types is None else {"token_type_ids": types}
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, **extra).logits
        return logits.float().cpu().numpy()

    def scores(self, logits: np.ndarray, raw: bool) -> np.ndarray:
        """Rerank scores: the CrossEncoder's activation unless raw."""
        return logits if raw or self.activation == "identity" else 1 / (1 + np.exp(-logits))

    def probabilities(self, logits: np.ndarray, raw: bool) -> np.ndarray:
        """/predict scores: sigmoid for one label, softmax over several, unless raw."""
        if raw:
            return logits
        if logits.shape[-1] == 1:
            return 1 / (1 + np.exp(-logits))
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


class SparseRunner(Runner):
    """SPLADE: log(1 + relu(MLM logits)) (twice for "log1p_relu"), max or sum over a text's tokens."""
    kind = "sparse"

    def __init__(self, model, tokenizer, limit: int, path: Path, strategy: str, activation: str,
                 do_lower_case: bool = False):
        super().__init__(model, tokenizer, limit, path, do_lower_case)
        self.strategy, self.activation = strategy, activation

    @classmethod
    def from_pretrained(cls, path: Path, device, dtype, quantize):
        from fastbert.auto import AutoModelForMaskedLM
        from fastbert.encoder import Encoder, _read_json
        from fastbert.tokenizer.auto import AutoTokenizer

        model_dir, strategy, activation, max_len, lower = path, "max", "relu", None, False
        for module in _read_json(path / "modules.json", list):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            where = path / module.get("path", "")
            if kind in ("MLMTransformer", "Transformer"):
                model_dir = where
                if (where / "sentence_bert_config.json").is_file():
                    cfg = _read_json(where / "sentence_bert_config.json")
                    max_len, lower = cfg.get("max_seq_length"), bool(cfg.get("do_lower_case", False))
            elif kind == "SpladePooling" and (where / "config.json").is_file():
                cfg = _read_json(where / "config.json")
                strategy = cfg.get("pooling_strategy", "max")
                activation = cfg.get("activation_function", "relu")
        if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
            raise ValueError(f"{path}: SpladePooling pooling_strategy={strategy!r}, activation_function="
                             f"{activation!r} is not supported (max|sum, relu|log1p_relu)")
        model = _load_head(AutoModelForMaskedLM, model_dir, device, dtype, quantize)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        limit = max_len or Encoder._default_max_length(model.config, tokenizer)
        return cls(model, tokenizer, limit, path, strategy, activation, lower)

    def run(self, seqs: Sequence[Seq]) -> list:
        """One (indices, values) pair of arrays per input: its non-zero vocabulary weights."""
        import torch

        out = []
        longest = max(len(s.ids) for s in seqs)
        step = max(1, SPARSE_CHUNK_TOKENS // longest)
        with torch.inference_mode():
            for start in range(0, len(seqs), step):
                ids, mask, _ = self._padded(seqs[start:start + step])
                logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
                weights = torch.log1p(torch.relu(logits * mask.unsqueeze(-1)))
                if self.activation == "log1p_relu":
                    weights = torch.log1p(weights)
                pooled = weights.amax(dim=1) if self.strategy == "max" else weights.sum(dim=1)
                for row in pooled.cpu().numpy():
                    nonzero = np.flatnonzero(row)
                    out.append((nonzero, row[nonzero]))
        return out


def cost(lengths: Sequence[int], padded: bool) -> int:
    """Tokens a batch of rows costs: all of them packed, rows x the longest padded."""
    return len(lengths) * max(lengths, default=0) if padded else sum(lengths)

