"""torch's fused eval-mode fast paths of the transformer encoder, switched off where a Bayesian module sits inside.

``nn.TransformerEncoderLayer.forward`` in eval mode (without gradients, batched input, ReLU or GELU ...) calls
``torch._transformer_encoder_layer_fwd`` with the tensors ``self_attn.in_proj_weight``, ``self_attn.out_proj.weight``,
``linear1.weight`` and ``linear2.weight`` read directly instead of calling its sub-modules; ``nn.TransformerEncoder``
(``use_nested_tensor``, with a key padding mask) reads the first layer's tensors the same way and turns the batch into
a nested tensor that only that fast path takes. A Bayesian layer has no such plain tensors (its weights are drawn at
every pass), so :func:`bayesianize` switches both off where the layer or stack holds a Bayesian module: the layer's
``activation_relu_or_gelu`` (which torch reads only to decide on the fast path and to pick its fused activation) is
set to 0, the stack's ``use_nested_tensor`` to False; their regular path calls ``self_attn``, ``linear1`` and
``linear2`` as modules and computes the same function. The values they had are kept in ``_varbnn_fast_path`` and
:func:`to_deterministic` puts them back once nothing Bayesian is left inside.
"""

from __future__ import annotations

from torch import nn

from varbnn.nn.base import BayesianModule

_SAVED = "_varbnn_fast_path"
# the attribute that decides on each fast path, and the value that switches it off
_SWITCHES: tuple[tuple[type[nn.Module], str, object], ...] = (
    (nn.TransformerEncoderLayer, "activation_relu_or_gelu", 0),
    (nn.TransformerEncoder, "use_nested_tensor", False),
)


def _holds_bayesian(module: nn.Module) -> bool:
    return any(isinstance(sub, BayesianModule) for sub in module.modules())


def disable_fast_paths(model: nn.Module) -> list[str]:
    """Switch off the fused fast path of every transformer encoder layer and stack in ``model`` that holds a Bayesian
    module; the names of those switched (the old value is kept for :func:`restore_fast_paths`)."""
    switched = []
    for name, module in model.named_modules():
        for module_type, attribute, off in _SWITCHES:
            if isinstance(module, module_type) and hasattr(module, attribute) and _holds_bayesian(module):
                if _SAVED not in module.__dict__:
                    module.__dict__[_SAVED] = getattr(module, attribute)
                setattr(module, attribute, off)
                switched.append(name)
    return switched


def restore_fast_paths(model: nn.Module) -> None:
    """Give back the fast path that :func:`disable_fast_paths` switched off, where no Bayesian module is left inside."""
    for module in model.modules():
        if _SAVED not in module.__dict__ or _holds_bayesian(module):
            continue
        for module_type, attribute, _ in _SWITCHES:
            if isinstance(module, module_type):
                setattr(module, attribute, module.__dict__[_SAVED])
        del module.__dict__[_SAVED]
