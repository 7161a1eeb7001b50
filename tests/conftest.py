import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))

DATA_DIR = Path(os.environ.get("VARBNN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture
def data_dir() -> Path:
    if not (DATA_DIR / "mnist").exists():
        pytest.skip(f"shared datasets not found at {DATA_DIR} (set VARBNN_DATA)")
    return DATA_DIR
