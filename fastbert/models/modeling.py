"""What every fastbert model shares: the base class (construction from a transformers config, op
backend, weights, initialisation) and the bare encoder's forward over packed tokens. Loading and
saving live in loading.py, transformers' from_pretrained arguments in hf_arguments.py, vocabulary
resizing in resizing.py, checkpointing switches in gradient_checkpointing.py, input checks in
inputs.py.

Sharing parameters with a transformers model (what fastbert.optimize builds on):

    fast = fastbert.BertModel.from_hf_config(hf_model.config)
    fast.load_state_dict(hf_model.state_dict(), strict=True)      # same keys, both ways

or, to share the very same tensors instead of copying them, `fast.load_state_dict(sd, strict=True,
assign=True)` (torch >= 2.1), or `fast.share_parameters_with(hf_model)`.
"""
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from fastbert.models.config import check_supported, config_from_dict, resolve
from fastbert.models.gradient_checkpointing import GradientCheckpointing
from fastbert.models.inputs import NOT_EXPORTABLE, check_inputs, check_packed, check_packed_shapes
from fastbert.models.layers import EncoderLayer, FastLayer, PackedWeights, lean_plans, run_lean
from fastbert.models.short_forward import ShortPath
from fastbert.models.loading import CheckpointIO
from fastbert.models.outputs import BaseModelOutput, BaseModelOutputWithPooling
from fastbert.models.registry import family
from fastbert.models.resizing import Resizing
from fastbert.ops._dispatch import BACKENDS
from fastbert.ops.linear import STACK_MAX_TOKENS
from fastbert.ops.varlen import Packing, pack, packed_positions, repad, token_positions, unpad


def _selected(hidden_states: Optional[list], which) -> Optional[tuple]:
    """transformers' output_hidden_states: True (all) or a list of indices (negative from the end),
    the others None in a tuple of the full length."""
    if hidden_states is None:
        return None
    if isinstance(which, bool):
        return tuple(hidden_states)
    n = len(hidden_states)
    kept = {i % n for i in which}
    return tuple(h if i in kept else None for i, h in enumerate(hidden_states))


# transformers' attention implementation names: fastbert runs its fused attention for all of them but
# "eager", which takes the unfused path (probabilities materialised, as output_attentions=True does)
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


def attn_implementation(config, where: str) -> str:
    """The config's attention implementation, checked; "sdpa" (fused) when unset."""
    name = getattr(config, "_attn_implementation", None) or "sdpa"
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"{where}: attn_implementation={name!r} is not one fastbert runs; use one of "
                         f"{ATTN_IMPLEMENTATIONS} (all but 'eager' run fastbert's fused attention)")
    return name


class FastPreTrainedModel(CheckpointIO, Resizing, GradientCheckpointing, PreTrainedModel):
    """Base of every fastbert model (bare encoders and heads).

    A transformers PreTrainedModel to the code that asks (`isinstance`), so that transformers.Trainer
    saves its checkpoints with this class's save_pretrained (a folder both libraries load) instead of a
    bare state dict. Built as a plain nn.Module: PreTrainedModel.__init__ would pick an attention
    implementation and a loss for transformers' own modules, and fastbert runs neither. Everything
    fastbert defines here and in the mixins (from_pretrained, save_pretrained, device, dtype, tie_weights,
    ...) is its own."""

    base_model_prefix = "bert"
    model_types: Tuple[str, ...] = ("bert",)
    # what transformers.Trainer and friends read from a model
    main_input_name = "input_ids"
    input_modalities = "text"  # transformers pipelines' repr reads it
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_save = None
    # transformers' class flags that code reads: no module must stay in float32, and every attention
    # implementation name is accepted (see ATTN_IMPLEMENTATIONS) and may be switched at run time
    _keep_in_fp32_modules = frozenset()
    _keep_in_fp32_modules_strict = frozenset()
    _supports_sdpa = True
    # transformers zeroes the padding row of the embedding tables it initialises; a family whose
    # transformers init then draws the whole table again sets this False
    init_zeroes_padding_row = True
    _can_set_attn_implementation_cached_value = True
    # the per-layer outputs the forward returns (transformers reads the keys; fastbert collects them itself,
    # output_hidden_states taking a list of layer indices too)
    _can_record_outputs = {"hidden_states": GradientCheckpointingLayer, "attentions": GradientCheckpointingLayer}

    def __init__(self, config):
        nn.Module.__init__(self)
        if isinstance(config, dict):
            config = config_from_dict(config)
        check_supported(config, type(self).__name__)
        if config.model_type not in self.model_types:
            raise ValueError(f"{type(self).__name__} needs a config with model_type in {self.model_types}, "
                             f"got {config.model_type!r}")
        self.config = config
        self.name_or_path = getattr(config, "name_or_path", "")   # transformers': where it was loaded from
        self.dims = resolve(config)
        attn_implementation(config, type(self).__name__)   # checked, not written: the config may be transformers' too
        self.gradient_checkpointing = False
        self._checkpoint_options = ({"use_reentrant": False}, 1, False)  # (checkpoint kwargs, every n, offload)

    def post_init(self) -> None:
        """transformers' end of construction (every fastbert model calls it last in __init__): modules not
        initialised yet get transformers' initialisation, once (a second call, or one after
        resize_token_embeddings, changes nothing; a model built on the meta device is left to its
        loader); word embeddings are tied; the old `config.gradient_checkpointing=True` switches
        checkpointing on and is removed from the config, as transformers does."""
        if not any(p.is_meta for p in self.parameters()):
            self.initialize_modules([m for m in self.modules() if not getattr(m, "_is_hf_initialized", False)])
        else:
            self.tie_weights()
        if getattr(self.config, "gradient_checkpointing", False):
            self.activation_checkpointing_enable()
            delattr(self.config, "gradient_checkpointing")
        # transformers' tensor / expert / pipeline / FSDP plans name modules to shard; fastbert's fused
        # layers have none (read by transformers' distributed code and tests)
        self._tp_plan, self._ep_plan, self._pp_plan, self._fsdp_plan = {}, {}, {}, {}

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' per-module initialisation hook (its init_weights calls it on every module)."""
        self.init_weights([module])

    def initialize_modules(self, modules: Iterable[nn.Module]) -> None:
        """Initialise `modules` (and mark them initialised) one module at a time through transformers'
        per-module entry point, `_initialize_weights(module)` -> `_init_weights(module)`, as transformers'
        own initialize_weights does: code that wraps that method (transformers' tests seed it, so that a
        model built by `cls(config)` and one loaded from an empty state dict get the same weights) sees
        fastbert's initialisation as it sees transformers'."""
        for m in modules:
            m._is_hf_initialized = False   # the caller asks for a fresh init (a missing weight, say)
            self._initialize_weights(m)

    @property
    def _tied_weights_keys(self) -> Dict[str, str]:
        """transformers' declaration of tied parameters: {parameter: the parameter it shares}."""
        return self.tied_weights()

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config, backend: str = "auto"):
        """A model with transformers' initialisation (as `cls(config)`), ready for
        load_state_dict(hf.state_dict())."""
        model = cls(config)
        model.backend = backend
        return model

    # ---- op backend -----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Which implementation every fastbert op of this model runs: "auto" (Triton kernels on CUDA,
        torch on CPU), "triton" (the kernels; on CPU only under TRITON_INTERPRET=1) or "torch" (the
        pure-torch references). Held by the bare encoder and passed to each op call."""
        return self.base_model._backend

    @backend.setter
    def backend(self, value: str) -> None:
        if value not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {value!r}")
        self.base_model._backend = value

    # ---- weights --------------------------------------------------------------------------------
    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def tied_weights(self) -> Dict[str, str]:
        """{parameter name: name of the parameter it shares} when word embeddings are tied."""
        return {}

    def tie_weights(self) -> None:
        if not getattr(self.config, "tie_word_embeddings", True):
            return
        for dst, src in self.tied_weights().items():
            owner, name = self._owner(dst)
            setattr(owner, name, self.get_parameter(src))

    def _owner(self, key: str) -> Tuple[nn.Module, str]:
        path, _, name = key.rpartition(".")
        return self.get_submodule(path), name

    def get_input_embeddings(self) -> nn.Embedding:
        base = self.base_model
        return base.embeddings.word_embeddings if base is self else base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        old = self.get_input_embeddings()
        for parent in self.modules():
            for name, child in parent.named_children():
                if child is old:
                    setattr(parent, name, value)

    def init_std(self, module: nn.Module, name: str) -> Tuple[float, Optional[float]]:
        """(std, truncation cutoff in stds or None) of the normal init of a Linear or Embedding named
        `name`: transformers' normal(0, initializer_range) unless a family says otherwise."""
        return getattr(self.config, "initializer_range", 0.02), None

    def init_weights(self, modules: Optional[Iterable[nn.Module]] = None) -> None:
        """transformers' initialisation: normal(0, std) weights (truncated where `init_std` says), zero
        biases, unit norms. A weight tied to the word embeddings keeps theirs: transformers initialises
        before it ties, so the tied table has the embeddings' init (padding row zero), not the decoder's."""
        names = {m: n for n, m in self.named_modules()}
        tied = set(self.tied_weights()) if getattr(self.config, "tie_word_embeddings", True) else set()
        modules = list(self.modules() if modules is None else modules)
        with torch.no_grad():
            for m in modules:
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    name = names.get(m, "")
                    if f"{name}.weight" not in tied:
                        std, cutoff = self.init_std(m, name)
                        if cutoff is None:
                            m.weight.normal_(0.0, std)
                        else:
                            nn.init.trunc_normal_(m.weight, 0.0, std, -cutoff * std, cutoff * std)
                    if isinstance(m, nn.Linear) and m.bias is not None:
                        m.bias.zero_()
                    if isinstance(m, nn.Embedding) and m.padding_idx is not None and self.init_zeroes_padding_row:
                        m.weight[m.padding_idx].zero_()
                elif isinstance(m, nn.LayerNorm):
                    m.weight.fill_(1.0)
                    if m.bias is not None:
                        m.bias.zero_()
                for name, p in m.named_parameters(recurse=False):
                    if name == "bias" and not isinstance(m, (nn.Linear, nn.LayerNorm)):
                        p.zero_()  # MLM output bias
            fixed_tables = getattr(self.base_model, "init_fixed_tables", None)
            if fixed_tables is not None:  # a family's tables that are not random (DistilBERT's sinusoids)
                fixed_tables(modules)
        self.tie_weights()

    @classmethod
    def can_generate(cls) -> bool:
        return False  # encoders only

    def _finish(self, output, return_dict: Optional[bool]):
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------------
# bare encoders
# ---------------------------------------------------------------------------------------------------
class EncoderModel(FastPreTrainedModel):
    """A bare encoder: embeddings -> unpad -> layers -> repad -> (pooler), or, from packed inputs,
    embeddings -> layers (`forward_packed`).

    Families supply `embed(input_ids, token_type_ids, position_ids, inputs_embeds, backend)` on packed
    (tokens,) tensors -> (tokens, hidden), `encoder_layers()` (in execution order) and `pool(sequence_output)`
    (None without a pooler). Position ids follow the registry's convention for the model type
    (`padded_positions` / `packed_positions`; a family with another scheme overrides them). Padding
    positions of last_hidden_state and of hidden_states are zeros (transformers computes them on
    padding tokens; nothing should read them)."""

    has_token_types = True
    output_class = BaseModelOutputWithPooling

    def __init__(self, config):
        super().__init__(config)
        self._backend = "auto"
        self._short_path = ShortPath()     # short_states' C++ forward, made on first use

    def token_types(self, token_type_ids):
        """The token type ids the model reads: a family without token type embeddings (DistilBERT,
        MPNet, ModernBERT) takes them and ignores them, as transformers' models do (a BERT tokenizer
        next to such a checkpoint returns them, and pipelines pass them on)."""
        return token_type_ids if self.has_token_types else None

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds, backend: str) -> torch.Tensor:
        raise NotImplementedError

    def encoder_layers(self) -> List[EncoderLayer]:
        raise NotImplementedError

    def pool(self, sequence_output: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def max_sequence_length(self) -> int:
        return self.embeddings.max_sequence_length()

    def max_position_id(self) -> int:
        """The bound (exclusive) of the position ids the model takes: its position table's rows."""
        return self.dims.max_position_embeddings

    def prepack_weights(self, enable: bool = True) -> None:
        """CPU fp32 inference (no gradient) reads packed copies of the post-LN layers' Linear
        weights (fastbert.models.layers.PackedWeights, fastbert.ops.linear.PackedWeight), made on
        first use: each GEMM skips its weight reorder (batch-1 forwards about 1.5x faster), for one
        more copy of those weights in memory per GEMM engine used (MKL's for up to
        fastbert.ops.linear.MKL_MAX_TOKENS tokens, oneDNN's for more), and an eval forward with
        autograd off runs the layers' lean path (fastbert.models.layers.LeanPlan). A copy is remade
        when its parameter is replaced or written in place through itself (load_state_dict, an
        optimizer step, `with torch.no_grad(): p.mul_(2)`), not after a write through `p.data`: call
        prepack_weights() again after one (it drops every copy).
        enable=False drops the copies and goes back to the plain weights. fastbert.Encoder turns it
        on for its model; other layer kinds ignore it."""
        for layer in self.encoder_layers():
            if isinstance(layer, FastLayer):
                layer.packed_weights = PackedWeights() if enable else None

    def pack_for_threads(self, tokens: int) -> None:
        """Make now, under the current intra-op thread count, the MKL packed copies that a lean forward
        of `tokens` tokens would make on first use. MKL packs a weight for the threads in effect when
        it packs, and a copy packed on one thread computes on one: batch 1 of a 26-token text on two
        threads took 3.4-3.7 ms with copies packed on two, 5.3-6.3 with copies packed on one (2-core
        guest). fastbert.Encoder calls this before it runs a small batch on fewer threads."""
        for layer in self.encoder_layers():
            plan = layer.lean_plan() if isinstance(layer, FastLayer) else None
            for weight in plan.packed if plan is not None else ():
                if weight.uses_mkl(tokens):
                    weight.mkl()

    # ---- position ids, packed ---------------------------------------------------------------------------
    def position_offset(self) -> int:
        return family(self.dims.model_type).position_offset(self.dims.pad_token_id)

    def padded_positions(self, packing: Packing, input_ids, position_ids) -> torch.Tensor:
        """(tokens,) position ids of the real tokens of a padded batch, as transformers numbers them:
        by column, or (RoBERTa-like) padding_idx + running count of non-pad ids."""
        b, s, device = packing.batch, packing.seqlen, packing.cu_seqlens.device
        if position_ids is not None:
            return pack(position_ids.expand(b, s), packing)
        offset = self.position_offset()
        if not family(self.dims.model_type).roberta_positions:
            return token_positions(packing, packing.total) + offset
        if input_ids is None:  # no ids to find padding in: sequential, as transformers
            return pack(torch.arange(offset, s + offset, device=device).expand(b, s), packing)
        real = input_ids.ne(self.dims.pad_token_id).int()
        return pack(torch.cumsum(real, dim=1).type_as(real) * real + self.dims.pad_token_id, packing)

    def packed_positions(self, cu_seqlens: torch.Tensor, tokens: int, position_ids) -> torch.Tensor:
        """(tokens,) position ids of packed sequences: 0..len-1 each (plus the family's offset)."""
        if position_ids is not None:
            return position_ids
        if cu_seqlens.shape[0] == 2:     # one sequence, cu_seqlens [0, tokens]: one arange (batch 1)
            offset = self.position_offset()
            return torch.arange(offset, offset + tokens, device=cu_seqlens.device)
        return packed_positions(cu_seqlens, tokens, self.position_offset())

    # ---- entry points --------------------------------------------------------------------------------
    def _run_layers(self, x, packing, output_attentions: bool, hidden_states: Optional[list]):
        """Each layer on packed x (checkpointed by the layer itself when that is on); with
        `hidden_states`, each layer's output is repadded there and the next layer reads it back from
        the padded tensor, so that gradients reach every returned hidden state (saliency, attribution)."""
        attentions = [] if output_attentions else None
        backend = self._backend
        layers = self.encoder_layers()
        if not output_attentions and hidden_states is None and (plans := lean_plans(layers, x, backend)) is not None:
            return run_lean(plans, x, packing.cu_seqlens, packing.max_seqlen), None
        for layer in layers:
            x, probs = layer(x, packing, output_attentions, backend)
            if hidden_states is not None:
                hidden_states.append(repad(x, packing))
                x = pack(hidden_states[-1], packing)
            if output_attentions:
                attentions.append(probs)
        return x, attentions

    def run_encoder(self, x, packing, positions, output_attentions: bool, hidden_states: Optional[list]):
        """The padded forward's hook after the embeddings: `positions` is what `padded_positions`
        gave; -> (x, attentions), the repadded states appended to `hidden_states`."""
        return self._run_layers(x, packing, output_attentions, hidden_states)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                **kwargs):
        """transformers' padded forward; one device-to-host sync (input ranges and mask lengths together)."""
        if kwargs:
            raise TypeError(f"{type(self).__name__}.forward got unexpected arguments {sorted(kwargs)}")
        if torch.jit.is_tracing() or torch.compiler.is_exporting():
            raise RuntimeError(NOT_EXPORTABLE)
        self._check_embedding_hooks()
        if output_attentions is None:
            output_attentions = getattr(self.config, "output_attentions", False)
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        token_type_ids = self.token_types(token_type_ids)
        batch, seqlen, device, stats = check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids,
                                                    inputs_embeds)
        packing = unpad(attention_mask, batch, seqlen, device, host_stats=stats)
        positions = self.padded_positions(packing, input_ids, position_ids)
        x = self.embed(None if input_ids is None else pack(input_ids, packing),
                       None if token_type_ids is None else pack(token_type_ids, packing), positions,
                       None if inputs_embeds is None else pack(inputs_embeds, packing), self._backend)
        hidden_states = None
        if output_hidden_states:   # the layers read the padded embeddings back (see _run_layers)
            hidden_states = [repad(x, packing)]
            x = pack(hidden_states[0], packing)
        # "eager" (transformers' unfused attention) takes the path that materialises the probabilities
        unfused = bool(output_attentions) or getattr(self.config, "_attn_implementation", None) == "eager"
        x, attentions = self.run_encoder(x, packing, positions, unfused, hidden_states)
        sequence_output = hidden_states[-1] if output_hidden_states else repad(x, packing)
        out = self.output_class(last_hidden_state=sequence_output,
                                hidden_states=_selected(hidden_states, output_hidden_states),
                                attentions=tuple(attentions) if output_attentions else None,
                                **({"pooler_output": self.pool(sequence_output)}
                                   if self.output_class is BaseModelOutputWithPooling else {}))
        return self._finish(out, return_dict)

    def _check_embedding_hooks(self) -> None:
        # transformers' Trainer(neftune_noise_alpha=...) hooks the input embeddings, expecting a
        # (batch, seq, hidden) output whose seq is the padded length; fastbert embeds packed tokens
        if self.training and getattr(self.get_input_embeddings(), "neftune_noise_alpha", None) is not None:
            raise ValueError("NEFTune (TrainingArguments(neftune_noise_alpha=...)) is not supported: its noise is "
                             "scaled by the padded sequence length of a (batch, seq, hidden) embedding output, and "
                             "fastbert embeds only the real tokens, packed; train without neftune_noise_alpha")

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: Optional[torch.Tensor] = None,
                       position_ids: Optional[torch.Tensor] = None) -> BaseModelOutput:
        """The packed entry: real tokens back to back, no padding anywhere.

        input_ids (tokens,) integer; cu_seqlens (batch + 1,) int32 cumulative lengths; max_seqlen a
        Python int >= the longest sequence; token_type_ids / position_ids (tokens,) or None (type 0;
        positions 0..len-1 per sequence, plus the family's offset). -> BaseModelOutput with
        last_hidden_state (tokens, hidden). Never waits for the device (no value is read on the
        host), so torch.compile(fullgraph=True) and CUDA graphs can capture it; values are checked
        by `check_packed` (call it on the host copy before uploading)."""
        token_type_ids = self.token_types(token_type_ids)
        check_packed_shapes(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)
        return BaseModelOutput(last_hidden_state=self.packed_states(input_ids, cu_seqlens, max_seqlen, token_type_ids,
                                                                    position_ids))

    def packed_states(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                      token_type_ids: Optional[torch.Tensor] = None,
                      position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """forward_packed's last_hidden_state, for a caller that built the inputs itself (fastbert.Encoder,
        from its tokenizer): without forward_packed's shape checks and output object, which a short
        text's forward on a CPU paid ~80 us for (the forward streams the weights through the caches,
        and every Python and torch call after it runs cold)."""
        token_type_ids = self.token_types(token_type_ids)
        self._check_embedding_hooks()
        tokens = input_ids.shape[0]
        packing = Packing(None, cu_seqlens, max_seqlen, cu_seqlens.shape[0] - 1, max_seqlen)
        positions = self.packed_positions(cu_seqlens, tokens, position_ids)
        x = self.embed(input_ids, token_type_ids, positions, None, self._backend)
        if cu_seqlens.shape[0] > 1:   # an empty batch (the tokenizer's packed output for []) has no tokens to run
            x, _ = self.run_encoder(x, packing, positions, False, None)
        return x

    def short_states(self, input_ids: List[int]) -> Optional[torch.Tensor]:
        """The last hidden state (tokens, hidden) of one sequence of token ids (a list of ints; type 0,
        positions as packed_states numbers them), where its whole forward is one C++ call
        (fastbert.models.short_forward): float32 or int8 (fastbert.quantize) inference of at most
        STACK_MAX_TOKENS tokens on a CPU, the family's embeddings plain (short_embeddings), every layer
        with a native form (the lean path's, or layers.int8_native). None elsewhere: the caller runs
        packed_states. The values are packed_states'; what is left out is its plumbing for any batch, on
        any device (fastbert.Encoder's batch 1)."""
        if not 0 < len(input_ids) <= STACK_MAX_TOKENS or torch.is_grad_enabled():
            return None
        return self._short_path.states(self, input_ids)

    def short_embeddings(self) -> Optional[nn.Module]:
        """The fastbert.models.embeddings.Embeddings module whose forward (ids, type 0 when the model
        has token types, positions) is this family's whole embedding step, for short_states; None
        where the family embeds otherwise (a projection after it, its own embeddings class)."""
        return None

    def check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None) -> None:
        """Value checks for forward_packed's inputs (reads them: run it on the host copy)."""
        check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, position_ids)

