"""Variational continual learning (Nguyen et al. 2018; Farquhar, Osborne, Gal 2020 section 3.1).

After task t the trained posterior q_t becomes the prior of task t + 1: each Bayesian tensor gets a frozen copy of
its posterior in prior form (:func:`posterior_as_prior`):

* Gaussian posteriors (:class:`~varbnn.MeanField`, :class:`~varbnn.KTied`) -> a per-weight
  :class:`~varbnn.priors.Normal` prior ``N(loc, sigma^2)`` (the KL stays closed form);
* :class:`~varbnn.Radial` -> :class:`~varbnn.priors.RadialPrior` ``Radial(loc, sigma)`` (Monte Carlo cross-entropy,
  the paper's Appendix B).

Multi-head models (:class:`MultiHeadNet`: one shared trunk, one output head per task) train the trunk and the
current task's head; :meth:`MultiHeadNet.task_model` is the ``nn.Sequential(trunk, head_t)`` view whose KL covers
exactly those tensors. Single-head models keep one head for every task.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from varbnn.families.base import VariationalFamily
from varbnn.families.meanfield import MeanField
from varbnn.families.radial import Radial
from varbnn.nn.base import BayesianModule
from varbnn.priors import Normal, Prior, RadialPrior

__all__ = ["posterior_as_prior", "set_posterior_as_prior", "MultiHeadNet"]


def posterior_as_prior(posterior: VariationalFamily) -> Prior:
    """A frozen prior with the same distribution as a trained ``posterior`` (detached copies of its parameters).

    Supported: MeanField and its subclasses (KTied) -> per-weight Normal; Radial -> RadialPrior.
    """
    posterior._require_built()
    with torch.no_grad():
        if isinstance(posterior, Radial):
            return RadialPrior(posterior.loc.detach().clone(), posterior.scale.detach().clone())
        if isinstance(posterior, MeanField):
            return Normal(posterior.loc.detach().clone(), posterior.scale.detach().clone())
    raise ValueError(
        f"{type(posterior).__name__} has no prior form for continual learning; supported posteriors: MeanField, KTied, Radial"
    )


def set_posterior_as_prior(model: nn.Module, task: int | None = None) -> int:
    """Replace the prior of every Bayesian tensor in ``model`` by its current posterior (in prior form, frozen).

    Returns the number of tensors updated. Run it after training on a task and before the next one.

    A :class:`MultiHeadNet` needs ``task``, the head just trained: only the trunk and that head are updated. (On the
    whole network every head would be, and the heads of tasks not seen yet would get their untrained posteriors as
    priors.) ``set_posterior_as_prior(net.task_model(task))`` does the same.
    """
    if isinstance(model, MultiHeadNet):
        if task is None or isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(model.heads):
            raise ValueError(
                f"set_posterior_as_prior on a MultiHeadNet needs task, the head just trained (an int in [0, "
                f"{len(model.heads)})), got {task!r}: updating every head would make the unseen heads' untrained "
                "posteriors their priors"
            )
        model = model.task_model(task)
    elif task is not None:
        raise ValueError(f"task is for a MultiHeadNet; got task={task!r} for a {type(model).__name__}")
    updates = []  # every new prior is built first: a family without one refuses before any prior changes
    for module in model.modules():
        if isinstance(module, BayesianModule):
            for name, posterior, _ in list(module.bayesian_tensors()):
                prior = posterior_as_prior(posterior)
                device_param = next(posterior.parameters())
                updates.append((module, name, prior.to(device=device_param.device, dtype=device_param.dtype)))
    for module, name, prior in updates:
        module.priors[name] = prior
    return len(updates)


class MultiHeadNet(nn.Module):
    """A shared ``trunk`` and one output head per task; ``forward(x, task)`` runs ``heads[task](trunk(x))``.

    :param trunk: the shared feature extractor (plain or already Bayesian).
    :param heads: one module per task.
    """

    def __init__(self, trunk: nn.Module, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(heads) < 1:
            raise ValueError("MultiHeadNet needs at least one head")
        self.trunk = trunk
        self.heads = nn.ModuleList(heads)

    def forward(self, x: torch.Tensor, task: int = 0) -> torch.Tensor:
        if not 0 <= task < len(self.heads):
            raise ValueError(f"task must be in [0, {len(self.heads)}), got {task!r}")
        return self.heads[task](self.trunk(x))

    def task_model(self, task: int) -> nn.Sequential:
        """``nn.Sequential(trunk, heads[task])`` sharing this model's modules: train and evaluate one task with it
        (``varbnn.kl`` of it sums the trunk and that head only)."""
        if not 0 <= task < len(self.heads):
            raise ValueError(f"task must be in [0, {len(self.heads)}), got {task!r}")
        return nn.Sequential(self.trunk, self.heads[task])
