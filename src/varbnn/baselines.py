"""The non-variational baselines users pick instead of a BNN, behind the same :func:`varbnn.predict` path.

* :class:`MCDropout` (Gal & Ghahramani 2016): dropout stays on at prediction; each forward pass is one draw.
* :class:`DeepEnsemble` (Lakshminarayanan et al. 2017): independently trained plain networks; the members are the
  draws (the predictive is their uniform mixture; members that sample themselves, e.g. Bayesian networks, share the
  draws asked for). :func:`train_ensemble` trains one with :func:`varbnn.train.fit`, a checkpoint file per member.
* Temperature scaling lives in :mod:`varbnn.calibration`.
* Last-layer Laplace lives in :mod:`varbnn.laplace` (KFAC, prior precision by marginal likelihood).

Both wrappers return outputs of the same shape as the wrapped network, so :func:`varbnn.predict`, the likelihoods'
``metrics`` and :func:`varbnn.train.evaluate` treat them exactly like a Bayesian model.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn._checks import as_float_in, as_int
from varbnn.predict import _draws, _is_stochastic, vectorized_by_default
from varbnn.training import fit, seed_everything

__all__ = ["MCDropout", "add_dropout", "DeepEnsemble", "train_ensemble", "member_checkpoint"]

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
    """``model`` with its dropout layers sampling in every forward pass, in eval mode too: each pass is one Monte Carlo
    draw.

    The dropout layers sample whatever mode ``model`` was in when wrapped (a network already in ``eval()``
    included) and whatever mode it is switched to later: :meth:`forward` turns them on before every pass, and
    :meth:`train` / ``eval()`` leave them on. Everything else follows the mode as usual (batch norm uses its
    running statistics in eval mode, which :func:`varbnn.predict` selects).

    Raises ``ValueError`` if ``model`` has no dropout module (``nn.Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``,
    ``FeatureAlphaDropout``): its draws would all be equal; and if ``model`` holds a :class:`DeepEnsemble` (wrap
    each member instead: ``DeepEnsemble([MCDropout(m) for m in members])``). Dropout applied functionally
    (``F.dropout`` in a custom ``forward``) is not seen and not switched on.

    :param model: a network containing dropout layers (see :func:`add_dropout` to insert them).
    """

    _varbnn_samples_at_prediction = True  # varbnn.predict's _is_stochastic: two passes differ

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"MCDropout: model must be an nn.Module, got {type(model).__name__}")
        if not any(isinstance(m, _DROPOUT_TYPES) for m in model.modules()):
            raise ValueError(
                "MCDropout: model has no dropout layer (nn.Dropout, Dropout1d/2d/3d, AlphaDropout, "
                "FeatureAlphaDropout), so its draws would all be equal; insert them with add_dropout"
            )
        if any(isinstance(module, DeepEnsemble) for module in model.modules()):
            raise ValueError(
                "MCDropout: model holds a DeepEnsemble, whose forward is its members' mean (the mixture would collapse "
                "to one network); wrap each member instead: DeepEnsemble([MCDropout(m) for m in members])"
            )
        self.model = model
        self._dropout_on()

    def _dropout_on(self) -> None:
        for module in self.model.modules():
            if isinstance(module, _DROPOUT_TYPES):
                module.training = True  # dropout is the posterior: always sample

    def train(self, mode: bool = True) -> MCDropout:
        super().train(mode)
        self._dropout_on()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._dropout_on()
        return self.model(x)


class DeepEnsemble(nn.Module):
    """A uniform mixture of ``members``: :func:`varbnn.predict` returns their draws stacked ``[draws, ...]``.

    Members that are deterministic networks (no Bayesian layer in ``sample_mode="sample"``, no :class:`MCDropout`,
    no ``predictive_draws`` hook of their own) give one draw each, so
    ``predict(ensemble, x, samples=S)`` returns exactly ``M`` draws whatever ``S``: the predictive has ``M`` equally
    weighted components. When any member is stochastic (an ensemble of Bayesian networks, of :class:`MCDropout`
    networks ...), ``predict`` returns exactly ``S`` draws, grouped by member: member ``m`` gives ``S // M`` of them,
    plus one for each of the first ``S % M`` members (so an ``S`` that is a multiple of ``M`` weights the members
    exactly equally; others by at most one draw apart). ``S < M`` is a ``ValueError`` (a member would be left out).
    A deterministic member in such an ensemble runs once and its output is repeated. Each stochastic member's draws
    run as :func:`varbnn.predict`'s default would (batched unless it has Bayesian convolutions on the CPU), all at
    once: ``predict``'s ``chunk_size`` and ``vectorize`` do not reach them (its ``batch_size`` caps the memory).

    A member that is or holds a ``DeepEnsemble`` is a ``ValueError`` (pass the inner members flat).

    ``forward(x)`` alone returns the members' MEAN output (e.g. mean logits; one pass per member), for code that
    wants one point prediction. Every member must return outputs of the same shape; a member that does not is a
    ``ValueError`` naming it, at every pass (the shapes are unknown until an input is seen).
    """

    _varbnn_delegates_draws = True  # _is_stochastic looks at the members instead
    # varbnn.fit refuses this class with this message (a declaration, so that the training loop imports no baseline)
    _varbnn_fit_refusal = (
        "fit(DeepEnsemble) would train the members jointly through their mean output, not independently: train "
        "each member with fit (or use varbnn.baselines.train_ensemble), then wrap them in a DeepEnsemble"
    )

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        members = list(members)
        if len(members) < 2 or not all(isinstance(m, nn.Module) for m in members):
            raise ValueError(f"DeepEnsemble needs at least two nn.Module members, got {len(members)}")
        for index, member in enumerate(members):
            if any(isinstance(module, DeepEnsemble) for module in member.modules()):
                raise ValueError(
                    f"DeepEnsemble member {index} is (or holds) a DeepEnsemble: its forward is its members' mean, so "
                    "the inner mixture would collapse to one network; pass the inner members flat "
                    "(DeepEnsemble([*inner.members, ...])), and scale the whole ensemble with TemperatureScaled"
                )
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

    def _stacked(self, outputs: list[torch.Tensor], *, dim_from: int) -> torch.Tensor:
        """``outputs`` (one per member) concatenated / stacked, after checking that the members' output shapes agree
        (from dimension ``dim_from``: 0 for single passes, 1 for ``[k, ...]`` draws)."""
        reference = tuple(outputs[0].shape[dim_from:])
        for index, output in enumerate(outputs[1:], start=1):
            if tuple(output.shape[dim_from:]) != reference:
                raise ValueError(
                    f"DeepEnsemble member {index} returns outputs of shape {tuple(output.shape[dim_from:])} but member 0 "
                    f"returns {reference}: every member must give outputs of the same shape (the same number of "
                    "classes or targets)"
                )
        return torch.stack(outputs) if dim_from == 0 else torch.cat(outputs)

    def draws(self, x: torch.Tensor) -> torch.Tensor:
        """One pass of every member, stacked ``[M, *member(x).shape]``."""
        return self._stacked([member(x) for member in self.members], dim_from=0)

    def predictive_draws(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        """The hook :func:`varbnn.predict` calls: ``M`` draws (one per member) when every member is deterministic,
        else ``samples`` draws grouped by member (see the class docstring)."""
        stochastic = [_is_stochastic(member) for member in self.members]
        if not any(stochastic):
            return self.draws(x)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < len(self.members):
            raise ValueError(
                f"samples must be an int >= {len(self.members)} (the ensemble's members) for a DeepEnsemble with "
                f"stochastic members (each member needs at least one draw; a multiple of {len(self.members)} weights "
                f"them equally), got {samples!r}"
            )
        share, extra = divmod(samples, len(self.members))
        outputs = []
        for index, (member, random) in enumerate(zip(self.members, stochastic)):
            count = share + (index < extra)
            if random:
                outputs.append(_draws(member, x, count, None, vectorized_by_default(member, x)))
            else:
                output = member(x)
                outputs.append(output.unsqueeze(0).expand(count, *output.shape))
        return self._stacked(outputs, dim_from=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.draws(x).mean(0)


def member_checkpoint(checkpoint: str | os.PathLike[str], member: int) -> Path:
    """The checkpoint file of ensemble member ``member`` in :func:`train_ensemble`: ``checkpoint``'s name with
    ``.member{member}`` put before its suffix (``runs/ens.pt`` -> ``runs/ens.member0.pt``, ``runs/ens`` ->
    ``runs/ens.member0``)."""
    path = Path(checkpoint)
    member = as_int(member, "member", 0, owner="member_checkpoint")
    return path.with_name(f"{path.stem}.member{member}{path.suffix}")


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

    ``checkpoint=path`` (a ``fit`` argument) gives every member a file of its own, :func:`member_checkpoint`
    (``ens.pt`` -> ``ens.member0.pt``, ``ens.member1.pt`` ...), so ``resume=True`` continues each member from its
    own file (a member whose file is missing starts afresh; a finished one is loaded as it is). ``path`` itself is
    never written; an existing ``path`` with no member files beside it (the one file all members shared in earlier
    versions) is not resumed from, with a ``UserWarning``.

    The cost is ``members`` times one network's training. (Lakshminarayanan et al. also add adversarial training;
    this is the plain form that is usually compared.)
    """
    members = as_int(members, "members", 2, owner="train_ensemble")
    checkpoint = fit_kwargs.pop("checkpoint", None)
    paths: list[Path | None] = [None] * members
    if checkpoint is not None:
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"train_ensemble: checkpoint must be a path (str or os.PathLike), got {type(checkpoint).__name__}")
        paths = [member_checkpoint(checkpoint, m) for m in range(members)]
        if fit_kwargs.get("resume") and Path(checkpoint).is_file() and not any(p.exists() for p in paths if p):
            warnings.warn(
                f"train_ensemble: {os.fspath(checkpoint)} exists but each member now has its own checkpoint "
                f"({paths[0]}, ...); the shared file (which held one member only) is not resumed from, every member "
                "trains afresh",
                UserWarning,
                stacklevel=2,
            )
    trained = []
    for m in range(members):
        seed_everything(seed + m)
        model = make_model()
        fit(model, loader, progress=progress, checkpoint=paths[m], **fit_kwargs)
        trained.append(model)
    return DeepEnsemble(trained)
