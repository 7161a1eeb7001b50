"""A state dict records each tensor's variational family: it loads only into a model built with the same family.

MeanField and Radial (and others) hold parameters of the same names and shapes; without the record torch would load
one into the other silently and the model would sample a distribution it was never trained as."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import varbnn
from varbnn.families.base import family_of_state
from varbnn.training import CheckpointError, load_checkpoint, save_checkpoint

FAMILIES = {
    "MeanField": lambda: varbnn.MeanField(),
    "Radial": lambda: varbnn.Radial(),
    "KTied": lambda: varbnn.KTied(rank=2),
    "Delta": lambda: varbnn.Delta(),
    "RadialDirectional": lambda: varbnn.RadialDirectional(),
}


def _model(family: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return varbnn.bayesianize(net, FAMILIES[family]())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_state_dict_names_its_family_and_loads_into_the_same_family(family):
    saved = _model(family, seed=0)
    state = saved.state_dict()
    records = {k: v for k, v in state.items() if k.endswith("weight._extra_state")}  # (RDP's biases are MeanField)
    assert len(records) == 2 and all(family_of_state(v) == family for v in records.values())
    restored = _model(family, seed=1)
    restored.load_state_dict(state)
    x = torch.randn(5, 6)
    with varbnn.sample_mode(saved, "mean"), varbnn.sample_mode(restored, "mean"):
        assert torch.equal(saved(x), restored(x))


def test_a_meanfield_state_dict_is_refused_by_a_radial_model_with_both_names():
    state = _model("MeanField").state_dict()
    radial = _model("Radial", seed=1)
    before = radial[0].posteriors["weight"].loc.detach().clone()
    message = r"0\.posteriors\.weight: the state dict holds a MeanField posterior, the model a Radial"
    with pytest.raises(RuntimeError, match=message):
        radial.load_state_dict(state)
    # the mismatched tensors are not loaded (torch raises after visiting every module)
    assert torch.equal(radial[0].posteriors["weight"].loc, before)
    with pytest.raises(RuntimeError, match="MeanField posterior"):  # strict=False does not make the mismatch pass
        radial.load_state_dict(state, strict=False)


def test_a_state_dict_without_the_family_record_still_loads():
    """Files saved before the record existed load as before (strict too)."""
    saved = _model("MeanField")
    old = {k: v for k, v in saved.state_dict().items() if not k.endswith("_extra_state")}
    restored = _model("MeanField", seed=1)
    restored.load_state_dict(old)
    assert torch.equal(restored[2].posteriors["weight"].loc, saved[2].posteriors["weight"].loc)


def test_a_checkpoint_of_another_family_is_a_checkpoint_error(tmp_path):
    path = save_checkpoint(tmp_path / "run.pt", _model("Radial"))
    with pytest.raises(CheckpointError, match=r"(?s)does not fit the model.*Radial posterior, the model a MeanField"):
        load_checkpoint(path, _model("MeanField"))
    load_checkpoint(path, _model("Radial", seed=3))  # the file itself is fine


def test_the_family_record_is_a_tensor_so_tensor_code_over_state_dicts_keeps_working():
    """e.g. ``{k: v.clone() ...}`` snapshots, ``torch.equal`` comparisons, ``.to(device)``, weights_only loading."""
    model = _model("MeanField")
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in snapshot.items())
    assert family_of_state(snapshot["0.posteriors.weight._extra_state"]) == "MeanField"
    assert family_of_state({"family": "MeanField"}) is None and family_of_state(None) is None


def test_a_refused_load_leaves_a_pruned_meanfield_mask_as_it_was():
    model = _model("MeanField")
    posterior = model[0].posteriors["weight"]
    posterior.prune_(torch.rand(posterior.shape) > 0.5)
    mask = posterior.weight_mask.clone()
    with pytest.raises(RuntimeError, match="Radial posterior, the model a MeanField"):
        model.load_state_dict(_model("Radial").state_dict())
    assert torch.equal(posterior.weight_mask, mask)


def test_a_subclass_takes_its_base_family_state_and_a_converted_record_still_names_it():
    class MyMeanField(varbnn.MeanField):
        pass

    state = _model("MeanField").state_dict()
    torch.manual_seed(0)
    mine = varbnn.bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), MyMeanField())
    mine.load_state_dict(state)  # a MeanField state into a MeanField subclass
    with pytest.raises(RuntimeError, match="MyMeanField posterior, the model a MeanField"):
        _model("MeanField").load_state_dict(mine.state_dict())  # not the other way round
    converted = {k: v.float() for k, v in _model("MeanField").state_dict().items()}
    with pytest.raises(RuntimeError, match="MeanField posterior, the model a Radial"):
        _model("Radial").load_state_dict(converted)
