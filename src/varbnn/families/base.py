"""The family interface shared by every posterior."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn.divergence import family_kl

if TYPE_CHECKING:
    from varbnn.ops import WeightOp
    from varbnn.priors import Prior

__all__ = ["VariationalFamily", "SampleMode", "SAMPLE_MODES", "FAMILIES", "register_family", "make_family", "he_normal_"]

SampleMode = Literal["sample", "mean", "mode"]
"""How a layer gets its weights: ``"sample"`` (a fresh draw from q), ``"mean"`` (E_q[W]) or ``"mode"`` (argmax q)."""
SAMPLE_MODES: tuple[str, ...] = ("sample", "mean", "mode")
"""The values of :data:`SampleMode`, for argument checks."""
LAYER_KINDS = ("linear", "conv1d", "conv2d", "conv3d", "embedding", "lstm", "gru")
"""The ``layer_kind`` of every Bayesian layer; ``estimator_layers`` tables name the kinds each estimator runs in."""
_LAYER_KIND_NOTES = {
    "lstm": " (local reparameterization and flipout would draw new weights at every time step)",
    "gru": " (local reparameterization and flipout would draw new weights at every time step)",
    "embedding": " (flipout flips the signs of input features, and an embedding's input is an index)",
}

F = TypeVar("F", bound="VariationalFamily")

CAPABILITY_METHODS: dict[str, tuple[str, ...]] = {
    "has_normal_kl_parts": ("kl",),
    "softplus_group": ("scale", "rsample", "_scale_stats", "_fused_sample"),
    "has_fused_sample": ("scale", "_scale_stats"),
    "has_plain_scale": ("_scale_stats",),
    "independent_elements": ("moments", "rsample", "weight", "forward_op"),
}
"""For each boolean capability of :class:`VariationalFamily`, the members whose behaviour it vouches for. A subclass
that defines one of them in its own class body without also setting the capability there gets the capability
``False`` (the safe path), whatever its base class declared: ``class MyMeanField(MeanField)`` that overrides ``kl``
has its own ``kl`` called by :func:`varbnn.kl`, not MeanField's batched closed form. A subclass that keeps the fast
path after such an override says so by setting the capability in its body (as KTied does for ``softplus_group``)."""


def he_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """He (Kaiming) normal initialisation, std = sqrt(2 / fan_in), fan_in = prod(shape[1:])."""
    fan_in = math.prod(tensor.shape[1:]) if tensor.dim() > 1 else 1
    with torch.no_grad():
        return tensor.normal_(0.0, math.sqrt(2.0 / fan_in))


_EXTRA_STATE = "_extra_state"  # torch's key suffix for a module's get_extra_state() in its state dict


def family_of_state(entry: Any) -> str | None:
    """The family name that :meth:`VariationalFamily.get_extra_state` saved (``None`` for anything else)."""
    if not isinstance(entry, torch.Tensor) or entry.dim() != 1 or entry.is_complex() or entry.dtype == torch.bool:
        return None
    codes = entry.tolist()  # any real dtype (a state dict converted with {k: v.float()} still names its family)
    if not all(float(c).is_integer() and 0 <= c <= 255 for c in codes):
        return None
    return bytes(int(c) for c in codes).decode("utf-8", errors="replace")


class VariationalFamily(nn.Module):
    """A variational posterior q over one weight tensor of a known shape.

    Unbuilt (as constructed by the user) it holds hyperparameters only; :meth:`build` returns a new,
    materialised instance owning the parameters. Subclasses declare which estimators they offer in
    ``estimators`` and which layer kinds each estimator supports in ``estimator_layers``.
    """

    estimators: ClassVar[tuple[str, ...]] = ("reparam",)
    """The ``estimator`` values this family accepts (``"reparam"``: one reparameterised draw per forward pass)."""
    estimator_layers: ClassVar[dict[str, tuple[str, ...]]] = {"reparam": LAYER_KINDS}
    """For each estimator, the layer kinds it runs in (``"linear"``, ``"conv2d"``, ``"lstm"``, ...)."""
    estimator: str = "reparam"
    """The estimator this instance uses (one of :attr:`estimators`)."""
    default_kl_weight: ClassVar[float] = 1.0
    """The KL weight beta that :func:`varbnn.train.fit` uses when given none (``beta=None``): chosen on validation
    data by ``benchmarks/defaults_study.py`` (see its results page); 1 is the true ELBO."""
    default_regression_kl_weight: ClassVar[float | None] = None
    """The KL weight :func:`varbnn.train.fit` uses when given none with a regression likelihood (a
    :class:`~varbnn.likelihoods.Likelihood` whose ``task`` is ``"regression"``, e.g.
    :class:`~varbnn.likelihoods.Gaussian`): chosen on regression validation data by
    ``benchmarks/regression_defaults.py`` (``benchmarks/results/regression-defaults/``); ``None`` (the default):
    :attr:`default_kl_weight`. No family sets one yet: on that study's validation data MeanField's best weight is
    0.01 with early stopping but 0.3 without (and KTied's 0.01 with it), so no single value beats the classification
    default on both paths."""

    compile_unsupported: ClassVar[str | None] = None
    """Why ``fit(compile=True)`` refuses models holding this family (``None``: its compiled step is tested to equal
    the eager one). A family sets it until its compiled step is verified."""
    point_mass: ClassVar[bool] = False
    """Whether q is a point mass at its one parameter (:class:`~varbnn.families.Delta`, which sets it ``True``): an
    adaptive :class:`~varbnn.priors.Laplace` prior has a closed-form optimum only for such posteriors (Graves 2011
    eq. 7), and checks this declaration instead of the family's type."""

    # -- capabilities: the fast paths a family declares, as torch.distributions' ``has_rsample`` --------------------
    # (each is reset to False for a subclass that overrides what it vouches for without setting it: CAPABILITY_METHODS)
    independent_elements: ClassVar[bool] = False
    """Whether the tensor's elements are independent under q with the mean and variance :meth:`moments` returns, so
    that :mod:`varbnn.moments` may propagate them layer by layer: declared by MeanField (KTied too: its std matrix is
    low rank, its elements independent) and Delta; not Radial or RDP, whose draws share one radius or direction.
    ``False`` for a subclass that overrides ``moments``, ``rsample``, ``weight`` or ``forward_op`` without setting it."""
    has_normal_kl_parts: ClassVar[bool] = True
    """Whether :func:`varbnn.kl` of a model may take this tensor's KL from the
    :class:`~varbnn.divergence.NormalKLParts` registered with its closed form
    (:func:`~varbnn.divergence.register_family_kl`'s ``parts``, where one is registered and applies) and sum it with
    other tensors' in one node, instead of calling :meth:`kl`. True here, where :meth:`kl` is that registered closed
    form; ``False`` for a subclass that overrides ``kl`` without setting it."""
    softplus_group: ClassVar[bool] = False
    """Whether this family's ``sigma = softplus(rho)`` statistics may be computed with those of the model's other such
    tensors in one node per training step (:class:`~varbnn._fast.softplus.SoftplusGroup`; the draw ``loc + sigma *
    eps`` from them). Declared by MeanField, KTied (its untied tensors) and Radial; the instance's state may still keep
    a tensor out (:meth:`_softplus_group_eligible`). ``False`` for a subclass that overrides ``scale``, ``rsample``,
    ``_scale_stats`` or ``_fused_sample`` without setting it."""
    has_fused_sample: ClassVar[bool] = False
    """Whether a training step's first draw goes through one node that also outputs sigma's statistics for the KL
    (:func:`~varbnn._fast.softplus.fused_sample`). Declared by MeanField, KTied and Radial; ``False`` for a subclass
    that overrides ``scale`` or ``_scale_stats`` without setting it (it draws from its own ``scale``)."""
    has_plain_scale: ClassVar[bool] = False
    """Whether, outside training steps, the family's sigma is its ``_plain_scale()`` alone, without the statistics
    node (MeanField, KTied). ``False`` for a subclass that overrides ``_scale_stats`` without setting it (another
    parameterisation of sigma: its ``_scale_stats`` serves outside training steps too)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Reset to ``False`` each capability (:data:`CAPABILITY_METHODS`) whose members the new class overrides
        without setting the capability in its own body."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for capability, members in CAPABILITY_METHODS.items():
            if capability not in own and any(name in own for name in members):
                setattr(cls, capability, False)

    @property
    def share_sigma_in_trace(self) -> bool:
        """Whether a compiled training step computes this tensor's sigma once for the forward pass and the KL
        (:func:`~varbnn._fast.softplus.share_sigmas_in_trace`; default ``False``: inductor recomputes an elementwise
        sigma inside each kernel that reads it). KTied's tied tensors (a GEMM) say ``True``."""
        return False

    def _softplus_group_eligible(self) -> bool:
        """Whether this built tensor joins its model's :class:`~varbnn._fast.softplus.SoftplusGroup` now: the class
        declares :attr:`softplus_group`, and (in the families that declare it) the instance's state allows it."""
        return self.softplus_group

    @property
    def inductor_options(self) -> dict[str, Any]:
        """Inductor options this family's compiled CPU step runs faster with (``fit(compile=...)`` merges those of a
        model's families; default: none)."""
        return {}

    def __init__(self, **hyperparameters: Any) -> None:
        super().__init__()
        self._hyperparameters = dict(hyperparameters)
        self.shape: torch.Size | None = None

    # -- construction ---------------------------------------------------------------------------------
    def build(self: F, shape: torch.Size | tuple[int, ...], init: torch.Tensor | None = None) -> F:
        """A new instance of this family, with parameters for a tensor of ``shape``.

        ``init`` gives the initial mean (e.g. He-initialised or copied from a pretrained weight); without it
        the mean is He-initialised (zeros for 1-d tensors such as biases).
        """
        shape = torch.Size(shape)
        if init is None:
            init = he_normal_(torch.empty(shape)) if len(shape) > 1 else torch.zeros(shape)
        elif init.shape != shape:
            raise ValueError(f"{type(self).__name__}.build: init has shape {tuple(init.shape)}, expected {tuple(shape)}")
        built = type(self)(**self._hyperparameters)
        built.shape = shape
        built._materialize(shape, init.detach().clone())
        return built

    def for_trained_weights(self: F) -> F:
        """The family :func:`varbnn.convert.bayesianize` builds with when it copies a trained network's weights into
        the posterior means (``pretrained=True``): this one, unless the family's default initial width was chosen for
        training from scratch and a narrower start around trained weights measured better (e.g.
        :class:`~varbnn.families.RadialDirectional`'s ``init_resultant``). An option the user set is never changed."""
        return self

    @property
    def is_built(self) -> bool:
        """Whether this instance owns parameters (built by :meth:`build`) rather than being a hyperparameter spec."""
        return self.shape is not None

    def _require_built(self) -> torch.Size:
        if self.shape is None:
            raise RuntimeError(f"{type(self).__name__} is an unbuilt family spec; pass it to a layer (or call .build(shape))")
        return self.shape

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        raise NotImplementedError

    def adapt_to_prior(self, prior: Any) -> None:
        """Adjust a built family's initial parameters to the prior it will be paired with (a no-op here). Layers call
        it right after building each tensor; call it yourself when you build a family by hand."""

    def check_layer(self, layer_kind: str) -> None:
        """Raise a clear error if this family's estimator cannot run inside a ``layer_kind`` layer."""
        allowed = self.estimator_layers.get(self.estimator, ())
        if layer_kind not in allowed:
            supported = [e for e, layers in self.estimator_layers.items() if layer_kind in layers]
            raise ValueError(
                f"{type(self).__name__}(estimator={self.estimator!r}) is not supported in {layer_kind} layers; "
                f"estimators allowed there: {supported}" + _LAYER_KIND_NOTES.get(layer_kind, "")
            )

    # -- saving -----------------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """Saved in the state dict beside the parameters (key ``..._extra_state``): the family's class name, so that
        a state dict loads only into a model built with the same family. MeanField's and Radial's parameters, for
        instance, have the same names and shapes: without it torch would load one into the other silently, and the
        model would sample another distribution than the one trained. Stored as a 1-d uint8 tensor of the name's
        UTF-8 bytes (:func:`family_of_state` reads it back), so that code which treats every state-dict entry as a
        tensor (``{k: v.clone() ...}``, ``torch.equal``, ``.to(device)``) keeps working."""
        return torch.tensor(list(type(self).__name__.encode("utf-8")), dtype=torch.uint8)

    def set_extra_state(self, state: Any) -> None:
        """Nothing to restore: the family was checked in :meth:`_load_from_state_dict`."""

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        if self._refuse_other_family(state_dict, prefix, error_msgs):
            return  # this tensor's parameters are not loaded
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        key = prefix + _EXTRA_STATE
        if key in missing_keys:  # a state dict saved before the family was recorded: loads as it did then
            missing_keys.remove(key)

    def _refuse_other_family(self, state_dict: dict[str, Any], prefix: str, error_msgs: list[str]) -> bool:
        """Whether the state dict records another family for this tensor (an error message added): a subclass's
        instance takes its base classes' states (a ``class MyMeanField(MeanField)`` loads a MeanField's), not the
        other way round. Subclasses that load more than parameters call it before changing anything."""
        family = family_of_state(state_dict.get(prefix + _EXTRA_STATE))
        if family is None or family in {cls.__name__ for cls in type(self).__mro__}:
            return False
        error_msgs.append(
            f"{prefix.rstrip('.') or 'the posterior'}: the state dict holds a {family} posterior, the model a "
            f"{type(self).__name__} (their parameters mean different distributions); build the model with the family "
            "it was trained with"
        )
        return True

    # -- the distribution -------------------------------------------------------------------------------
    def distribution(self) -> Distribution:
        """q as a torch distribution whose event is the whole tensor."""
        raise NotImplementedError

    @property
    def mean(self) -> torch.Tensor:
        """E_q[W], a tensor of the weight's shape (what ``sample_mode(model, "mean")`` runs the layer with)."""
        raise NotImplementedError

    @property
    def mode(self) -> torch.Tensor:
        """argmax_W q(W), a tensor of the weight's shape: the ``w*`` of Graves' (2011, section 6) maximum a posteriori
        approximation ``p(y | x, w*)`` of the predictive."""
        raise NotImplementedError

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Elementwise (mean, variance) of q, for families that have them in closed form."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form moments")

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        """Reparameterised samples of shape ``sample_shape + shape``."""
        self._require_built()
        return self.distribution().rsample(torch.Size(sample_shape))

    def weight(self, mode: SampleMode = "sample") -> torch.Tensor:
        """One sample (``"sample"``), the posterior mean (``"mean"``) or its mode (``"mode"``)."""
        if mode == "sample":
            return self.rsample()
        if mode == "mean":
            return self.mean
        if mode == "mode":
            return self.mode
        raise ValueError(f"mode must be one of {SAMPLE_MODES}, got {mode!r}")

    def kl(self, prior: Prior) -> torch.Tensor:
        """KL(q || prior), summed over the tensor (nats): a fused closed form registered for the pair with
        :func:`varbnn.divergence.register_family_kl`, else the distribution-level registry / Monte Carlo."""
        self._require_built()
        return family_kl(self, prior)

    def take_score(self) -> torch.Tensor | None:
        """A score-function term of the last draw (value 0) whose gradient, times the loss, corrects a biased
        pathwise gradient (e.g. vMF rejection sampling); cleared once taken. ``None`` for exact estimators."""
        return None

    @property
    def num_variational_parameters(self) -> int:
        """Number of variational parameters this tensor's posterior owns."""
        self._require_built()
        return sum(p.numel() for p in self.parameters())

    # -- inside a layer ---------------------------------------------------------------------------------
    def forward_op(
        self,
        op: WeightOp,
        x: torch.Tensor,
        bias: VariationalFamily | None,
        mode: SampleMode = "sample",
    ) -> torch.Tensor:
        """``op(x, W, b)`` with W (and b) drawn from the posteriors; families override for fast estimators.

        The layer's output for input ``x``: ``op`` is the layer's weight-linear operation
        (:class:`~varbnn.ops.WeightOp`), ``bias`` the bias's family (or ``None``), ``mode`` the :data:`SampleMode`.
        Here one weight (and bias) per call, ``op(x, self.weight(mode), bias.weight(mode))``; the Gaussian families
        draw the outputs instead with ``estimator="local"`` or ``"flipout"`` (see :class:`~varbnn.families.MeanField`).
        """
        return op(x, self.weight(mode), bias.weight(mode) if bias is not None else None)

    def extra_repr(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self._hyperparameters.items())
        shape = f"shape={tuple(self.shape)}" if self.shape is not None else "unbuilt"
        return f"{shape}, {hp}" if hp else shape


FAMILIES: dict[str, type[VariationalFamily]] = {}
"""Every family by the name configs and the CLI use (``"delta"``, ``"meanfield"``, ``"ktied"``, ``"radial"``,
``"rdp"``, and any added with :func:`register_family`)."""


def register_family(name: str):  # type: ignore[no-untyped-def]
    """Class decorator adding a family to :data:`FAMILIES` under ``name`` (for configs and the CLI)."""

    def decorator(cls: type[VariationalFamily]) -> type[VariationalFamily]:
        FAMILIES[name] = cls
        return cls

    return decorator


def make_family(name: str, **kwargs: Any) -> VariationalFamily:
    """An unbuilt family spec by name: ``FAMILIES[name](**kwargs)``. Allowed names: the keys of :data:`FAMILIES`;
    another name raises a ``ValueError`` listing them."""
    try:
        cls = FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family name {name!r}; allowed: {sorted(FAMILIES)}") from None
    return cls(**kwargs)
