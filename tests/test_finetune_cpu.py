"""benchmarks/finetune_cpu.py: the tiny ViT's shapes, and the --quick path end to end (train, resume, summarize)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import finetune_cpu  # type: ignore[import-not-found]  # noqa: E402

from varbnn.adapters import LoRALinear, LoRAMultiheadAttention, add_adapters  # noqa: E402


def test_vit_shapes_and_parts() -> None:
    net = finetune_cpu.vit()
    x = torch.rand(3, 1, 28, 28)
    tokens = net.tokens(x)
    assert tokens.shape == (3, 1 + 16, 64)  # a class token and 16 patches of 7x7
    assert net(x).shape == (3, 10)
    assert torch.equal(net(x), net(x.flatten(1)))  # [N, 784] inputs read as the same images
    assert sum(p.numel() for p in net.parameters()) == 72_074
    assert len(net.encoder.layers) == 2 and net.encoder.layers[0].self_attn.num_heads == 4
    assert net.encoder.layers[0].linear1.out_features == 128 and net.encoder.layers[0].dropout.p == 0.0
    # the head is the model's last nn.Linear (LastLayerLaplace's layer) and new_head replaces it, keeping the rest
    assert [n for n, m in net.named_modules() if isinstance(m, nn.Linear)][-1] == "head.1"
    fresh = finetune_cpu.new_head(net, seed=1)
    assert torch.equal(fresh.embed.weight, net.embed.weight) and not torch.equal(fresh.head[1].weight, net.head[1].weight)
    with pytest.raises(ValueError, match="patch must divide 28"):
        finetune_cpu.ViT(patch=5)


def test_adapted_layers_are_the_embedding_the_attention_and_the_feed_forward_layers() -> None:
    model = finetune_cpu.build("lora", finetune_cpu.vit(), init_seed=0, rank=4)
    adapted = sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear))
    assert adapted == ["embed", *(f"encoder.layers.{i}.linear{j}" for i in (0, 1) for j in (1, 2))]
    attention = sorted(n for n, m in model.named_modules() if isinstance(m, LoRAMultiheadAttention))
    assert attention == [f"encoder.layers.{i}.self_attn" for i in (0, 1)]
    trainable = {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"embed", "encoder", "head"} and all(
        not p.requires_grad for n, p in model.named_parameters() if ".base." in n or "out_proj" in n
    )
    # plain LoRA runs at its point (one validation pass, not 8 equal draws); the variational adapters sample
    assert {m.sample_mode for m in model.modules() if isinstance(m, LoRALinear)} == {"mode"}
    variational = finetune_cpu.build("vlora", finetune_cpu.vit(), init_seed=0, rank=4)
    assert {m.sample_mode for m in variational.modules() if isinstance(m, LoRALinear)} == {"sample"}
    assert add_adapters(finetune_cpu.vit(), include=finetune_cpu.ADAPTED) is not None  # the patterns all match


def test_quick_run_resumes_and_summarizes(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VARBNN_DATA", str(data_dir))
    threads = torch.get_num_threads()
    try:
        finetune_cpu.main(["--quick", "--seeds", "0", "--out", str(tmp_path)])
        runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
        assert [r["method"] for r in runs] == list(finetune_cpu.METHODS)
        for r in runs:
            assert r["quick"] and r["seed"] == 0 and 0.0 <= r["ece"] <= 1.0 and 0.0 <= r["ood_auroc"] <= 1.0
            assert r["train_seconds"] > 0 and 0 <= r["validation_seconds"] <= r["train_seconds"]
        by = {r["method"]: r for r in runs}
        # the post-hoc methods start from the very same trained LoRA: TS keeps its predictions' argmax
        assert by["lora-ts"]["accuracy"] == by["lora"]["accuracy"] and by["vlora-ts"]["accuracy"] == by["vlora"]["accuracy"]
        assert by["lora-ens"]["draws"] == 2 and by["lora"]["draws"] == 1 and by["vlora"]["draws"] == 4
        assert by["lora-ens"]["trainable_parameters"] == 2 * by["lora"]["trainable_parameters"]
        assert by["full-ft"]["trainable_parameters"] == 72_074 and by["full-ft"]["adapter_parameters"] == 0
        assert by["vlora"]["adapter_parameters"] > by["lora"]["adapter_parameters"] > 0  # A's mean and scale vs A
        assert by["lora-laplace"]["prior_precision"] > 0 and by["lora-ts"]["temperature"] > 0
        # the pretrained network is cached (git-ignored) and a second call resumes: nothing is run again
        cache = tmp_path / "cache"
        assert len(list(cache.glob("vit-*.pt"))) == 1 and (cache / ".gitignore").read_text().startswith("*")
        finetune_cpu.main(["--quick", "--seeds", "0", "--out", str(tmp_path)])
        assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == len(runs)
        finetune_cpu.main(["--quick", "--summarize", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "summary-quick.json").read_text())
    assert [r["method"] for r in summary["rows"]] == list(finetune_cpu.METHODS)
    assert summary["goal"]["best"] in finetune_cpu.VARIATIONAL and set(summary["goal"]["per_seed"]) == {"0"}
    lora = next(r for r in summary["rows"] if r["method"] == "lora")
    assert lora["train_vs_lora"] == pytest.approx(1.0)
    page = (tmp_path / "summary-quick.md").read_text()
    assert "Goal of issue 65" in page and "| means |" in page and "| lora-ens |" in page
