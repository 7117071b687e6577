"""transformers' resize_token_embeddings for fastbert models: the embeddings, a tied decoder and the
head's other vocabulary-sized parameters."""
from typing import Optional

import torch
from torch import nn


class Resizing:
    """FastPreTrainedModel's vocabulary resizing (a mixin)."""

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """transformers' resize after adding tokens: the input embeddings get `new_num_tokens` rows (rounded
        up to `pad_to_multiple_of`), the old rows kept; new rows drawn around the old rows' mean and
        covariance (mean_resizing, transformers' default) or initialised as fresh weights. A tied decoder
        follows the embeddings; the head's other vocabulary-sized parameters (decoder biases) are resized
        alike, new entries at the old ones' mean (or zero). config.vocab_size is updated."""
        old = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return old
        n = old.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int)
                                               or isinstance(pad_to_multiple_of, bool)):
            raise ValueError(f"Asking to pad the embedding matrix to a multiple of `{pad_to_multiple_of}`, which is "
                             "not and integer. Please make sure to pass an integer")   # transformers' words
        if pad_to_multiple_of:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        if n < 1:
            raise ValueError(f"new_num_tokens must be at least 1, got {n}")
        old_n = old.num_embeddings
        new = nn.Embedding(n, old.embedding_dim, padding_idx=old.padding_idx if (old.padding_idx or 0) < n else None,
                           device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight[:min(n, old_n)] = old.weight[:min(n, old_n)]
            if n > old_n:
                new.weight[old_n:] = added_rows(old.weight, n - old_n, mean_resizing, self.config)
        new.weight.requires_grad_(old.weight.requires_grad)
        new._is_hf_initialized = True   # a later post_init() must keep these rows
        self.set_input_embeddings(new)
        tied = set(self.tied_weights()) if getattr(self.config, "tie_word_embeddings", True) else set()
        base = self.base_model_prefix + "."
        heads = [] if self.base_model is self else [(k, p) for k, p in self.named_parameters(remove_duplicate=False)
                                                     if not k.startswith(base) and k not in tied]
        for key, p in heads:
            if p.dim() >= 1 and p.shape[0] == old_n:   # a vocabulary-sized head parameter (decoder, its bias)
                with torch.no_grad():
                    grown = torch.empty((n, *p.shape[1:]), dtype=p.dtype, device=p.device)
                    grown[:min(n, old_n)] = p[:min(n, old_n)]
                    if n > old_n:
                        grown[old_n:] = (added_rows(p, n - old_n, mean_resizing, self.config) if p.dim() == 2
                                         else (p.mean() if mean_resizing else 0.0))
                owner, name = self._owner(key)
                setattr(owner, name, nn.Parameter(grown, requires_grad=p.requires_grad))
        for m in self.modules():  # keep nn.Linear's out_features true to its weight
            if isinstance(m, nn.Linear) and m.out_features != m.weight.shape[0]:
                m.out_features = m.weight.shape[0]
        self.config.vocab_size = n
        self.vocab_size = n   # transformers sets both
        self.tie_weights()
        return self.get_input_embeddings()


def added_rows(old: torch.Tensor, k: int, mean_resizing: bool, config) -> torch.Tensor:
    """k new rows for a vocabulary-sized matrix, as transformers makes them: around the old rows' mean
    with a tiny multiple of their covariance (mean_resizing; the mean itself when the covariance is not
    positive definite), else normal(0, initializer_range)."""
    if not mean_resizing:
        std = getattr(config, "initializer_range", 0.02)
        return torch.randn(k, old.shape[1], dtype=old.dtype, device=old.device) * std
    x = old.detach().float()
    mean = x.mean(0)
    centered = x - mean
    cov = centered.T @ centered / x.shape[0]
    if bool((torch.linalg.eigvalsh(cov) > 0).all()):
        dist = torch.distributions.MultivariateNormal(mean, covariance_matrix=1e-9 * cov)
        rows = dist.sample((k,))
    else:
        rows = mean.expand(k, -1)
    return rows.to(old.dtype)
