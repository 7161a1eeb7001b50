"""A model's softplus families compute their step statistics in one node (``SoftplusGroup``): the same numbers as each
tensor's own fused node, in less host time."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import varbnn
import varbnn._fast.softplus as fast_softplus
from varbnn._fast.softplus import _SoftplusStats, _SoftplusStatsGroup
from varbnn.families import KTied, MeanField, Radial
from varbnn.nn import BayesLinear


def _no_groups(monkeypatch):
    monkeypatch.setattr(fast_softplus, "join_softplus_groups", lambda families: None)


def _families(model):
    return [m for m in model.modules() if isinstance(m, (MeanField, Radial))]


class _TwoHeads(nn.Module):
    """A body, a head the forward pass uses and one it does not (its KL still counts), and a local-estimator layer
    between (its statistics with sigma^2)."""

    def __init__(self, spec):
        super().__init__()
        self.body = BayesLinear(6, 8, family=spec())
        self.local = BayesLinear(8, 8, family=MeanField(init_std=0.05, estimator="local"))
        self.head = BayesLinear(8, 3, family=spec())
        self.unused = BayesLinear(8, 2, family=spec())
        self.graves = BayesLinear(8, 2, family=MeanField(estimator="graves"))  # unused; not a member (torch.func)

    def forward(self, x):
        return self.head(torch.relu(self.local(torch.relu(self.body(x)))))


_SPECS = {
    "meanfield": lambda: MeanField(init_std=0.1),
    "meanfield-local": lambda: MeanField(init_std=0.1, estimator="local"),
    "meanfield-flipout": lambda: MeanField(init_std=0.1, estimator="flipout"),
    "radial-mc": lambda: Radial(),
    "radial-closed": lambda: Radial(cross_entropy="closed_form"),
    "radial-flipout": lambda: Radial(estimator="flipout"),
    "ktied": lambda: KTied(rank=2),  # its biases are untied (softplus): members; its U V^T weights are not
}


def _train(model, steps, x, y):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        nll = F.cross_entropy(model(x), y)
        loss = varbnn.elbo_loss(nll, model, 1000).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def test_group_node_equals_each_tensors_node_and_passes_gradcheck():
    rhos = [torch.randn(4, 3, dtype=torch.float64, requires_grad=True), torch.randn(5, dtype=torch.float64, requires_grad=True)]
    squares = (False, True)
    outputs = _SoftplusStatsGroup.apply(squares, *rhos)
    for i, (rho, square) in enumerate(zip(rhos, squares, strict=True)):
        expected = _SoftplusStats.apply(rho, square)
        for k in range(4):
            assert (outputs[2 * k + i] is None) == (expected[k] is None)
            assert expected[k] is None or torch.equal(outputs[2 * k + i], expected[k])
    w = torch.randn(4, 3, dtype=torch.float64)

    def objective(a, b):  # every output kind used, one sigma not at all (its gradient arrives as None)
        out = _SoftplusStatsGroup.apply(squares, a, b)
        return (out[0] * w).sum() + out[3].sum() * 0.2 + out[4] * 0.3 - out[5] + 0.7 * out[6] + out[7]

    assert torch.autograd.gradcheck(objective, tuple(rhos))


@pytest.mark.parametrize("name", list(_SPECS))
def test_training_with_the_group_equals_training_without_it(name, monkeypatch):
    """Same losses and parameters, bit for bit, as each tensor's own node; a member the forward pass does not use, a
    local-estimator layer beside the group. From the second step on the members' statistics come from one node."""
    torch.manual_seed(0)
    model, x, y = _TwoHeads(_SPECS[name]), torch.randn(16, 6), torch.randint(0, 3, (16,))
    reference = copy.deepcopy(model)
    grouped_losses = _train(model, 4, x, y)
    with monkeypatch.context() as patch:
        _no_groups(patch)
        plain_losses = _train(reference, 4, x, y)
        assert all("_softplus_group" not in family.__dict__ for family in _families(reference))
    assert torch.equal(grouped_losses, plain_losses)
    for (key, grouped), plain in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(grouped, plain), key
    members = [f for f in _families(model) if f.estimator != "graves" and not (isinstance(f, KTied) and f.tied)]
    assert len(members) == (6 if name == "ktied" else 8)
    group = members[0].__dict__["_softplus_group"]
    assert all(family.__dict__["_softplus_group"] is group for family in members) and len(group.members) == len(members)
    assert all("_softplus_group" not in f.__dict__ for f in _families(model) if isinstance(f, KTied) and f.tied)
    assert all("_softplus_group" not in family.__dict__ for family in model.graves.posteriors.values())
    model(x)  # a step's forward pass: one node holds every member's statistics, the unused head's included
    nodes = {family._scale_cache[1][0].grad_fn for family in members}
    assert len(nodes) == 1 and type(next(iter(nodes))).__name__ == "_SoftplusStatsGroupBackward"
    squares = [family._scale_cache[1][1] is not None for family in members]
    assert squares == [family.estimator == "local" for family in members]


def test_several_draws_per_step_match_the_plain_path(monkeypatch):
    """``fit(mc_samples=3)``: later draws of a step reuse the group's sigma (gradients summed by autograd instead of
    inside the fused node: equal up to rounding)."""
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(6, 8), nn.ReLU(), BayesLinear(8, 3))
    reference = copy.deepcopy(model)
    data = torch.utils.data.TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
    for net, patch in ((model, False), (reference, True)):
        with monkeypatch.context() as context:
            if patch:
                _no_groups(context)
            torch.manual_seed(1)
            varbnn.fit(net, torch.utils.data.DataLoader(data, batch_size=8), n_data=32, epochs=2, mc_samples=3, progress=False)
    for grouped, plain in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kl_first", [False, True])
def test_activation_checkpointing_of_each_layer_with_the_group(kl_first):
    """Non-reentrant checkpointing of each layer reruns each layer's draws in the backward: the rerun finds the group's
    statistics and draws the same noise, so the gradients equal those without checkpointing."""
    torch.manual_seed(0)
    layers = nn.ModuleList([BayesLinear(4, 6, family=MeanField(init_std=0.2)), BayesLinear(6, 3, family=Radial())])
    x = torch.randn(5, 4)
    varbnn.kl(layers).backward()  # the group forms
    grads = []
    for use_checkpoint in (False, True):
        layers.zero_grad()
        torch.manual_seed(1)
        kl = varbnn.kl(layers) if kl_first else None
        h = x
        for layer in layers:
            h = torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False) if use_checkpoint else layer(h)
            h = torch.tanh(h)
        (h.square().sum() + (kl if kl is not None else varbnn.kl(layers))).backward()
        grads.append([p.grad.clone() for p in layers.parameters()])
    assert "_softplus_group" in layers[0].posteriors["weight"].__dict__
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain)


def test_copies_and_pickles_make_their_own_group():
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(3, 4), nn.ReLU(), BayesLinear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    _train(model, 2, x, y)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert all("_softplus_group" not in family.__dict__ for family in _families(clone))
        before = [p.detach().clone() for p in model.parameters()]
        _train(clone, 2, x, y)
        group = _families(clone)[0].__dict__["_softplus_group"]
        assert [ref() for ref in group.members] == _families(clone)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_pruned_tensor_leaves_the_group():
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(3, 4), nn.ReLU(), BayesLinear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    _train(model, 2, x, y)
    pruned = model[2].posteriors["weight"]
    pruned.prune_(torch.rand(2, 4) > 0.5)
    losses = _train(model, 2, x, y)
    assert torch.isfinite(losses).all()
    assert "_softplus_group" not in pruned.__dict__
    others = [f for f in _families(model) if f is not pruned]
    assert all(f.__dict__["_softplus_group"] is others[0].__dict__["_softplus_group"] for f in others)
    model(x)  # the pruned tensor's statistics are its own (elementwise), the others' the group's
    assert pruned._scale_cache is None or len(pruned._scale_cache) == 3
    assert all(len(f._scale_cache) == 4 for f in others)
    assert bool((pruned.weight()[pruned.weight_mask == 0] == 0).all())  # the pruned weights stay at exactly 0


def test_parameters_replaced_by_data_assignment_are_not_served_stale_statistics(monkeypatch):
    """A forward pass without backward leaves the step's statistics cached, the group's for a head the pass does not
    use too; ``vector_to_parameters`` (``param.data = ...``: the version stays) must still give fresh ones."""
    torch.manual_seed(0)
    model, x, y = _TwoHeads(_SPECS["meanfield"]), torch.randn(16, 6), torch.randint(0, 3, (16,))
    reference = copy.deepcopy(model)
    losses = []
    for net, patch in ((model, False), (reference, True)):
        with monkeypatch.context() as context:
            if patch:
                _no_groups(context)
            _train(net, 2, x, y)
            torch.manual_seed(7)
            net(x)  # no backward
            params = list(net.unused.parameters())
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(params) - 0.5, params)
            losses.append(_train(net, 2, x, y))
    assert torch.equal(*losses)
    for grouped, plain in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(grouped, plain)


def test_the_kl_of_a_part_keeps_the_whole_models_group():
    """``kl`` of single layers beside ``kl(model)`` (e.g. per-layer logging) keeps one group for the model."""
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(3, 4), nn.ReLU(), BayesLinear(4, 4), nn.ReLU(), BayesLinear(4, 2))
    x = torch.randn(8, 3)
    for _ in range(3):
        loss = model(x).square().sum() + varbnn.kl(model[0]) + varbnn.kl(model) + varbnn.kl(model[4])
        loss.backward()
    groups = {id(f.__dict__.get("_softplus_group")) for f in _families(model)}
    assert len(groups) == 1 and None not in {f.__dict__.get("_softplus_group") for f in _families(model)}


def test_a_shallow_replica_does_not_compute_for_the_original():
    """nn.DataParallel's replicas copy a module's ``__dict__``: a replica's family is not a member of the original's
    group, so its draw takes its own nodes and leaves the original families' caches alone."""
    torch.manual_seed(0)
    model = nn.Sequential(BayesLinear(3, 4), nn.ReLU(), BayesLinear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    _train(model, 2, x, y)
    def replicate(module):  # what torch.nn.parallel.replicate does on one device: the parameters are the same tensors
        copy_ = module._replicate_for_data_parallel()
        copy_._parameters = dict(module._parameters)
        return copy_

    replica = replicate(model[0])
    replica.posteriors = nn.ModuleDict({k: replicate(v) for k, v in model[0].posteriors.items()})
    assert replica.posteriors["weight"].__dict__["_softplus_group"] is model[0].posteriors["weight"].__dict__["_softplus_group"]
    replica(x).sum().backward()
    assert all(f._scale_cache is None for f in _families(model))
