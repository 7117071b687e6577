"""Checks of a model's inputs before anything runs: shapes, dtypes, devices, value ranges (one host
sync for all of them in the padded forward), and what forward_packed's inputs must hold. `model` is
the EncoderModel the inputs are for (its dims, embeddings and sequence limit)."""
import torch
from torch import nn

from fastbert.ops.varlen import check_cu_seqlens, check_cu_seqlens_shape, mask_stats


# A traced graph would keep one batch's packing (lengths, longest row) as constants, and be wrong on
# any other mask; torch.export stops at the data-dependent shapes. torch.compile handles both.
NOT_EXPORTABLE = (
    "fastbert's forward removes padding by the values of the attention mask, so its shapes depend on the "
    "data: torch.jit.trace and torch.onnx.export(dynamo=False) would keep one batch's layout (and give wrong "
    "outputs on other masks), and torch.export cannot capture it. To export, use transformers' model with the "
    "same weights (fastbert keeps transformers' parameter names): "
    "transformers.AutoModel.from_config(model.config) (or the head's class), then "
    ".load_state_dict(model.state_dict()); for a model changed by fastbert.optimize(), export it before "
    "optimizing. torch.compile(model) works as it is.")


def _range_checks(model, input_ids, token_type_ids, position_ids) -> list:
    """(name, tensor, low, high exclusive, what) for the value ranges of the given inputs."""
    d = model.dims
    checks = []
    if input_ids is not None:
        # the table as it is now: transformers' resize_token_embeddings on an optimized model swaps it
        table = model.get_input_embeddings()
        vocab = table.num_embeddings if isinstance(table, nn.Embedding) else d.vocab_size
        checks.append(("token id", input_ids, 0, vocab, "vocab size"))
    if token_type_ids is not None:
        checks.append(("token type id", token_type_ids, 0, d.type_vocab_size, "type_vocab_size"))
    if position_ids is not None:
        checks.append(("position id", position_ids, 0, model.max_position_id(), "max_position_embeddings"))
    return [c for c in checks if c[1].numel()]


def _raise_out_of_range(checks: list, stats: list) -> None:
    for i, (name, _, low, high, what) in enumerate(checks):
        lo, hi = stats[2 * i], stats[2 * i + 1]
        bad = lo if lo < low else hi if hi >= high else None
        if bad is not None:
            raise ValueError(f"{name} {bad} is out of range for {what} {high} (valid: {low}..{high - 1})")


def _check_integer(name: str, t: torch.Tensor, dim: int, layout: str) -> None:
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D {layout}, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")


def _check_device(model, device) -> None:
    weight = model.get_input_embeddings().weight
    if device != weight.device:
        raise ValueError(f"inputs are on {device} but {type(model).__name__} is on {weight.device}; "
                         f"move them with .to({str(weight.device)!r})")


def check_inputs(model, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds):
    """Shape and range checks -> (batch, seq, device, mask stats for unpad or None), with one host
    sync for all value ranges and the mask's lengths together (no device-side asserts)."""
    d = model.dims
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        _check_integer("input_ids", input_ids, 2, "(batch, seq)")
        shape, device = tuple(input_ids.shape), input_ids.device
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d.embedding_size:
            raise ValueError(f"inputs_embeds must be (batch, seq, {d.embedding_size}), "
                             f"got shape {tuple(inputs_embeds.shape)}")
        shape, device = tuple(inputs_embeds.shape[:2]), inputs_embeds.device
    _check_device(model, device)
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has shape {shape}")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != shape[1]
                                     or position_ids.shape[0] not in (1, shape[0])):
        raise ValueError(f"position_ids must have shape (batch, seq) = {shape} or (1, seq), "
                         f"got {tuple(position_ids.shape)}")
    limit = model.max_sequence_length()
    if shape[1] > limit and position_ids is None:
        raise ValueError(f"sequence length {shape[1]} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings={d.max_position_embeddings})")
    checks = _range_checks(model, input_ids, token_type_ids, position_ids)
    values = [s.long() for c in checks for s in (c[1].min(), c[1].max())]
    if attention_mask is not None:
        values.extend(mask_stats(attention_mask).unbind())
    if not values:
        return shape[0], shape[1], device, None
    stats = torch.stack(values).tolist()                       # the one sync
    _raise_out_of_range(checks, stats)
    return shape[0], shape[1], device, (stats[-2:] if attention_mask is not None else None)


def check_packed_shapes(model, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids):
    """forward_packed's checks that need no tensor values (shapes, dtypes, devices, host ints); its
    callers have passed token_type_ids through model.token_types."""
    _check_integer("input_ids", input_ids, 1, "(tokens,) packed ids")
    check_cu_seqlens_shape(cu_seqlens, min_length=1)   # 1: an empty batch
    if cu_seqlens.shape[0] == 1 and input_ids.shape[0]:
        raise ValueError(f"cu_seqlens of length 1 is a batch of no sequences, but input_ids has "
                         f"{input_ids.shape[0]} tokens")
    if (isinstance(max_seqlen, (bool, torch.Tensor)) or not isinstance(max_seqlen, (int, torch.SymInt))
            or max_seqlen < 0):
        raise ValueError(f"max_seqlen must be a non-negative Python int (reading a tensor would sync), "
                         f"got {max_seqlen!r}")
    _check_device(model, input_ids.device)
    if cu_seqlens.device != input_ids.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but input_ids is on {input_ids.device}")
    for name, t in (("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if t is not None:
            _check_integer(name, t, 1, "(tokens,)")
            if t.shape != input_ids.shape or t.device != input_ids.device:
                raise ValueError(f"{name} must match input_ids {tuple(input_ids.shape)} on {input_ids.device}, "
                                 f"got {tuple(t.shape)} on {t.device}")
    limit = model.max_sequence_length()
    if max_seqlen > limit and position_ids is None:
        raise ValueError(f"max_seqlen {max_seqlen} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings={model.dims.max_position_embeddings})")


def check_packed(model, input_ids, cu_seqlens, max_seqlen, token_type_ids=None,
                 position_ids=None) -> None:
    """Every check of forward_packed's inputs, values included (reads them: one sync on a device)."""
    token_type_ids = model.token_types(token_type_ids)
    check_packed_shapes(model, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
    checks = _range_checks(model, input_ids, token_type_ids, position_ids)
    if checks:
        _raise_out_of_range(checks, torch.stack([s.long() for c in checks for s in (c[1].min(), c[1].max())]).tolist())
    check_cu_seqlens(cu_seqlens, input_ids.shape[0], max_seqlen, min_length=1)
