"""transformers' gradient (activation) checkpointing switches. fastbert's layers are transformers
GradientCheckpointingLayers (layers.FastLayer): the switch sets each layer's flag and checkpoint
function, and the layer's own forward runs inside it, as in transformers."""
import functools

import torch
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer


def _offloaded_checkpoint(function, *args, **kwargs):
    with save_on_cpu(pin_memory=torch.cuda.is_available()):
        return checkpoint(function, *args, **kwargs)


class GradientCheckpointing:
    """FastPreTrainedModel's checkpointing switches (a mixin)."""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, every_n_layers: int = 1,
                                        offload: bool = False) -> None:
        """Recompute encoder layers in the backward instead of keeping their activations (training only),
        as transformers: every `every_n_layers`-th layer; kwargs go to torch.utils.checkpoint (default
        use_reentrant=False); offload=True keeps the saved layer inputs in host memory."""
        if not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers must be a positive int, got {every_n_layers!r}")
        kwargs = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        if kwargs["use_reentrant"]:
            # as transformers: reentrant checkpointing gives layer weights gradients only when the layer's
            # input requires grad, which frozen embeddings (LoRA, adapters) do not
            self.enable_input_require_grads()
        function = functools.partial(_offloaded_checkpoint if offload else checkpoint, **kwargs)
        index = 0
        for m in self.modules():
            if isinstance(m, GradientCheckpointingLayer):
                m.gradient_checkpointing = index % every_n_layers == 0
                m._gradient_checkpointing_func = function
                index += 1
            elif isinstance(m, GradientCheckpointing):
                # a layer stack that checkpoints in its own loop (rotary_encoder) reads these
                m.gradient_checkpointing = True
                m._checkpoint_options = (kwargs, every_n_layers, bool(offload))

    def enable_input_require_grads(self) -> None:
        """transformers' switch: the input embeddings' output requires grad even when the embeddings are
        frozen, so that gradients reach trainable weights inside reentrant-checkpointed layers."""
        def make_inputs_require_grads(module, inputs, output):
            output.requires_grad_(True)

        self.disable_input_require_grads()
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(make_inputs_require_grads)

    def disable_input_require_grads(self) -> None:
        hook = self.__dict__.pop("_require_grads_hook", None)
        if hook is not None:
            hook.remove()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, every_n_layers: int = 1,
                                      offload: bool = False) -> None:
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def activation_checkpointing_disable(self) -> None:
        for m in self.modules():
            if isinstance(m, (GradientCheckpointing, GradientCheckpointingLayer)):
                m.gradient_checkpointing = False

    gradient_checkpointing_disable = activation_checkpointing_disable

    @property
    def is_activation_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) is True for m in self.modules())

    is_gradient_checkpointing = is_activation_checkpointing
