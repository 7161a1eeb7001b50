"""The training loop, :func:`fit`: ELBO steps, adaptive-prior updates, progress bar, checkpoints."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from varbnn import distributed as vdist
from varbnn._checks import as_bool, as_float_in, as_int, as_positive_int, check_batch
from varbnn.data.batches import fast_batches
from varbnn.likelihoods import Likelihood
from varbnn.nn.model import model_kl, update_adaptive_priors
from varbnn.objectives import (
    ELBOTerms,
    _training_set_size,
    elbo_loss,
    graves_gradients,
    kl_weight_alias,
    uses_graves_estimator,
)
from varbnn.training.checkpoint import _rng_state, save_checkpoint
from varbnn.training.checks import (
    _KINDS,
    NonFiniteError,
    _DeferredChecks,
    _distinct_examples_per_epoch,
    _draws_with_replacement,
    _gradient_detail,
    _gradients_finite,
    _listing,
    _loss_detail,
    _nonfinite_data,
    _nonfinite_error,
    _nonfinite_names,
)
from varbnn.training.compiled import _compiled_elbo_step, _fit_compile_mode, _uses_cudagraphs
from varbnn.training.diagnose import (
    _DIAGNOSE_LABEL_BATCHES,
    _class_labels,
    _diagnose,
    _label_entropy,
    _warn_if_not_sampling,
)
from varbnn.training.early_stopping import validation_watch
from varbnn.training.prepare import _check_graves, _data_term, _distributed, _kl_weight_schedule, _optimizer, _start
from varbnn.training.setup import BetaSchedule, NLLFunction, _has_adaptive_prior, resolve_device

logger = logging.getLogger("varbnn.train")


"""Every finished epoch of :func:`fit` is logged here at INFO (loss, NLL, KL, beta): ``logging.basicConfig(level=INFO)``."""


def fit(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    n_data: int,
    epochs: int,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    nll: NLLFunction = F.cross_entropy,
    likelihood: Likelihood | str | None = None,
    kl_weight: float | BetaSchedule | None = None,
    device: str | torch.device | None = "model",
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    on_step_end: Callable[[int, ELBOTerms], None] | None = None,
    distributed: bool | None = None,
    mc_samples: int = 1,
    skip_nonfinite: bool = False,
    checkpoint_extra: Callable[[], dict[str, Any]] | None = None,
    diagnose: bool = True,
    compile: bool | str = False,
    validation: tuple[torch.Tensor, torch.Tensor] | None = None,
    validation_samples: int = 8,
    early_stopping: int | None = None,
    beta: float | BetaSchedule | None = None,
    validation_predictive: str = "auto",
) -> list[dict[str, float]]:
    """Minimise ``nll(model(x), y) + kl_weight * kl(model) / n_data`` with Adam (:func:`default_optimizer`) or ``optimizer``.

    The loss is the negative ELBO per training example (Graves 2011 eq. 18 divided by the batch size; see
    :mod:`varbnn.divergence` for the convention): the batch-mean NLL of one weight draw plus the model's KL, SUMMED
    over every weight, times ``kl_weight / n_data``. Each step is one forward pass, ``loss.backward()`` and one optimizer
    step, followed by :func:`varbnn.priors.update_adaptive_priors`. The paragraphs below say what each argument does;
    the parameter list at the end sums them up.

    ``likelihood`` (a :class:`varbnn.likelihoods.Likelihood`, or the name of one without learned parameters:
    ``"categorical"``, ``"heteroscedastic"``) replaces ``nll``: its :meth:`~varbnn.likelihoods.Likelihood.nll` is
    the data term, its own parameters (e.g. a learned noise level) are trained with the model's (added to the default
    optimizer; a given ``optimizer`` must already hold them) and saved in the checkpoint, and its
    :meth:`~varbnn.likelihoods.Likelihood.kl` (a noise posterior's) joins the KL term at weight 1. Default: ``nll``,
    the cross-entropy of a classifier's logits.

    With an optimizer that includes the prior in its update (``includes_prior``, e.g. :class:`varbnn.optim.IVON`) the
    loss is the NLL alone and ``kl_weight`` must be left unset (the optimizer's own ``kl_weight`` sets the posterior's
    temperature): each step's gradients are the NLL's alone (no KL is built), and the history's ``kl`` is the model's
    KL after the epoch's last step.

    ``kl_weight`` (beta in the papers' notation): ``None`` (default) is the library's default for the model's families
    and the task (:func:`varbnn.objectives.default_kl_weight`): with a regression likelihood (``likelihood`` or a
    :class:`~varbnn.likelihoods.Likelihood` passed as ``nll`` whose ``task`` is ``"regression"``, e.g.
    :class:`~varbnn.likelihoods.Gaussian`) each family's ``default_regression_kl_weight`` where it sets one (chosen
    on regression validation data, ``benchmarks/results/regression-defaults/``; none does yet), otherwise its
    ``default_kl_weight`` (MeanField 0.1, chosen on classification validation data: the defaults results page);
    ``1.0`` is the true ELBO, as the papers train.

    ``diagnose`` (default True): after training, one :class:`TrainingWarning` if the run shows a problem the library
    can see -- a posterior within 0.25 nats per weight of its prior while the training NLL stayed at its first-epoch
    level (runs of 3 epochs or more) and, for class labels, above half the NLL of predicting the label frequencies
    (the KL pulled the weights back to the prior; a converted trained network that fits from its first epoch is not
    flagged), or a posterior whose standard deviations are below 1e-3 of its means' magnitude (predictions
    practically deterministic).

    Adaptive priors are set to their optimum after every step. Models with a ``MeanField(estimator="graves")`` tensor
    take their gradients from :func:`varbnn.objectives.graves_gradients` (a weight draw per example, Fisher
    variance gradient) instead of ``loss.backward()``. ``kl_weight`` is a number or a function of the
    global step (e.g. ``lambda s: linear_kl_annealing(s, 1000)``). Returns one dict per epoch with the mean
    loss, NLL (nats), KL (nats) and the KL weight (under the key ``"beta"``).

    ``n_data`` is the training-set size (the number of examples the KL is spread over): any integral number >= 1
    (Python or NumPy integer, 0-d tensor, integer-valued float). A ``ValueError`` names it when a batch, or the
    distinct examples a ``DataLoader`` yields per epoch (sequential or shuffled without replacement), outnumber it;
    a loader that yields no batches in an epoch is a ``ValueError`` too.

    Non-finite values stop training with a :class:`NonFiniteError` that says which (``kind``: ``"data"`` -- NaN/inf
    in a batch's inputs or floating-point targets, checked before the forward pass; ``"loss"``; ``"gradient"`` --
    after ``backward``, before ``optimizer.step``; ``"parameters"`` -- checked before each checkpoint) and where
    (epoch, global step, batch index). The optimizer never steps on a non-finite loss or gradient, and no
    checkpoint with non-finite parameters is written, so the last good checkpoint survives. With
    ``skip_nonfinite=True`` a batch whose loss or gradient is non-finite is skipped instead (gradients dropped, no
    optimizer step, no ``on_step_end``, the step counter not advanced) and counted in each epoch's record as
    ``skipped``; the epoch's means are over the other batches. Non-finite data still raise (the same batch would be
    skipped every epoch), and so does an epoch in which every batch was skipped. On a GPU with fit's default
    optimizer (the fused Adam) and without ``skip_nonfinite``, distributed training, the Graves estimator or adaptive
    priors, the loss and gradient checks do not make the host wait for the device every step: each step's flag is
    computed on the device and handed to the optimizer as ``found_inf`` (a bad step, and every one after it, leaves
    the parameters and the optimizer state unchanged), and the flags are read every 50 steps and at the end of each
    epoch; the error then names the first bad step, and the model is as it was before it, as with per-step checks.
    ``on_step_end`` is called for the steps between the bad one and that read.

    ``checkpoint`` is rewritten (:func:`save_checkpoint`: atomically, with a checksum) after each epoch, once
    ``on_epoch_end`` has returned; ``checkpoint_extra()``, when given, is called then and its dict (plain data) is
    stored in the same file under ``"extra"`` (e.g. a callback's own state, which then stays consistent with the
    epoch; read it back with :func:`read_checkpoint`). With ``resume`` and an existing ``checkpoint`` training
    continues after the last completed epoch, so a killed run loses at most one epoch; a finished checkpoint returns
    its history at once. A checkpoint that is damaged, lacks the ``epoch``/``history``/``model`` entries or holds
    NaN/inf parameters or optimizer state is refused (:class:`CheckpointError`, naming the file). Restored on resume:
    the model, the optimizer state, the step count, the history, and every random state the run draws from --
    Python's ``random``, NumPy's global generator, torch's CPU generator, the CUDA generators of all devices (when
    CUDA was initialised), and the loader's ``torch.Generator`` objects (``loader.generator``, which draws the
    workers' base seed, and ``loader.sampler.generator`` / ``loader.batch_sampler.sampler.generator``, which
    shuffle); all are saved after ``on_epoch_end``, so the resumed run draws exactly what the uninterrupted one
    would, including a callback's random draws and a ``DataLoader(shuffle=True, generator=g)``'s order. The
    sampler's epoch needs no state: ``loader.sampler.set_epoch(epoch)`` is called at every epoch. Not restored:
    other generators a callback or dataset keeps itself, the random state inside ``persistent_workers`` processes
    (non-persistent workers are reseeded from the loader's generator every epoch, so they are reproduced), and, in
    distributed runs, the other ranks' states (the checkpoint holds rank 0's; each rank's weight noise is reseeded
    from it by rank, so a resumed distributed run is not bit-identical to an uninterrupted one).

    ``on_step_end(step, terms)`` runs after every optimizer step (``step`` counts from 1; the parameters'
    ``.grad`` still hold that step's gradients, e.g. for :class:`varbnn.analysis.GradientSNR`). A callback that
    evaluates the model may switch it to eval mode; training mode is restored after it returns.

    ``mc_samples`` (S, default 1): each step's gradient averages S independent weight draws, computed as S
    forward/backward passes accumulated in ``.grad`` (the loss of each is the full one-draw ELBO / S), so memory
    does not grow with S; the logged loss, NLL and KL are the means over the S draws. Not with the Graves estimator
    (it already draws per example).

    ``distributed`` (default: automatic, i.e. whenever :func:`varbnn.distributed.setup` initialised a process group
    of more than one process): the model is wrapped in ``DistributedDataParallel`` (parameters broadcast from rank
    0, gradients averaged), each rank's weight noise is seeded by its rank (:func:`varbnn.distributed.rank_seed`
    of ``torch.initial_seed()``), ``loader.sampler.set_epoch`` is called every epoch, the returned history is
    averaged over the ranks and only rank 0 writes ``checkpoint`` (the unwrapped model's state dict, loadable in a
    single process). The per-rank loss is ``mean NLL of the shard + kl_weight * KL / n_data``, so with averaged gradients
    the KL counts once per global step (see :mod:`varbnn.distributed`). Models with the Graves estimator are not
    wrapped: their gradients (per-example Fisher) are averaged with an all-reduce instead. Non-finite checks are
    agreed on by all ranks (every rank raises, or skips, together).

    ``compile`` (default False): ``True`` runs each step's loss -- the model's forward pass, the NLL (or likelihood)
    and the KL -- through :func:`torch.compile` (inductor), whose backward is compiled with it; on a CUDA device whose
    loader yields batches of one shape (a ``DataLoader`` with ``drop_last=True``, or whose batch size divides the
    dataset) in mode ``"reduce-overhead"``, which records the step in CUDA graphs (on an H200's LeNet-5, like for
    like: MeanField, KTied and Radial steps take 1.57x-1.72x the plain network's step recorded in CUDA graphs too,
    against 1.47x-2.18x compiled without graphs over the plain network compiled without graphs), elsewhere in the
    default mode. A string (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``) is
    passed as its ``mode`` as it is. The KL weight enters as a tensor, so an annealing schedule does not recompile. The
    weight noise is drawn where it is cheapest: inside the compiled kernels, on the CPU by :mod:`varbnn.philox`'s
    counter-based generator (one key per step from torch's generator, so ``torch.manual_seed`` still makes a run
    reproducible; torch's own CPU generator fills a tensor on one thread), on other devices by inductor's. Either is
    another random stream than the eager step's, equal in distribution; RDP's rejection rounds draw from torch's
    generator on the CPU as the eager step does. The first steps are slow (compilation); a new batch
    shape (e.g. a last, smaller batch) compiles once more. Refused (``ValueError``) with the Graves estimator (its
    per-example gradients bypass the loss and its backward), with ``distributed`` training, and with any family whose
    ``compile_unsupported`` says why. Verified against the eager step on the CPU (same seed and the same draws, same
    loss and gradients): MeanField (every estimator but Graves'), KTied, Delta, Radial and RadialDirectional (its
    rejection rounds run as one opaque op).

    ``validation=(x, y)`` (default ``None``: none), a held-out set: after every epoch, before ``on_epoch_end`` (so
    that the callback sees it), its NLL under the model's predictive is added to the epoch's record as ``val_nll``
    (nats per example). By default (``validation_predictive="auto"``) the predictive is :func:`varbnn.predict`'s
    single-pass moment predictive where it can follow the network (chains of MeanField, KTied and Delta layers: one
    pass of about three plain passes' arithmetic; it approximates, see ``predict``), and weight draws otherwise
    (Radial, RDP, MC dropout, ensembles, custom layers); ``"sample"`` always takes the draws. Chosen by the
    validation-predictive study (benchmarks/results/validation-predictive): on the CPU benchmark's MLPs the moment
    predictive stopped MeanField, KTied and IVON at the same or a better epoch, in 0.74-0.92x the seconds on five of
    six pairs (KTied on Fashion-MNIST: 0.99-1.19x, training on to a better epoch). With the
    draws and a likelihood (``likelihood=``, a :class:`~varbnn.likelihoods.Likelihood` passed as
    ``nll``, or the default cross-entropy with class-index targets, read as ``"categorical"``) it is
    :func:`evaluate`'s ``nll``, ``-mean_n log (1/S) sum_s p(y_n | f_s(x_n))`` over ``S = validation_samples`` weight
    draws (a categorical likelihood adds ``val_accuracy``, the accuracy of the mean probabilities); with a custom
    ``nll`` function (or soft-label targets) it is ``mean_s nll(f_s(x), y)``, the draws' mean NLL (an upper bound on the
    predictive's, which fit cannot form from an arbitrary loss). The draws are seeded (seed 0 every epoch, so epochs
    are compared on the same random numbers) in a forked random stream (the global random state, and so the training,
    is exactly as without ``validation``), run in eval mode (every module's training flag is restored afterwards),
    without gradients, ``1000`` examples at a time, on the model's device. A model that does not sample (no Bayesian
    layer in ``sample_mode="sample"``, no :class:`~varbnn.baselines.MCDropout`) takes one pass. Cost per epoch:
    ``validation_samples`` forward passes over ``x`` with the draws (one for a deterministic model, about three for
    the moment predictive). Not available with distributed training yet (a ``ValueError``): evaluate after ``fit``
    instead.

    ``early_stopping=patience`` (an int >= 1; needs ``validation``): training stops after ``patience`` consecutive
    epochs without a new lowest ``val_nll`` (strictly lower; a NaN never improves), and before returning, the model
    (parameters and buffers) and a likelihood's learned parameters are restored to their state at the end of the
    best epoch; so are they when training runs all ``epochs``. The optimizer's state is not restored (it stays the last
    epoch's). With early stopping every record also holds ``best_epoch`` (1-based, the epoch of the lowest ``val_nll``
    so far: the last record's is the epoch restored), and the last record holds ``stopped_early = 1.0`` when patience
    ran out before ``epochs``; the history keeps every epoch trained. Keeping the best state costs one copy of the
    model's state on its device, and in ``checkpoint`` (whose ``"model"`` entry stays the last epoch's, matching the
    optimizer's state) it is stored under ``"early_stopping"`` with the best epoch, its ``val_nll`` and the count of
    epochs since it: a killed run resumed with ``resume=True`` stops at the same epoch and restores the same state,
    and a checkpoint that stopped early returns its history at once, with the best state restored. Resuming a
    checkpoint without that entry (one written without early stopping) starts the count afresh: the best epoch is
    then one of the epochs trained from there on.

    Every finished epoch is also logged at INFO level on the ``varbnn.train`` logger (loss, NLL, KL, beta).

    :param model: the network to train (Bayesian layers from :func:`varbnn.convert.bayesianize` or
        :mod:`varbnn.nn`; a plain network trains as maximum likelihood). Moved to ``device``; trained in place.
    :param loader: an iterable of ``(x, y)`` batches, e.g. a ``torch.utils.data.DataLoader``; iterated once per epoch.
        A ``DataLoader`` that only shuffles (or not) and stacks the rows of a ``TensorDataset`` is read by one index per
        batch instead of one ``__getitem__`` per example (:func:`varbnn.data.batches.fast_batches`): the same batches
        and random draws, so the same training.
    :param n_data: the training-set size N the KL is spread over (not the batch size).
    :param epochs: the number of passes over ``loader`` (total, counting epochs restored by ``resume``).
    :param optimizer: a ready optimizer over the model's parameters (default: Adam with learning rate ``lr``).
    :param lr: the learning rate of the default optimizer (default 1e-3; not used with ``optimizer``).
    :param nll: the data term ``nll(output, target)``, the batch-mean NLL (default ``F.cross_entropy``).
    :param likelihood: a likelihood object or name, used instead of ``nll`` (see above).
    :param kl_weight: the KL weight: a number >= 0, a function of the global step, or ``None`` for the family default
        (its regression default with a regression likelihood).
    :param device: where to train (default ``"model"``: where the model's parameters already are, so a model moved
        to a GPU trains there; ``None`` or ``"auto"``: CUDA when available; or a device such as ``"cpu"`` or ``"cuda"``,
        to which the model is moved).
    :param progress: show an epoch progress bar (default True; it turns itself off when stderr is not a terminal).
    :param checkpoint: a file rewritten after each epoch (default ``None``: none).
    :param resume: continue from ``checkpoint`` when it exists (default False).
    :param overwrite: replace an existing ``checkpoint`` that ``resume`` does not continue (default False: a
        ``ValueError`` before anything is trained, so another run's file is never overwritten by accident; with
        ``overwrite=True`` the file is replaced at the end of the first epoch).
    :param on_epoch_end: ``callback(epoch, record)`` after each epoch (``epoch`` from 1; ``record`` as returned).
    :param on_step_end: ``callback(step, terms)`` after each optimizer step (``terms`` an
        :class:`~varbnn.objectives.ELBOTerms`).
    :param distributed: data-parallel training across a process group (default ``None``: automatic).
    :param mc_samples: weight draws S averaged per step, an int >= 1 (default 1).
    :param skip_nonfinite: skip a batch with a non-finite loss or gradient instead of raising (default False).
    :param checkpoint_extra: a function returning plain data stored in each checkpoint under ``"extra"``.
    :param diagnose: warn (:class:`TrainingWarning`) about a run that went wrong in a way the library can see
        (default True).
    :param compile: compile each step's loss and backward with :func:`torch.compile`: ``True`` (CUDA graphs on a
        GPU when the batches have one shape, see above), or a mode string (default False: eager). The first step
        compiles: on a 2-core CPU 38-96 s for an MNIST MLP the first time, 8-26 s once torch's on-disk cache holds
        the graphs, so that compiling pays after thousands of steps there (the training guide's "Compiled steps").
    :param validation: a held-out ``(x, y)`` whose predictive NLL is recorded after each epoch as ``val_nll`` (default
        ``None``; see above).
    :param validation_samples: weight draws of the validation predictive, an int >= 1 (default 8).
    :param early_stopping: the patience in epochs, an int >= 1, or ``None`` (default: no early stopping); needs
        ``validation``; the best epoch's state is restored (see above).
    :param beta: the earlier name of ``kl_weight`` (a ``FutureWarning``; an error together with ``kl_weight``).
    :param validation_predictive: the validation predictive, as :func:`varbnn.predict`'s ``predictive``:
        ``"auto"`` (default: the one-pass moment predictive for the MeanField, KTied and Delta networks it can
        follow, ``validation_samples`` weight draws for any other), ``"sample"`` (always the draws) or ``"moments"``.

    On return the model is in ``eval()`` mode (dropout off, batch normalisation using its running statistics), so that
    predicting right after training does not update batch-norm statistics from the test inputs; Bayesian layers still
    sample (see :mod:`varbnn.nn.base`). Each epoch switches it back to ``train()``.

    :returns: the history: one dict per epoch (restored ones included) with ``epoch``, the epoch's mean ``loss``,
        ``nll`` and ``kl`` (nats; ``kl`` is the model's total), ``beta`` the KL weight's value after the epoch's last
        step (the next step's weight), ``skipped`` with ``skip_nonfinite``, ``val_nll`` (and ``val_accuracy``) with
        ``validation``, ``best_epoch`` (and on the last record ``stopped_early``) with ``early_stopping``.
    """
    n_data = _training_set_size(n_data)
    epochs = as_int(epochs, "epochs", low=0, owner="fit")
    lr = as_float_in(lr, "lr", 0.0, None, low_open=True, owner="fit")
    mc_samples = as_positive_int(mc_samples, "mc_samples", owner="fit")
    resume = as_bool(resume, "resume", owner="fit")
    overwrite = as_bool(overwrite, "overwrite", owner="fit")
    progress = as_bool(progress, "progress", owner="fit")
    skip_nonfinite = as_bool(skip_nonfinite, "skip_nonfinite", owner="fit")
    diagnose = as_bool(diagnose, "diagnose", owner="fit")
    if distributed is not None:
        distributed = as_bool(distributed, "distributed", owner="fit")
    if not isinstance(model, nn.Module):
        raise TypeError(f"fit: model must be a torch.nn.Module, got {type(model).__name__}")
    _refuse_posthoc_wrappers(model)
    _warn_if_not_sampling(model)
    lik, nll = _data_term(nll, likelihood, n_data)
    kl_weight = kl_weight_alias(kl_weight, beta, None, "fit")
    prior_in_update = bool(getattr(optimizer, "includes_prior", False))
    if prior_in_update:  # e.g. varbnn.optim.IVON: its update holds the prior
        if kl_weight is not None:
            raise ValueError(f"fit: the optimizer {type(optimizer).__name__} includes the prior in its update (its "
                             "kl_weight is set when it is built): leave fit's kl_weight unset")  # fmt: skip
        kl_weight = 0.0
    schedule = _kl_weight_schedule(kl_weight, model, lik if lik is not None else nll)
    per_epoch = _distinct_examples_per_epoch(loader)
    if per_epoch is not None and per_epoch > n_data:
        raise ValueError(
            f"n_data={n_data} is smaller than the {per_epoch} distinct examples the loader yields per epoch: n_data "
            "must be the training-set size (the number of examples the KL is spread over), not a batch size"
        )
    check_batch_size = not _draws_with_replacement(loader)
    distributed = _distributed(distributed)
    watch = validation_watch(validation, validation_samples, early_stopping, nll=nll, likelihood=lik, distributed=distributed,
                             predictive=validation_predictive)  # fmt: skip
    dev = resolve_device(device, model)
    model.to(dev)
    extra_parameters: list[nn.Parameter] = []
    if lik is not None:
        lik.to(dev)
        extra_parameters = [p for p in lik.parameters() if p.requires_grad]
    default_rate = optimizer is None  # fit's own Adam at lr: a resumed state keeps the checkpoint's rate instead
    optimizer = _optimizer(model, optimizer, lr, extra_parameters, lik)
    adaptive = _has_adaptive_prior(model)
    graves = uses_graves_estimator(model)
    _check_graves(graves, extra_parameters, lik, mc_samples)
    compiled_step, mode = None, None
    compiled_shapes: set[tuple[int, ...]] = set()  # the batch shapes the compiled step has met (each compiled once)
    if compile is not False:
        mode = _fit_compile_mode(compile, dev, loader)
        compiled_step = _compiled_elbo_step(model, nll, n_data, dev, mode, graves=graves, distributed=distributed)
    net: nn.Module = model
    if distributed:
        if graves:
            _broadcast_state(model)
        else:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if adaptive:
        update_adaptive_priors(model)
    first_epoch, history, step = _start(checkpoint, resume, overwrite, epochs, model, optimizer, loader, dev, lik,
                                        default_rate)  # fmt: skip
    last = epochs  # (a checkpoint that stopped early: none to train)
    if watch is not None and first_epoch > 0 and checkpoint is not None:
        watch.resume(checkpoint, dev, model, lik)
        last = first_epoch if watch.stopped else epochs
    if distributed:  # every rank its own weight noise (after DDP's broadcast made the parameters equal)
        torch.manual_seed(vdist.rank_seed(torch.initial_seed() + 7919 * (first_epoch + 1)))
    parameters = [*model.parameters(), *extra_parameters]
    # parameters the optimizer steps that DDP does not see (a likelihood's learned noise, anything the caller added):
    # their gradients are averaged across ranks by hand, or the ranks would drift apart
    in_model = {id(p) for p in model.parameters()}
    outside = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in in_model and p.requires_grad]
    # disable=None: tqdm turns the bar off by itself when stderr is not a terminal (a redirected run logs no frames)
    bar = tqdm(range(first_epoch, last), desc="epochs", disable=None if progress else True, leave=False,
               initial=first_epoch, total=epochs)  # fmt: skip
    seen_labels: list[torch.Tensor] = []  # a few batches' class labels: the NLL of their marginal, for _diagnose
    # off the CPU, the loss and gradient checks run without waiting for the device (see _DeferredChecks)
    deferred = _DeferredChecks.applies(dev, optimizer, distributed or graves or skip_nonfinite or adaptive)
    named = [*model.named_parameters(), *((f"likelihood.{n}", p) for n, p in (lik.named_parameters() if lik else ())
                                          if any(p is q for q in extra_parameters))]  # what `parameters` holds
    checks = _DeferredChecks(dev, named) if deferred else None
    for epoch in bar:
        model.train()
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        totals = {"loss": 0.0, "nll": 0.0, "kl": 0.0}
        batches = used = skipped = 0
        distinct: set[tuple[int, int, int]] = set()  # (storage, offset, count): the same batch yielded again counts once
        try:
            for batch in fast_batches(loader):  # a DataLoader over a TensorDataset: the same batches by one index each
                x, y = check_batch(batch, batches, "fit")
                if diagnose and len(seen_labels) < _DIAGNOSE_LABEL_BATCHES and _class_labels(y):
                    seen_labels.append(y.detach().reshape(-1).to("cpu", torch.long))
                where = f"epoch {epoch + 1}, step {step + 1} (batch index {batches} of the epoch)"
                batches += 1
                if per_epoch is None and epoch == first_epoch and x.dim() > 0:
                    distinct.add((x.untyped_storage().data_ptr(), int(x.storage_offset()), int(x.shape[0])))
                kind, detail = None, _nonfinite_data(x, y)  # before the transfer: no wait on the device for a CPU batch
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                if check_batch_size and x.dim() > 0 and x.shape[0] > n_data:
                    raise ValueError(
                        f"n_data={n_data} is smaller than one batch ({x.shape[0]} examples at {where}): n_data must be "
                        "the training-set size (the number of examples the KL is spread over), not a batch size"
                    )
                if detail is not None:
                    kind = "data"
                    if not distributed:
                        raise _nonfinite_error(kind, detail, where, epoch + 1, step + 1, batches - 1, skip_nonfinite)
                optimizer.zero_grad(set_to_none=True)
                if graves:
                    terms = graves_gradients(model, x, y, n_data=n_data, nll=nll, kl_weight=schedule(step))
                    if distributed:
                        vdist.all_reduce_mean_([p.grad for p in model.parameters() if p.grad is not None])
                elif compiled_step is not None:
                    terms = _compiled_terms(compiled_step, compiled_shapes, mode, bar, x, y, schedule(step), mc_samples)
                else:
                    weight = None if prior_in_update else schedule(step)  # None: the NLL alone (no KL graph)
                    terms = _accumulated_elbo_gradient(net, model, x, y, nll, n_data, weight, mc_samples)
                if distributed and outside:
                    _average_outside_gradients(outside, dev)
                if checks is not None:  # the checks and the sums on the device; one read every _DeferredChecks.EVERY steps
                    checks.step(terms, optimizer, where, epoch + 1, step + 1, batches - 1)
                    if on_step_end is not None:
                        on_step_end(step + 1, terms)
                        model.train()
                    used += 1
                    step += 1
                    if len(checks.window) >= checks.EVERY:
                        checks.check()
                    continue
                loss = float(terms.loss.detach())
                kind, detail = _step_problem(kind, detail, loss, terms, model, parameters, distributed, dev)
                if kind is not None:
                    if kind == "data" or not skip_nonfinite:
                        raise _nonfinite_error(kind, str(detail), where, epoch + 1, step + 1, batches - 1, skip_nonfinite)
                    optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                optimizer.step()
                if adaptive:
                    update_adaptive_priors(model)
                if on_step_end is not None:
                    on_step_end(step + 1, terms)
                    model.train()
                totals["loss"] += loss
                totals["nll"] += float(terms.nll)
                totals["kl"] += float(terms.kl)
                used += 1
                step += 1
        except BaseException as error:  # (a bad step in the deferred window is reported first)
            if checks is not None:  # (after check() itself raised, its window is empty: nothing more to report)
                checks.pending(error)
            raise
        _check_epoch(epoch, step, batches, used, distinct, n_data,
                     counted=per_epoch is None and check_batch_size and not distributed)  # fmt: skip
        if checks is not None:
            checks.check()
            totals = checks.take_totals()
        record: dict[str, float] = {k: v / used for k, v in totals.items()}
        if prior_in_update and compiled_step is None and not graves:  # the steps took no KL: the epoch's last
            with torch.no_grad():
                record["kl"] = float(model_kl(model))
        if distributed:
            means = torch.tensor([record["loss"], record["nll"], record["kl"]], dtype=torch.float64, device=dev)
            vdist.all_reduce_mean_([means])
            record.update(loss=float(means[0]), nll=float(means[1]), kl=float(means[2]))
        record.update(epoch=epoch + 1, beta=float(schedule(step)))
        if skip_nonfinite:
            record["skipped"] = skipped
        stop = watch is not None and watch.after_epoch(epoch + 1, epochs, record, model, lik)  # val_nll; best_epoch
        history.append(record)
        logger.info("epoch %d/%d: loss %.6g, nll %.6g, kl %.6g, beta %.4g", epoch + 1, epochs, record["loss"],
                    record["nll"], record["kl"], record["beta"])  # fmt: skip
        bar.set_postfix(loss=f"{record['loss']:.4f}", nll=f"{record['nll']:.4f}", kl=f"{record['kl']:.4g}")
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, record)
        _save_epoch(checkpoint, model, optimizer, epoch + 1, history, step, loader, lik, checkpoint_extra,
                    watch.checkpoint_entry() if watch is not None else None)  # fmt: skip
        if stop:
            bar.close()  # (tqdm closes a bar it ran to its end by itself)
            break
    if compiled_step is not None and mode is not None and _uses_cudagraphs(mode, dev):
        # the last step's gradients live in the CUDA graphs' memory, which the next compiled graph to run (another
        # fit's) overwrites: drop them rather than leave .grad tensors that fail when read later
        optimizer.zero_grad(set_to_none=True)
    if watch is not None:
        watch.restore(model, lik)  # early stopping: the best epoch's state
    model.eval()  # predict/evaluate right after fit: batch norm uses its running statistics, dropout is off
    if diagnose and history and first_epoch < last and vdist.is_main_process():
        _diagnose(model, history, n_data, _label_entropy(seen_labels))
    return history


def _check_epoch(
    epoch: int, step: int, batches: int, used: int, distinct: set[tuple[int, int, int]], n_data: int, *, counted: bool
) -> None:
    """After an epoch: a loader that yielded nothing, an epoch whose every batch was skipped, or (``counted``: a loader
    whose size is not known before, in its first epoch) more distinct examples than ``n_data``, each a clear error."""
    if batches == 0:
        raise ValueError(
            f"the loader yielded no batches in epoch {epoch + 1}: nothing to train on (an empty dataset, or "
            "batch_size larger than the dataset with drop_last=True?)"
        )
    if used == 0:
        raise NonFiniteError(
            f"every batch of epoch {epoch + 1} ({batches}) had a non-finite loss or gradient and was skipped "
            "(skip_nonfinite=True): the model or the optimisation has diverged",
            kind="loss",
            epoch=epoch + 1,
            step=step + 1,
        )
    examples = sum(count for _, _, count in distinct)
    if counted and examples > n_data:  # (first epoch only: the set is filled then)
        raise ValueError(
            f"n_data={n_data} is smaller than the {examples} distinct examples the loader yielded in epoch "
            f"{epoch + 1}: n_data must be the training-set size (the number of examples the KL is spread over)"
        )


def _save_epoch(
    checkpoint: str | os.PathLike[str] | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    history: list[dict[str, float]],
    step: int,
    loader: object,
    lik: Likelihood | None,
    checkpoint_extra: Callable[[], dict[str, Any]] | None,
    early_stopping: dict[str, Any] | None = None,
) -> None:
    """The end of epoch ``epoch`` (1-based): non-finite parameters are an error (the last checkpoint is kept); else the
    checkpoint is rewritten (rank 0 only) with the history, the step, the random states, the extras and the
    ``early_stopping`` entry (when given)."""
    bad = _nonfinite_names(model.named_parameters())
    if bad:
        raise NonFiniteError(
            f"non-finite parameters after epoch {epoch}: {_listing(bad)} hold NaN or inf"
            + (f"; checkpoint {checkpoint} keeps the last good epoch" if checkpoint is not None else ""),
            kind="parameters",
            epoch=epoch,
        )
    if checkpoint is not None and vdist.is_main_process():
        extra: dict[str, Any] = {"extra": checkpoint_extra()} if checkpoint_extra is not None else {}
        if lik is not None:
            extra["likelihood"] = lik.state_dict()
        if early_stopping is not None:
            extra["early_stopping"] = early_stopping
        save_checkpoint(checkpoint, model, optimizer, epoch=epoch, history=history, step=step, rng=_rng_state(loader),
                        **extra)  # fmt: skip


def _average_outside_gradients(outside: Sequence[torch.Tensor], dev: torch.device) -> None:
    """Average across ranks the gradients of parameters DDP does not see (a likelihood's learned noise, ...); a
    parameter no rank has a gradient for keeps none (the optimizer skips it)."""
    has = torch.tensor([p.grad is not None for p in outside], dtype=torch.float32, device=dev)
    vdist.all_reduce_mean_([has])
    for p in outside:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    vdist.all_reduce_mean_([cast(torch.Tensor, p.grad) for p in outside])
    for p, anyone in zip(outside, has.tolist()):
        if anyone == 0:
            p.grad = None


def _step_problem(
    kind: str | None,
    detail: str | None,
    loss: float,
    terms: ELBOTerms,
    model: nn.Module,
    parameters: Sequence[torch.Tensor],
    distributed: bool,
    dev: torch.device,
) -> tuple[str | None, str | None]:
    """The step's problem ``(kind, detail)``, checked on the host: bad data (already known), a non-finite loss or
    gradient; in distributed training agreed on by every rank."""
    if kind is None and not math.isfinite(loss):
        kind, detail = "loss", _loss_detail(loss, float(terms.nll), float(terms.kl))
    if kind is None and not _gradients_finite(parameters):
        names = _nonfinite_names((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
        kind, detail = "gradient", _gradient_detail(names, loss)
    if distributed:
        flags = torch.tensor([kind == k for k in _KINDS], dtype=torch.float32, device=dev)
        vdist.all_reduce_mean_([flags])
        if kind is None and bool((flags > 0).any()):
            kind = _KINDS[int((flags > 0).nonzero()[0, 0])]
            detail = f"another rank met a non-finite {kind}"
    return kind, detail


def _compiled_terms(
    compiled_step: Callable[[torch.Tensor, torch.Tensor, float, int], ELBOTerms],
    compiled_shapes: set[tuple[int, ...]],
    mode: str | None,
    bar: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    beta: float,
    mc_samples: int,
) -> ELBOTerms:
    """One compiled step; the first of each batch shape (which compiles) is announced on the bar and the logger."""
    compiling = tuple(x.shape) not in compiled_shapes  # a first step, or a new batch shape: compiles
    if compiling:  # (torch.compile compiles again for a second shape, then one graph for any shape)
        bar.set_postfix_str("compiling the step" if not compiled_shapes else "a new batch shape")
        logger.info("first training step with batches of shape %s: torch.compile (mode %r) %s (on a "
                    "CPU, a minute or more the first time)", tuple(x.shape), mode,
                    "compiles the step first" if not compiled_shapes
                    else "may compile the step again for it")  # fmt: skip
        began = time.perf_counter()
    terms = compiled_step(x, y, beta, mc_samples)
    if compiling:
        compiled_shapes.add(tuple(x.shape))
        logger.info("the first training step with batches of shape %s took %.1f s (its compilation "
                    "included)", tuple(x.shape), time.perf_counter() - began)  # fmt: skip
        bar.set_postfix_str("")
    return terms


def _refuse_posthoc_wrappers(model: nn.Module) -> None:
    """Wrappers whose training is not one fit of their forward pass get a clear error instead of a silent wrong run:
    the classes that say so with a ``_varbnn_fit_refusal`` message (:class:`~varbnn.baselines.DeepEnsemble`,
    :class:`~varbnn.laplace.LastLayerLaplace`), declared on the class so that the loop imports neither."""
    refusal = getattr(type(model), "_varbnn_fit_refusal", None)
    if refusal:
        raise ValueError(refusal)


def _accumulated_elbo_gradient(
    net: nn.Module,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    nll: NLLFunction,
    n_data: int,
    beta: float | None,
    samples: int,
) -> ELBOTerms:
    """``samples`` one-draw ELBO gradients averaged into ``.grad`` (one backward per draw; DDP all-reduces once);
    ``beta=None``: the NLL's gradients alone, without building the KL (an optimizer that includes the prior)."""
    import contextlib

    parts = []
    for s in range(samples):
        last = s == samples - 1
        no_sync = getattr(net, "no_sync", None)
        context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with context:
            if beta is None:
                value = nll(net(x), y)
                terms = ELBOTerms(loss=value, nll=value.detach(), kl=torch.zeros((), device=value.device),
                                  kl_weight=0.0, n_data=n_data)  # fmt: skip
            else:
                terms = elbo_loss(nll(net(x), y), model, n_data, kl_weight=beta)
            (terms.loss / samples if samples > 1 else terms.loss).backward()
        parts.append(terms)
    if samples == 1:
        return parts[0]
    mean = lambda values: torch.stack(values).mean()  # noqa: E731
    return ELBOTerms(loss=mean([t.loss.detach() for t in parts]), nll=mean([t.nll for t in parts]),
                     kl=mean([t.kl for t in parts]), kl_weight=float(beta or 0.0), n_data=n_data)  # fmt: skip


@torch.no_grad()
def _broadcast_state(model: nn.Module) -> None:
    """Make every rank's parameters and buffers equal to rank 0's (what DDP does at construction)."""
    import torch.distributed as dist

    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)
