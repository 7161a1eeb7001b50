import os
from pathlib import Path

import pytest
import torch

# two cores: one thread per process when pytest-xdist runs two workers (-n 2), else two
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))

SLOW_HELP = "also run the tests marked slow (or set VARBNN_SLOW=1)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help=SLOW_HELP)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: a variant the default run leaves out; --runslow or VARBNN_SLOW=1 runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run (CI's) skips the ``slow`` tests: each is a costlier variant of a check that a faster test in
    the default run also makes (e.g. inductor's code generation for every family, where the default run compiles two
    families with inductor and traces every family with the aot_eager backend)."""
    if config.getoption("--runslow") or os.environ.get("VARBNN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or VARBNN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


DATA_DIR = Path(os.environ.get("VARBNN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture(autouse=True)
def _keep_distribution_validation():
    """A direct torch.compile call turns torch.distributions' global argument validation off and leaves it off; every
    test gets it back as it was, so that a later test (e.g. the vMF bad-input table) sees what a user has."""
    validating = torch.distributions.Distribution._validate_args
    yield
    torch.distributions.Distribution.set_default_validate_args(validating)


@pytest.fixture
def data_dir() -> Path:
    if not (DATA_DIR / "mnist").exists():
        pytest.skip(f"shared datasets not found at {DATA_DIR} (set VARBNN_DATA)")
    return DATA_DIR


@pytest.fixture
def stats_objective():
    """``objective(outputs, used, w1, w2)``: a scalar from a fused std node's outputs (sigma, sigma^2, sum log sigma,
    sum sigma^2), using only the outputs flagged in ``used``: every subset a training step can meet."""

    def objective(outputs, used, w1, w2):
        sigma, square, sum_log, sum_sq = outputs
        total = torch.zeros((), dtype=w1.dtype)
        if used[0]:
            total = total + (sigma * w1).sum()
        if used[1]:
            total = total + (square * w2).sum()
        if used[2]:
            total = total + 0.7 * sum_log
        if used[3]:
            total = total - 1.3 * sum_sq
        return total

    return objective


@pytest.fixture
def fit_compile_spy(monkeypatch):
    """``spy(module)``: ``module.fit`` replaced by one that records each call's ``compile=`` and trains eagerly; returns
    the list of recorded values (the experiment runners' ``--compile`` tests)."""

    def spy(module):
        seen = []
        real_fit = module.fit

        def fit(*args, compile=False, **kwargs):
            seen.append(compile)
            return real_fit(*args, **kwargs)

        monkeypatch.setattr(module, "fit", fit)
        return seen

    return spy
