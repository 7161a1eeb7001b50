"""The non-variational baselines users pick instead of a BNN, behind the same :func:`varbnn.predict` path.

* :class:`MCDropout` (Gal & Ghahramani 2016): dropout stays on at prediction; each forward pass is one draw.
* :class:`DeepEnsemble` (Lakshminarayanan et al. 2017): independently trained plain networks; the members are the
  draws (the predictive is their uniform mixture). :func:`train_ensemble` trains one with :func:`varbnn.train.fit`.
* Temperature scaling lives in :mod:`varbnn.calibration`.
* Last-layer Laplace lives in :mod:`varbnn.laplace` (KFAC, prior precision by marginal likelihood).

Both wrappers return outputs of the same shape as the wrapped network, so :func:`varbnn.predict`, the likelihoods'
``metrics`` and :func:`varbnn.train.evaluate` treat them exactly like a Bayesian model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from varbnn._checks import as_float_in, as_int

__all__ = ["MCDropout", "add_dropout", "DeepEnsemble", "train_ensemble"]

_DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def add_dropout(model: nn.Module, p: float, *, layer_types: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)) -> nn.Module:
    """A NEW model with ``nn.Dropout(p)`` in front of every ``layer_types`` layer except the first one met (dropout on
    the raw input is not MC dropout's usual practice). The input model is not modified."""
    p = as_float_in(p, "p", 0.0, 1.0, low_open=True, high_open=True, owner="add_dropout")
    new = copy.deepcopy(model)
    seen = [False]

    def visit(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, layer_types):
                if seen[0]:
                    setattr(parent, name, nn.Sequential(nn.Dropout(p), child))
                seen[0] = True
            else:
                visit(child)

    if isinstance(new, layer_types):
        return new
    visit(new)
    return new


class MCDropout(nn.Module):
    """``model`` with its dropout layers kept ON in eval mode too: every forward pass is one Monte Carlo draw.

    Raises ``ValueError`` if ``model`` has no dropout layer (its draws would all be equal).

    :param model: a network containing dropout layers (see :func:`add_dropout` to insert them).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not any(isinstance(m, _DROPOUT_TYPES) for m in model.modules()):
            raise ValueError("MCDropout: model has no dropout layer (nn.Dropout*, AlphaDropout); insert them with add_dropout")
        self.model = model

    def train(self, mode: bool = True) -> MCDropout:
        super().train(mode)
        for module in self.model.modules():
            if isinstance(module, _DROPOUT_TYPES):
                module.train(True)  # dropout is the posterior: always sample
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class DeepEnsemble(nn.Module):
    """A uniform mixture of ``members``: :func:`varbnn.predict` returns their outputs stacked ``[M, ...]``.

    ``predict(ensemble, x, samples=S)`` ignores ``S``: an ensemble's predictive has exactly ``M`` equally weighted
    components, so each member is one draw. ``forward(x)`` alone returns the members' MEAN output (e.g. mean logits),
    for code that wants one point prediction.
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        if len(members) < 2 or not all(isinstance(m, nn.Module) for m in members):
            raise ValueError(f"DeepEnsemble needs at least two nn.Module members, got {len(members)}")
        owner: dict[int, int] = {}
        for index, member in enumerate(members):
            for tensor in member.parameters():
                first = owner.setdefault(id(tensor), index)
                if first != index:
                    raise ValueError(
                        f"DeepEnsemble members {first} and {index} share parameters (the same module passed twice, "
                        "or a make_model that returns one instance): every member must be its own network, or the "
                        "ensemble's spread is zero"
                    )
        self.members = nn.ModuleList(members)

    def draws(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's output, stacked ``[M, *member(x).shape]``."""
        return torch.stack([member(x) for member in self.members])

    def predictive_draws(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        """The hook :func:`varbnn.predict` calls: the members' outputs (``samples`` is ignored)."""
        return self.draws(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.draws(x).mean(0)


def train_ensemble(
    make_model: Callable[[], nn.Module],
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    members: int = 5,
    seed: int = 0,
    progress: bool = False,
    **fit_kwargs: Any,
) -> DeepEnsemble:
    """Train ``members`` networks from ``make_model()`` independently (member ``m`` seeded ``seed + m`` for its
    initialisation and the global random stream: batch order too, unless the loader has a generator of its own) with
    :func:`varbnn.train.fit` (``fit_kwargs``: ``n_data``, ``epochs``, ``lr``, ``likelihood``, ``device`` ...) and
    return them as a :class:`DeepEnsemble`.

    The cost is ``members`` times one network's training. (Lakshminarayanan et al. also add adversarial training;
    this is the plain form that is usually compared.)
    """
    from varbnn.train import fit, seed_everything

    members = as_int(members, "members", 2, owner="train_ensemble")
    trained = []
    for m in range(members):
        seed_everything(seed + m)
        model = make_model()
        fit(model, loader, progress=progress, **fit_kwargs)
        trained.append(model)
    return DeepEnsemble(trained)
