"""Training: :func:`fit` (the loop), :func:`evaluate`, checkpoints, non-finite checks, the compiled step.

The four calls of the user story are ``bayesianize`` -> :func:`fit` -> :func:`varbnn.predict.predict` ->
:func:`evaluate`; :func:`fit` and :func:`evaluate` are also ``varbnn.fit`` and ``varbnn.evaluate``. Checkpoints are
written by :func:`save_checkpoint` (format :data:`CHECKPOINT_FORMAT`, version :data:`CHECKPOINT_VERSION`) and read
back by :func:`read_checkpoint` / :func:`load_checkpoint`.

One module per idea: :mod:`~varbnn.training.loop` (``fit``), :mod:`~varbnn.training.setup` (device, seeds, the default
optimizer), :mod:`~varbnn.training.checkpoint` (the file format, resuming), :mod:`~varbnn.training.checks` (non-finite
values, the loader against ``n_data``), :mod:`~varbnn.training.compiled` (``fit(compile=...)``),
:mod:`~varbnn.training.diagnose` (warnings about a finished run) and :mod:`~varbnn.training.evaluation`.
``varbnn.train`` is the same API under its earlier name.
"""

from __future__ import annotations

from varbnn._fast.allocator import keep_freed_memory
from varbnn.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    CheckpointError,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from varbnn.training.checks import NonFiniteError
from varbnn.training.diagnose import TrainingWarning
from varbnn.training.evaluation import evaluate, evaluate_classifier, evaluate_weight_samples
from varbnn.training.loop import fit
from varbnn.training.setup import default_optimizer, resolve_device, seed_everything

__all__ = [
    "fit",
    "evaluate",
    "TrainingWarning",
    "NonFiniteError",
    "CheckpointError",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "read_checkpoint",
    "default_optimizer",
    "evaluate_classifier",
    "evaluate_weight_samples",
    "save_checkpoint",
    "load_checkpoint",
    "seed_everything",
    "resolve_device",
    "keep_freed_memory",
]
