"""benchmarks/compile_graph.py: the operations of a compiled training step's graph, by the varbnn function issuing
each."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compile_graph import count_ops  # type: ignore[import-not-found]  # noqa: E402

from varbnn.philox import ROUNDS  # noqa: E402


def test_every_captured_operation_is_attributed_and_the_draws_are_philoxs():
    total, by_function = count_ops("host", "MeanField-reparam")
    assert total == sum(by_function.values()) > 0
    # one counter-based draw per Bayesian tensor (11 layers: 11 weights and 11 biases), each running Philox's rounds:
    # two 32 x 32-bit products per round, each the same few operations (9 today), but for the first round's product of
    # the stream's word, which is the same for every counter (a Python int: no tensor operation)
    products = by_function["philox._mulhilo"]
    per_draw = 2 * ROUNDS - 1
    assert products > 0 and products % (22 * per_draw) == 0 and products // (22 * per_draw) < 20
    # the key's round keys once per step, not once per draw: 2 words x 2 operations x (ROUNDS - 1) bumps
    assert by_function["philox.key_schedule"] == 4 * (ROUNDS - 1)
    assert by_function["_fast.softplus.softplus"] > 0  # sigma, traced (the fused eager node is not used under compile)
