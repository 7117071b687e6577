"""One short sequence's whole forward as one C++ call (fastbert._C.ShortForward): the embeddings'
lookups and LayerNorm, then every layer's native form (layers.LeanPlan.native for float32 layers,
layers.int8_native for fastbert.quantize's int8 ones), from a list of token ids.
EncoderModel.short_states runs it for fastbert.Encoder's batch 1 on a CPU.

A short text's forward streams the weights (42 MB for all-MiniLM-L6-v2) through the caches, so each
Python and torch step before and after it runs cold, several times slower than in a loop: the
embeddings' torch plumbing, each layer's plan check and the stack's conversions were ~250 us of a
2.5 ms text. Here they are one call, and one Watch (a few C-level loops over flat lists) says that
what the C++ object holds is still the model's: the layers, their plans and packed weights, the
embedding tables and LayerNorm, the modules' places, hooks and training flags.
"""
import math
from typing import List, Optional

import torch

from fastbert import _C
from fastbert.models.layers import (_HOOK_DICTS, FastLayer, FreshOnCopy, Watch, _global_hooks, _hooked, _links,
                                    int8_native, module_watch)


class ShortPath(FreshOnCopy):
    """A model's ShortForward and its Watch, made on first use and remade when the Watch fails. Not
    pickled or deep-copied: a copy makes its own."""

    def __init__(self):
        self._built = None          # (Watch, _C.ShortForward)

    def states(self, model, input_ids: List[int]) -> Optional[torch.Tensor]:
        """The last hidden state (tokens, hidden) of `input_ids` (type 0, positions from the family's
        offset), or None where the model's forward is not this path's (see _build)."""
        built = self._built
        if built is None or not built[0].current():
            built = self._built = _build(model)
        if built is None or _global_hooks() or torch.compiler.is_compiling():
            return None
        out = built[1].run(input_ids, torch.get_num_threads())
        return None if out is None else torch.from_numpy(out)


def _build(model):
    """(Watch, ShortForward) for `model` as it is now, or None: training, a backend other than "auto",
    a family whose embedding step is not its plain Embeddings module (EncoderModel.short_embeddings),
    hooks on it, tables that are not contiguous CPU float32, a layer with no native form (neither a lean
    plan's nor an int8 one), float32 and int8 layers in one stack."""
    emb = model.short_embeddings()
    layers = model.encoder_layers()
    if (emb is None or not layers or model.training or model._backend != "auto" or emb.training or _hooked(emb)
            or not emb._plain()):
        return None
    natives, watches, flags = [], [], []
    for layer in layers:        # the first layer without a native form, or of the other kind, ends it
        plan = layer.lean_plan() if isinstance(layer, FastLayer) else None
        if plan is not None and plan.native() is not None:
            native, watch = plan.native(), plan.watch
            flags += [(layer.__dict__, "packed_weights", layer.packed_weights),
                      (layer.packed_weights.__dict__, "plan", plan)]
        elif (int8 := int8_native(layer)) is not None:
            native, watch = int8
        else:
            return None
        if natives and type(native) is not type(natives[0]):   # a stack is all float32 or all int8
            return None
        natives.append(native)
        watches.append(watch)
    tables = [emb.word_embeddings, emb.position_embeddings, getattr(emb, "token_type_embeddings", None)]
    tables = [t for t in tables if t is not None]
    norm = emb.LayerNorm
    tensors = [t.weight for t in tables] + [norm.weight, norm.bias]
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    modules = [emb, *tables, norm]
    flags += [(model.__dict__, "training", False), (model.__dict__, "_backend", model._backend),
              (emb.__dict__, "training", False), (norm.__dict__, "eps", norm.eps),
              *((t.__dict__, "max_norm", None) for t in tables),
              *((layer.__dict__, "training", False) for layer in layers)]
    links = _links(model, [*layers, *modules])
    if links is None:
        return None
    watch = Watch.joined([*watches, module_watch(links, modules),
                          Watch(flags, [getattr(layer, h) for layer in layers for h in _HOOK_DICTS])])

    def view(t):
        return t.detach().numpy()
    types = view(tables[2].weight) if len(tables) == 3 else None
    forward = _C.ShortForward(view(tables[0].weight), view(tables[1].weight), types, view(norm.weight),
                              view(norm.bias), float(norm.eps), model.position_offset(),
                              natives, 1.0 / math.sqrt(layers[0].head_dim))
    return watch, forward
