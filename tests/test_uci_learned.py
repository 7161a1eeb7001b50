"""The learned-noise UCI protocol (``varbnn reproduce uci-learned``): the search picks the best validation score, the
test set is scored once, the predictive log-likelihood is the exact Gaussian mixture, runs resume."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

from varbnn.cli import main
from varbnn.likelihoods import Gaussian, HeteroscedasticGaussian
from varbnn_lab.pages.uci_learned import _seconds_cell, chose_longest
from varbnn_lab.render import MISSING
from varbnn_lab.uci_learned import LEARNED_VARIANTS, UCILearnedConfig, _lengths, _log_likelihood, quick_config


class _Draws(torch.nn.Module):
    """A 'model' whose predictive draws are fixed numbers (predict calls predictive_draws)."""

    def __init__(self, outputs: torch.Tensor) -> None:
        super().__init__()
        self.outputs = outputs

    def predictive_draws(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        return self.outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs[0]


def test_log_likelihood_is_the_gaussian_mixture_of_the_draws_in_original_units():
    torch.manual_seed(0)
    draws, y, y_std = torch.randn(5, 7, 1), torch.randn(7), torch.tensor(3.0)
    likelihood = Gaussian(noise_std=0.4)
    ll, rmse, _ = _log_likelihood(_Draws(draws), likelihood, torch.zeros(7, 2), y, 5, y_std)
    # original units: y_o = 3 y, draws_o = 3 f, noise std 3 * 0.4
    dens = stats.norm(3 * draws.squeeze(-1).numpy(), 3 * 0.4).logpdf(3 * y.numpy())
    assert ll == pytest.approx(float((logsumexp(dens, axis=0) - math.log(5)).mean()), rel=1e-5)
    assert rmse == pytest.approx(float((3 * (draws.squeeze(-1).mean(0) - y)).square().mean().sqrt()), rel=1e-5)
    hetero = torch.stack([draws.squeeze(-1), torch.full((5, 7), math.log(0.25))], -1)  # variance 0.25
    ll2 = _log_likelihood(_Draws(hetero), HeteroscedasticGaussian(min_variance=1e-12), torch.zeros(7, 2), y, 5, y_std)[0]
    dens2 = stats.norm(3 * draws.squeeze(-1).numpy(), 3 * 0.5).logpdf(3 * y.numpy())
    assert ll2 == pytest.approx(float((logsumexp(dens2, axis=0) - math.log(5)).mean()), rel=1e-5)


def test_lengths_are_capped_by_the_step_budget_and_the_grid_is_per_variant():
    config = UCILearnedConfig(epochs=(40, 100, 400, 1000), max_steps=10_000, batch_size=32)
    assert _lengths(config, 246) == [40, 100, 400, 1000]  # yacht's 80%: 8 steps per epoch
    assert _lengths(config, 7373) == [40, 44]  # 231 steps per epoch: 100, 400 and 1000 epochs become 44 (10,000 steps)
    assert _lengths(config, 33_000) == [10]  # protein's 80%: 1,032 steps per epoch
    grids = {v.family: config.grid(v) for v in LEARNED_VARIANTS}
    assert grids["meanfield"] == config.prior_scales and grids["mc-dropout"] == config.dropout_rates
    assert grids["ensemble"] == (None,)
    with pytest.raises(ValueError, match="dropout_rates must lie in"):
        UCILearnedConfig(dropout_rates=(0.5, 1.5))
    with pytest.raises(ValueError, match="unknown UCI datasets"):
        UCILearnedConfig(datasets=("nope",))


def test_chose_longest_reads_the_search_as_the_run_chose():
    def search(*scores: float) -> list[dict[str, float]]:
        lengths = [(0.1, 40), (0.1, 100), (1.0, 40), (1.0, 100)]
        return [{"knob": k, "epochs": e, "val_ll": v} for (k, e), v in zip(lengths, scores)]

    assert chose_longest({"search": search(-3.0, -2.0, -2.5, -2.2)})  # argmax at 100 epochs, the longest
    assert not chose_longest({"search": search(-3.0, -2.6, -2.0, -2.2)})  # argmax at 40 epochs
    assert not chose_longest({"search": search(-3.0, float("nan"), -2.0, -2.2)})  # NaN scores are not choices
    assert chose_longest({"search": search(float("nan"), float("nan"), -2.5, -2.2)})
    assert not chose_longest({"search": []}) and not chose_longest({})
    near = [{"knob": 1.0, "epochs": e, "val_ll": v} for e, v in ((40, -3.0), (400, -2.0), (417, -2.1))]
    assert chose_longest({"search": near})  # 400 of 417 epochs: the step cap, not the validation, ended it
    assert not chose_longest({"search": [{**near[1], "epochs": 370}, near[2]]})  # 370 < 0.9 * 417


def test_seconds_cells_are_per_split_and_relative_to_the_reference():
    assert _seconds_cell({"seconds": 300.0, "splits": 3}, {"seconds": 50.0, "splits": 2}) == "100 s (4.0x)"
    assert _seconds_cell({"seconds": 30.0, "splits": 1}, None) == "30 s"
    assert _seconds_cell(None, {"seconds": 50.0, "splits": 2}) == MISSING


def test_uci_learned_quick_run_selects_on_validation_resumes_and_renders(data_dir, tmp_path, capsys):
    args = ["reproduce", "uci-learned", "--quick", "--out", str(tmp_path), "--data-dir", str(data_dir), "--no-progress"]
    only = ["--set", "only=('mean-field', 'MC dropout', 'deep ensemble (5)')"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, *only]) == 0
    records = [json.loads(line) for line in (tmp_path / "uci-learned-quick_runs.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in records} == {"mean-field", "MC dropout", "deep ensemble (5)"}
    config = quick_config()
    for record in records:
        best = max(record["search"], key=lambda s: s["val_ll"])
        assert (record["knob"], record["epochs"]) == (best["knob"], best["epochs"])  # the validation argmax
        knobs = {s["knob"] for s in record["search"]}
        expected = (
            {None}
            if record["variant"].startswith("deep")
            else set(config.dropout_rates if record["variant"] == "MC dropout" else config.prior_scales)
        )
        assert knobs == expected and {s["epochs"] for s in record["search"]} == set(config.epochs)
        assert math.isfinite(record["ll"]) and record["rmse"] > 0
    page = (tmp_path / "uci-learned-quick.md").read_text()
    assert "| yacht | -1.30 | -1.18 |" in page and "[1]" in page
    # the budget table, read by column: the quick lengths are 2 and 4 epochs (none re-capped), so a run counts
    # exactly when it trained 4 epochs
    table = page.split("ended training.")[1].strip().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    cells = dict(zip(header, (c.strip() for c in next(r for r in table if r.startswith("| yacht")).strip("|").split("|"))))
    assert {r["variant"]: cells[r["variant"]] for r in records} == {
        r["variant"]: f"{int(r['epochs'] == 4)} of 1" for r in records
    }
    # the time table: each variant's one split in seconds (no MAP run here: no ratio)
    times = page.split("are rough.")[1].strip().splitlines()
    time_cells = dict(zip(header, (c.strip() for c in next(r for r in times if r.startswith("| yacht")).strip("|").split("|"))))
    assert {r["variant"]: time_cells[r["variant"]] for r in records} == {r["variant"]: f"{r['seconds']:.0f} s" for r in records}
    before = (tmp_path / "uci-learned-quick_runs.jsonl").read_text()
    capsys.readouterr()
    assert main([*args, *only]) == 0  # every run saved: nothing retrained
    assert (tmp_path / "uci-learned-quick_runs.jsonl").read_text() == before
    assert main(["render", str(tmp_path / "uci-learned-quick.json")]) == 0
    assert (tmp_path / "uci-learned-quick.md").read_text().split("\n- search")[1] == page.split("\n- search")[1]


def test_uci_learned_compile_reaches_every_fit_and_is_recorded_not_part_of_the_protocol(data_dir, tmp_path, fit_compile_spy):
    """``--compile`` reaches the search's and the final run's ``fit``, each record names the mode, the page counts the
    compiled runs, and an eager invocation finds them done (the protocol hash does not change). (fit(compile=True)
    itself is tested in test_compile.py; here ``fit`` is spied on and runs eagerly.)"""
    from varbnn_lab import uci_learned

    seen = fit_compile_spy(uci_learned)
    args = ["reproduce", "uci-learned", "--quick", "--out", str(tmp_path), "--data-dir", str(data_dir), "--no-progress",
            "--set", "only=('mean-field',)"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--compile", "max-autotune"]) == 0
    assert seen == ["max-autotune"] * 3  # two searched prior scales, then the final run
    (record,) = [json.loads(line) for line in (tmp_path / "uci-learned-quick_runs.jsonl").read_text().splitlines()]
    assert record["compile"] == "max-autotune"
    page = (tmp_path / "uci-learned-quick.md").read_text()
    assert "- training steps: `fit(compile=...)` in every run: a runtime choice, not the protocol" in page
    seen.clear()
    assert main(args) == 0
    assert seen == []  # the same protocol: nothing to train again
    with pytest.raises(SystemExit):
        main([*args, "--compile", "fast"])
    eager = tmp_path / "eager"
    assert main([*args[:4], str(eager), *args[5:]]) == 0
    seen.clear()
    with pytest.raises(ValueError, match="compile is not available with distributed training"):  # before any run
        uci_learned.run_uci_learned(uci_learned.quick_config(), out_dir=tmp_path / "ddp", compile=True, distributed=True)
    assert seen == [] and not (tmp_path / "ddp").exists()
    assert "- training steps: eager (`fit(compile=False)`) in every run" in (eager / "uci-learned-quick.md").read_text()


def test_cost_figure_is_written_and_linked_only_with_the_time_reference(tmp_path):
    from dataclasses import asdict

    from varbnn_lab.pages.uci_learned import TIME_REFERENCE, render_uci_learned_markdown, uci_learned_figures

    config = asdict(quick_config())
    entry = {"splits": 2, "ll": [-1.5, 0.1], "rmse": [0.7, 0.05], "seconds": 40.0, "compiled": 0, "at_longest": 1}
    row = {"dataset": "yacht", "reference_ll": -1.30, "ensemble_ll": -1.18, "mean-field": entry}
    result = {"name": "uci-learned-quick", "command": "x", "commit": "c", "device": "cpu", "seconds": 1.0,
              "config": config, "protocol": "p", "rows": [row]}  # fmt: skip
    assert uci_learned_figures(result, tmp_path) == []  # no MAP run: no ratio to plot
    assert not list(tmp_path.iterdir()) and "_cost.png" not in render_uci_learned_markdown(result)
    row[TIME_REFERENCE] = {**entry, "seconds": 20.0}
    result["figures"] = uci_learned_figures(result, tmp_path)
    assert result["figures"] == ["uci-learned-quick_cost.png"]
    assert (tmp_path / "uci-learned-quick_cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](uci-learned-quick_cost.png)" in render_uci_learned_markdown(result)


def test_the_added_ivon_column_keeps_the_saved_protocol_and_trains_by_ivon(data_dir, tmp_path, monkeypatch):
    """Issue 63's IVON column: adding it leaves the protocol hash of the saved runs (38eb440a25, the committed
    uci-learned_runs.jsonl's) as it was; its runs build mean-field layers and train them with varbnn.optim.IVON
    (no KL annealing: the prior is in IVON's update), the learned noise std among IVON's plain parameters."""
    from varbnn.families import MeanField
    from varbnn.optim import IVON
    from varbnn_lab import uci_learned

    assert UCILearnedConfig().protocol_hash() == "38eb440a25"
    assert "IVON (mean-field)" in {v.label for v in LEARNED_VARIANTS}
    without = tuple(v for v in LEARNED_VARIANTS if v.label not in uci_learned.ADDED_VARIANTS)
    assert UCILearnedConfig(variants=without).protocol_hash() == "38eb440a25"
    assert UCILearnedConfig(prior_scales=(0.1, 2.0)).protocol_hash() != "38eb440a25"  # the hash still sees the protocol

    seen: list[tuple[object, object, list[float], list[float]]] = []
    real_fit = uci_learned.fit

    def spy(net, loader, **kwargs):
        def noise() -> list[float]:
            return [float(p.detach().sum()) for p in kwargs["likelihood"].parameters()]

        before = noise()
        out = real_fit(net, loader, **kwargs)
        seen.append((kwargs["optimizer"], kwargs["kl_weight"], before, noise()))
        assert all(type(m.posterior) is MeanField for m in net.modules() if hasattr(m, "posterior"))
        return out

    monkeypatch.setattr(uci_learned, "fit", spy)
    args = ["reproduce", "uci-learned", "--quick", "--out", str(tmp_path), "--data-dir", str(data_dir), "--no-progress",
            "--set", "only=('IVON (mean-field)',)"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args) == 0
    assert len(seen) == 3  # two searched prior scales, then the final run
    for optimizer, kl_weight, before, after in seen:
        assert isinstance(optimizer, IVON) and kl_weight is None
        assert before and before != after  # the learned noise std moved: it is in IVON's plain group
        assert all(g["clip"] == uci_learned.IVON_OPTIONS.get("clip") for g in optimizer.param_groups)  # the recipe
    (record,) = [json.loads(line) for line in (tmp_path / "uci-learned-quick_runs.jsonl").read_text().splitlines()]
    assert record["variant"] == "IVON (mean-field)" and math.isfinite(record["ll"]) and record["rmse"] > 0
    assert record["ivon_options"] == uci_learned.IVON_OPTIONS  # the recipe travels with the run
    page = (tmp_path / "uci-learned-quick.md").read_text()
    assert "IVON (mean-field)" in page
    assert f"`{json.dumps(uci_learned.IVON_OPTIONS, sort_keys=True)}`" in page


def test_the_paired_table_compares_ivon_with_mean_field_on_the_splits_both_ran():
    from varbnn_lab.pages.uci_learned import render_uci_learned_markdown, summarise_uci_learned

    config = UCILearnedConfig(datasets=("yacht",), only=("mean-field", "IVON (mean-field)"))

    def record(variant: str, split: int, ll: float) -> dict[str, object]:
        return {"dataset": "yacht", "variant": variant, "split": split, "ll": ll, "rmse": 1.0, "knob": 1.0, "epochs": 40,
                "search": [], "seconds": 2.0}  # fmt: skip

    mean_field = {0: -1.6, 1: -1.5, 2: -1.7, 3: -1.4}
    ivon = {0: -1.5, 2: -1.8, 3: -1.2}  # split 1 not run
    done = {("yacht", "mean-field", s): record("mean-field", s, v) for s, v in mean_field.items()}
    done |= {("yacht", "IVON (mean-field)", s): record("IVON (mean-field)", s, v) for s, v in ivon.items()}
    (row,) = summarise_uci_learned(config, done)
    paired = row["paired"]["IVON (mean-field)"]
    diffs = [ivon[s] - mean_field[s] for s in (0, 2, 3)]  # 0.1, -0.1, 0.2
    assert paired["splits"] == [0, 2, 3] and paired["above"] == 2 and paired["reference"] == "mean-field"
    assert paired["ll_difference"][0] == pytest.approx(sum(diffs) / 3)
    assert paired["ll_difference"][1] == pytest.approx(float(torch.tensor(diffs).std() / math.sqrt(3)))
    assert paired["reference_ll"][0] == pytest.approx((-1.6 - 1.7 - 1.4) / 3)  # on the shared splits, not all four
    assert row["mean-field"]["splits"] == 4 and row["IVON (mean-field)"]["splits"] == 3
    from dataclasses import asdict

    page = render_uci_learned_markdown({"name": "t", "config": asdict(config), "protocol": "p", "rows": [row],
                                        "commit": "c", "device": "cpu", "command": "x", "seconds": 1.0})  # fmt: skip
    assert "IVON (mean-field) against mean-field on the same splits" in page
    assert "| yacht | 3 | -1.500 ± 0.173 | -1.567 ± 0.088 | 0.067 ± 0.088 | 2 of 3 |" in page
    (alone,) = summarise_uci_learned(UCILearnedConfig(datasets=("yacht",), only=("IVON (mean-field)",)), done)
    assert "paired" not in alone  # no reference column on the page: no pair
