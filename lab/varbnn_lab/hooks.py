"""The training hooks of the experiments' runs: traces at chosen steps, what a resumable run commits with its epoch
checkpoints, the best-of-last-epochs selection (the generic runner, :mod:`varbnn_lab.runner`), and the state
with the best score so far (:class:`BestState`: early stopping by selection, as ``graves-*`` and ``retina-*`` do)."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from varbnn.analysis import GradientSNR
from varbnn.nn.base import BayesianModule
from varbnn.training import CheckpointError, evaluate_weight_samples, read_checkpoint
from varbnn.training.checkpoint import _write_atomically, _write_checkpoint_state
from varbnn_lab.config import ExperimentConfig

__all__ = ["std_parameters", "Tracer", "committed_state", "Sidecar", "BestOfLast", "BestState"]


def std_parameters(model: torch.nn.Module, tensor: str) -> list[torch.nn.Parameter]:
    """The standard-deviation parameters (every parameter but the mean ``loc``) of the posterior of one random
    tensor, named ``"<module>.<tensor>"`` (e.g. ``"3.weight"``, ``"lstm.weight_hh_l0"``): ``rho`` for MeanField,
    ``log_u``/``log_v`` for KTied."""
    module_name, _, tensor_name = tensor.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        raise ValueError(f"snr_tensor {tensor!r}: {module_name!r} is not a module of the model") from None
    if not isinstance(module, BayesianModule) or tensor_name not in module.posteriors:
        allowed = [f"{n}.{t}" for n, m in model.named_modules() if isinstance(m, BayesianModule) for t in m.posteriors]
        raise ValueError(f"snr_tensor {tensor!r} is not a random tensor of the model; allowed: {allowed}")
    params = [p for name, p in module.posteriors[tensor_name].named_parameters() if name != "loc"]
    if not params:
        raise ValueError(f"snr_tensor {tensor!r}: its posterior has no standard-deviation parameters")
    return params


class Tracer:
    """Validation -ELBO and gradient SNR at chosen steps of one training run (an ``on_step_end`` callback)."""

    def __init__(
        self,
        config: ExperimentConfig,
        model: torch.nn.Module,
        validation: tuple[torch.Tensor, torch.Tensor] | None,
        n_train: int,
        total_steps: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.config, self.model, self.validation, self.n_train, self.seed, self.device = (
            config,
            model,
            validation,
            n_train,
            seed,
            device,
        )
        steps = set(config.log_steps)
        if config.log_every:
            steps |= set(range(config.log_every, total_steps + 1, config.log_every))
        self.steps = sorted(s for s in steps if s <= total_steps)
        self.snr = None
        if config.snr_tensor is not None:
            self.snr = GradientSNR({config.snr_tensor: std_parameters(model, config.snr_tensor)}, window=config.snr_window)
        self.records: list[dict[str, float]] = []
        self.seconds = 0.0
        self._next = set(self.steps)
        self._window = {s - k for s in self.steps for k in range(config.snr_window)}

    def __call__(self, step: int, terms: Any) -> None:
        t0 = time.perf_counter()
        if self.snr is not None and step in self._window:  # only the window before each logged step is kept
            self.snr.update()
        if step in self._next:
            record: dict[str, float] = {"step": step, "beta": terms.beta, "train_loss": float(terms.loss.detach())}
            if self.snr is not None:
                record["snr"] = self.snr.snr()[self.config.snr_tensor]  # type: ignore[index]
            if self.validation is not None:
                scores = evaluate_weight_samples(
                    self.model, *self.validation, n_train=self.n_train, samples=self.config.trace_samples,
                    seed=self.seed + 7919 * step, device=self.device,
                )  # fmt: skip
                record["val_nelbo"] = float(scores["nelbo"].mean())
                record["val_nll"] = float(scores["nll"].mean())
            self.records.append(record)
        self.seconds += time.perf_counter() - t0


def committed_state(checkpoint: Path | None) -> dict[str, Any] | None:
    """The content of a resumable run's epoch checkpoint (verified), or None when there is none or it cannot be
    read (``fit`` then refuses it with the reason when it resumes)."""
    if checkpoint is None or not checkpoint.exists():
        return None
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a checkpoint without checksum: fit warns when it loads it
            return read_checkpoint(checkpoint)
    except (CheckpointError, OSError):
        return None


class Sidecar:
    """For resumable runs: the traces and training time so far. They are committed inside the epoch checkpoint
    (``fit(checkpoint_extra=...)``, entry ``"traces"``), so they always belong to the checkpoint's epoch, and read
    back on resume, so a continued run reports the whole run; ``<checkpoint>.traces.json`` holds a readable copy
    (read only for checkpoints written before the traces were committed with them). (The SNR window is not saved: a
    logged step within ``snr_window`` steps after a resume sees a shorter window.)

    ``parts``: the checkpoints a run trains one after the other (a deep ensemble's members, each with its own epoch
    checkpoint, all committing this one state); the state is read back from the last of them that holds one, so a run
    resumed in a later member still counts the members trained before. Default: ``[checkpoint]``."""

    def __init__(self, checkpoint: Path | None, tracer: Tracer | None, t0: float, parts: Sequence[Path] | None = None) -> None:
        self.path = checkpoint.with_suffix(".traces.json") if checkpoint is not None else None
        self.tracer, self.t0, self.previous_seconds = tracer, t0, 0.0
        self._state: dict[str, Any] = {}
        saved: dict[str, Any] | None = None
        written = [c for c in (parts if parts is not None else [checkpoint]) if c is not None and c.exists()]
        for part in reversed(written):
            committed = committed_state(part)
            if committed is not None and isinstance(committed.get("extra"), dict) and "traces" in committed["extra"]:
                saved = committed["extra"]["traces"]
                break
        if saved is None and self.path is not None and self.path.exists() and written:
            saved = json.loads(self.path.read_text())
        if saved is not None:
            self.previous_seconds = float(saved.get("train_seconds", 0.0))
            if tracer is not None:
                tracer.records = [dict(r) for r in saved.get("records", [])]

    def __call__(self, epoch: int, record: dict[str, float]) -> None:
        from varbnn.distributed import is_main_process

        seconds = self.previous_seconds + time.perf_counter() - self.t0 - (self.tracer.seconds if self.tracer else 0.0)
        self._state = {"epoch": epoch, "train_seconds": seconds, "records": self.tracer.records if self.tracer else []}
        if self.path is None or not is_main_process():
            return
        _write_atomically(self.path, json.dumps(self._state).encode())

    def state(self) -> dict[str, Any]:
        """What the epoch checkpoint commits (plain data)."""
        return {k: ([dict(r) for r in v] if k == "records" else v) for k, v in self._state.items()}


class BestOfLast:
    """``select_best_of_last``: keeps the state of the epoch with the lowest mean training NLL among the last K
    epochs. For resumable runs the best state is committed inside the epoch checkpoint (``fit(checkpoint_extra=...)``,
    entry ``"best"``): the pair cannot disagree, whenever the run is killed. ``<checkpoint>.best.pt`` is an export of
    it for other tools (rewritten by :meth:`restore` from the committed state); it is read back only for checkpoints
    written before the best state was committed with them, and then checked against the checkpoint's last epoch
    (a kill between the two writes left it one epoch behind)."""

    def __init__(self, model: torch.nn.Module, epochs: int, last: int, checkpoint: Path | None) -> None:
        self.model, self.first = model, epochs - last + 1
        self.path = checkpoint.with_suffix(".best.pt") if checkpoint is not None else None
        self.best: dict[str, Any] | None = None
        self._exported: int | None = None  # the epoch whose state .best.pt holds, when known
        committed = committed_state(checkpoint)
        if committed is not None and isinstance(committed.get("extra"), dict) and "best" in committed["extra"]:
            self.best = committed["extra"]["best"]
        elif self.path is not None and self.path.exists() and checkpoint is not None and checkpoint.exists():
            exported = read_checkpoint(self.path)  # verified (its checksum); an export from before it had one: a warning
            self.best = {key: exported[key] for key in ("epoch", "nll", "model")}
            self._exported = int(self.best["epoch"])
            if committed is not None and "epoch" in committed and "history" in committed:
                self._reconcile(committed)

    def _reconcile(self, committed: dict[str, Any]) -> None:
        """An old pair (best file beside a checkpoint without the committed best): apply the checkpoint's last epoch
        if the best file missed it, exactly as :meth:`__call__` would have."""
        epoch, history = int(committed["epoch"]), committed["history"]
        if not 1 <= epoch <= len(history) or self.best is None:
            return
        nll = float(history[epoch - 1]["nll"])
        if epoch >= self.first and int(self.best["epoch"]) < epoch and nll < float(self.best["nll"]):
            self.best = {"epoch": epoch, "nll": nll, "model": committed["model"]}

    def __call__(self, epoch: int, record: dict[str, float]) -> None:
        if epoch < self.first or (self.best is not None and record["nll"] >= self.best["nll"]):
            return
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.best = {"epoch": epoch, "nll": float(record["nll"]), "model": state}
        self._export()

    def _export(self) -> None:
        from varbnn.distributed import is_main_process

        if self.path is None or self.best is None or not is_main_process():  # data-parallel: every rank holds it; one writes
            return
        _write_checkpoint_state(self.path, self.best)  # fit's file format (checksum): read_checkpoint verifies it
        self._exported = int(self.best["epoch"])

    def state(self) -> dict[str, Any] | None:
        """What the epoch checkpoint commits: the best epoch so far, its training NLL and its state dict."""
        return self.best

    def restore(self) -> int:
        """Load the selected state into the model (and make ``.best.pt`` hold it); returns its epoch."""
        if self.best is None:
            raise RuntimeError("select_best_of_last: no epoch was recorded (did training run?)")
        self.model.load_state_dict(self.best["model"])
        if self._exported != int(self.best["epoch"]):
            self._export()
        return int(self.best["epoch"])


class BestState:
    """The model's state at the epoch with the lowest score offered so far (ties keep the earlier epoch): early
    stopping by selection, training runs its full length and :meth:`restore` loads the selected state. With
    ``from_start`` the state before training (epoch 0, score +inf) is the fallback, as when no epoch improves on
    nothing; without it, :meth:`restore` leaves the model as it is until an epoch has been offered."""

    def __init__(self, model: torch.nn.Module, from_start: bool = True) -> None:
        self.model = model
        self.score, self.epoch = math.inf, 0
        self.state: dict[str, Any] | None = copy.deepcopy(model.state_dict()) if from_start else None

    def offer(self, epoch: int, score: float) -> bool:
        """Keep the model's current state as that of ``epoch`` if ``score`` is below the best so far; says whether."""
        if not score < self.score:
            return False
        self.score, self.epoch, self.state = score, epoch, copy.deepcopy(self.model.state_dict())
        return True

    def restore(self) -> int:
        """Load the selected state into the model (if any); returns its epoch (0: the start, or none offered)."""
        if self.state is not None:
            self.model.load_state_dict(self.state)
        return self.epoch
