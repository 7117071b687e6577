"""fastbert.Encoder: sentence embeddings from a checkpoint, like sentence-transformers' `encode`.

The pipeline is the sentence-transformers one (Transformer -> Pooling -> optional Normalize), read
from the checkpoint's own files: modules.json, <transformer dir>/sentence_bert_config.json
(max_seq_length) and <pooling dir>/config.json. What makes it fast:
- every text is tokenized once, up front, by fastbert.AutoTokenizer (the C++ WordPiece tokenizer for
  BERT-style vocabularies);
- batches are formed after sorting by token count (not by characters), so a batch carries almost no
  padding, and the fastbert model does no work on what little padding there is;
- the encoder is fastbert.AutoModel (fused QKV, fused bias+GELU and add+LayerNorm, varlen attention).
Results come back in input order.
"""
import json
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens")
# legacy 1_Pooling/config.json flags -> pooling mode (sentence-transformers' own names)
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
from fastbert.models.registry import ROBERTA_LIKE as _ROBERTA_LIKE  # positions start after padding_idx


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _pooling_modes(config: dict, source: Path) -> tuple:
    """The pooling mode(s) named by a sentence-transformers Pooling config (new or legacy keys)."""
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
    else:
        modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key))
    if not modes:
        raise ValueError(f"{source}: no pooling mode is enabled")
    bad = [m for m in modes if m not in POOLINGS]
    if bad:
        raise ValueError(f"{source}: pooling mode {bad[0]!r} is not supported by fastbert.Encoder "
                         f"(supported: {POOLINGS})")
    return modes


def read_sentence_config(path) -> dict:
    """model_dir, pooling (tuple of modes), normalize and max_seq_length for a checkpoint directory.

    Without modules.json (a plain transformers checkpoint) this is mean pooling, no normalization,
    as sentence-transformers does for such a model."""
    path = Path(path)
    out = {"model_dir": path, "pooling": ("mean",), "normalize": False, "max_seq_length": None,
           "do_lower_case": False}
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return out
    for module in _read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = path / module.get("path", "")
        if kind == "Transformer":
            out["model_dir"] = where
            st_config = where / "sentence_bert_config.json"
            if st_config.is_file():
                cfg = _read_json(st_config)
                out["max_seq_length"] = cfg.get("max_seq_length")
                out["do_lower_case"] = bool(cfg.get("do_lower_case", False))
        elif kind == "Pooling":
            pooling_file = where / "config.json"
            if not pooling_file.is_file():
                raise OSError(f"{modules_file} names a Pooling module but {pooling_file} does not exist")
            out["pooling"] = _pooling_modes(_read_json(pooling_file), pooling_file)
        elif kind == "Normalize":
            out["normalize"] = True
        else:
            raise ValueError(f"{modules_file}: module type {module.get('type')!r} is not supported by "
                             "fastbert.Encoder (supported: Transformer, Pooling, Normalize)")
    return out


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """(batch, seq, hidden) states and (batch, seq) mask -> (batch, hidden * len(modes)), in fp32.

    Several modes are concatenated in the given order, as sentence-transformers does."""
    hidden = hidden.float()
    m = mask.unsqueeze(-1).to(hidden.dtype)                          # (batch, seq, 1)
    counts = m.sum(dim=1).clamp(min=1e-9)                             # (batch, 1)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(hidden[:, 0])
        elif mode == "max":
            parts.append(hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            parts.append((hidden * m).sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((hidden * m).sum(dim=1) / counts.sqrt())
        else:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class Encoder:
    """Sentence embeddings: `Encoder.from_pretrained(path).encode(texts)`."""

    def __init__(self, model, tokenizer, pooling=("mean",), normalize: bool = False,
                 max_seq_length: int = 512, do_lower_case: bool = False):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = (pooling,) if isinstance(pooling, str) else tuple(pooling)
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.do_lower_case = do_lower_case

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None) -> "Encoder":
        from fastbert.tokenizer.auto import AutoTokenizer, local_dir as _local_dir
        from fastbert.auto import AutoModel

        path = _local_dir(path)
        st = read_sentence_config(path)
        model_dir = st["model_dir"]
        if not (model_dir / "config.json").is_file():
            raise OSError(f"{model_dir} has no config.json: not a model checkpoint directory")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModel.from_pretrained(str(model_dir), dtype=dtype, device=device)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        max_len = st["max_seq_length"] or cls._default_max_length(model.config, tokenizer)
        return cls(model, tokenizer, st["pooling"], st["normalize"], int(max_len), st["do_lower_case"])

    @staticmethod
    def _default_max_length(config, tokenizer) -> int:
        limit = getattr(config, "max_position_embeddings", 512)
        if getattr(config, "model_type", "") in _ROBERTA_LIKE:
            pad = getattr(config, "pad_token_id", None)
            limit -= (1 if pad is None else pad) + 1
        tok_limit = getattr(tokenizer, "model_max_length", None)
        return min(limit, tok_limit) if isinstance(tok_limit, int) and tok_limit > 0 else limit

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _tokenize(self, texts: list) -> list:
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        enc = self.tokenizer(texts, padding=False, truncation=True, max_length=self.max_seq_length)
        return list(enc["input_ids"])

    def _batch_tensors(self, rows: list):
        """Pads token id rows to the longest one: (input_ids, attention_mask) on the model's device."""
        lengths = torch.tensor([len(r) for r in rows])
        width = int(lengths.max())
        mask = torch.arange(width)[None, :] < lengths[:, None]        # (batch, width)
        pad_id = getattr(self.tokenizer, "pad_token_id", None) or 0
        ids = torch.full(mask.shape, pad_id, dtype=torch.long)
        ids[mask] = torch.tensor([t for r in rows for t in r], dtype=torch.long)
        device = self.device
        return ids.to(device), mask.to(device=device, dtype=torch.long)

    def encode(self, texts: Union[str, Sequence[str]], batch_size: int = 32,
               pooling: Optional[str] = None, normalize_embeddings: Optional[bool] = None,
               show_progress_bar: bool = False, convert_to_tensor: bool = False,
               convert_to_numpy: bool = True):
        """Embeds `texts`; a str gives one vector, a list gives (len(texts), dim) in input order.

        pooling ("mean" | "cls" | "max") and normalize_embeddings default to the checkpoint's
        sentence-transformers config. convert_to_tensor returns a torch tensor (on the model's
        device), else convert_to_numpy a float32 array, else a list of 1-D tensors."""
        single = isinstance(texts, str)
        texts = [texts] if single else texts
        if not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is a {type(t).__name__}, expected str")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        modes = self.pooling if pooling is None else (pooling,)
        for mode in modes:
            if mode not in POOLINGS:
                raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")
        normalize = self.normalize if normalize_embeddings is None else bool(normalize_embeddings)

        embeddings = self._embed(list(texts), batch_size, modes, normalize, show_progress_bar)
        if convert_to_tensor:
            out = embeddings
        elif convert_to_numpy:
            out = embeddings.cpu().numpy()
        else:
            out = list(embeddings)
        return out[0] if single else out

    @torch.inference_mode()
    def _embed(self, texts, batch_size, modes, normalize, show_progress_bar) -> torch.Tensor:
        from tqdm.auto import tqdm

        dim = self.model.config.hidden_size * len(modes)
        out = torch.empty((len(texts), dim), dtype=torch.float32, device=self.device)
        if not texts:
            return out
        rows = self._tokenize(texts)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # longest first, as ST
        starts = range(0, len(order), batch_size)
        for start in tqdm(starts, desc="Batches", disable=not show_progress_bar):
            idx = order[start:start + batch_size]
            input_ids, attention_mask = self._batch_tensors([rows[i] for i in idx])
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            vectors = pool(hidden, attention_mask, modes)
            if normalize:
                vectors = F.normalize(vectors, p=2, dim=1)
            out[torch.tensor(idx, device=out.device)] = vectors
        return out
