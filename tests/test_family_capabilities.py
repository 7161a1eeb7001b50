"""A family's fast paths are capabilities declared on its class (``has_normal_kl_parts``, ``softplus_group``,
``has_fused_sample``, ``has_plain_scale``), as torch.distributions declares ``has_rsample``: a subclass that overrides
what a capability vouches for, without declaring it again, takes the safe path (its own ``kl``, its own sigma)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import varbnn
from varbnn.families import Delta, KTied, MeanField, Radial, RadialDirectional, VariationalFamily
from varbnn.families.base import CAPABILITY_METHODS
from varbnn.nn import BayesLinear

CAPABILITIES = ("has_normal_kl_parts", "softplus_group", "has_fused_sample", "has_plain_scale", "independent_elements")


class OwnKL(MeanField):
    """A MeanField whose KL is its own: twice the closed form, so that MeanField's batched form would be visibly off."""

    def kl(self, prior):  # type: ignore[no-untyped-def]
        return 2 * super().kl(prior)


class OwnKLDeclared(OwnKL):
    """The same override, declaring that the registered parts still stand in for it (they do not: the declaration
    is trusted, which shows that the declaration is what decides)."""

    has_normal_kl_parts = True


class Shifted(MeanField):
    """Another sigma: softplus(rho) + 0.5."""

    @property
    def scale(self) -> torch.Tensor:
        return F.softplus(self.rho) + 0.5


class ShiftedRadial(Radial):
    @property
    def scale(self) -> torch.Tensor:
        return F.softplus(self.rho) + 0.5


class ExpTied(KTied):
    """A KTied whose statistics are another node's: none of MeanField's (or KTied's) sigma paths apply."""

    def _scale_stats(self, with_square=False):  # type: ignore[no-untyped-def]
        return super()._scale_stats(with_square)


def test_the_library_families_declare_their_fast_paths():
    table = {cls: tuple(getattr(cls, name) for name in CAPABILITIES)
             for cls in (VariationalFamily, Delta, MeanField, KTied, Radial, RadialDirectional)}  # fmt: skip
    assert table == {
        VariationalFamily: (True, False, False, False, False),
        Delta: (True, False, False, False, True),
        MeanField: (True, True, True, True, True),
        KTied: (True, True, True, True, True),
        Radial: (True, True, True, False, False),
        RadialDirectional: (True, False, False, False, False),
    }
    assert set(CAPABILITY_METHODS) == set(CAPABILITIES)


def test_a_subclass_overriding_kl_gets_its_own_kl_not_the_batched_closed_form():
    """``kl(model)`` sums the NormalKLParts of MeanField tensors in one node; a subclass with its own ``kl`` has it
    called (twice the closed form here), unless it declares ``has_normal_kl_parts`` again."""
    torch.manual_seed(0)
    plain = BayesLinear(5, 4, family=MeanField(init_std=0.1))
    own = BayesLinear(5, 4, family=OwnKL(init_std=0.1))
    declared = BayesLinear(5, 4, family=OwnKLDeclared(init_std=0.1))
    own.load_state_dict(plain.state_dict())  # the same loc and rho (a subclass loads its base class's state)
    declared.load_state_dict(plain.state_dict())
    assert not OwnKL.has_normal_kl_parts and OwnKLDeclared.has_normal_kl_parts
    reference = varbnn.kl(plain)
    torch.testing.assert_close(varbnn.kl(nn.Sequential(own)), 2 * reference)
    torch.testing.assert_close(varbnn.kl(nn.Sequential(declared)), reference)  # the declaration is trusted
    # the gradient follows the subclass's kl too
    varbnn.kl(nn.Sequential(own)).backward()
    reference_grad = torch.autograd.grad(varbnn.kl(nn.Sequential(plain)), plain.posteriors["weight"].rho)[0]
    torch.testing.assert_close(own.posteriors["weight"].rho.grad, 2 * reference_grad)


@pytest.mark.parametrize("family", [Shifted, ShiftedRadial], ids=["meanfield", "radial"])
def test_a_subclass_with_its_own_sigma_leaves_the_softplus_paths(family):
    """Overriding ``scale`` withdraws ``softplus_group`` and ``has_fused_sample``: the tensor joins no SoftplusGroup
    after ``kl(model)``, and a training step's first draw is ``loc + scale * noise`` with its own ``scale`` (the fused
    draw would take softplus(rho), 0.5 less)."""
    assert not family.softplus_group and not family.has_fused_sample
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(6, 5, family=family()), BayesLinear(5, 3, family=family()))
    varbnn.kl(model).backward()  # makes the model's SoftplusGroup, if any tensor were eligible
    posteriors = [m for m in model.modules() if isinstance(m, family)]
    assert len(posteriors) == 4 and all("_softplus_group" not in p.__dict__ for p in posteriors)
    posterior = model[0].posteriors["weight"]
    torch.manual_seed(1)
    draw = posterior.rsample()  # a recorded step's first draw (rho requires grad)
    torch.manual_seed(1)
    noise = posterior._noise(torch.Size()) if family is ShiftedRadial else torch.randn(posterior.loc.shape)
    assert draw.requires_grad
    torch.testing.assert_close(draw, torch.addcmul(posterior.loc, posterior.scale, noise), rtol=0, atol=0)


def test_a_ktied_subclass_with_its_own_statistics_keeps_none_of_the_fast_paths():
    """KTied declares MeanField's capabilities again for its own overrides; its subclass overriding ``_scale_stats``
    does not, and gets none of them (so MeanField's plain softplus sigma is not taken for its sigma either)."""
    assert (KTied.softplus_group, KTied.has_fused_sample, KTied.has_plain_scale) == (True, True, True)
    assert (ExpTied.softplus_group, ExpTied.has_fused_sample, ExpTied.has_plain_scale) == (False, False, False)
    assert ExpTied.has_normal_kl_parts  # its kl is not overridden
    bias = ExpTied(rank=2).build((4,))  # untied: sigma = softplus(rho)
    assert not bias._softplus_group_eligible() and bias._fused_sample() is None
    assert KTied(rank=2).build((4,))._softplus_group_eligible()
