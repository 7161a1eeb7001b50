"""The training API under its first name: the same objects as :mod:`varbnn.training` (``fit``, ``evaluate``,
checkpoints), kept so that ``varbnn.train.fit`` and ``from varbnn.train import ...`` keep working.

New code imports :mod:`varbnn.training` (or the top-level ``varbnn.fit`` / ``varbnn.evaluate``). To patch what the
loop calls (e.g. in a test), patch the module that defines it (``varbnn.training.loop``, ``varbnn.training.checkpoint``,
...): names here are references, and rebinding one does not change the loop.
"""

from __future__ import annotations

from varbnn.training import *  # noqa: F403
from varbnn.training import __all__ as __all__  # noqa: PLE0604
from varbnn.training.checkpoint import _write_atomically, _write_checkpoint_state  # noqa: F401 -- used by the lab
from varbnn.training.compiled import (  # noqa: F401 -- used by the lab and the benchmarks
    _compiled_elbo_step,
    _family_inductor_options,
    _fit_compile_mode,
    _static_batches,
    _uses_cudagraphs,
    compile_mode,
)
from varbnn.training.loop import _accumulated_elbo_gradient, logger  # noqa: F401 -- used by the benchmarks
