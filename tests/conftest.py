"""Shared fixtures: offline by construction, tiny models and fixture data from tests/fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Never reach for a hub: tests must pass with no network at all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# Tiny models run fastest on one thread, and several OpenMP threads spinning on a 2-core
# CI machine slow every test down by an order of magnitude.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_bert() -> Path:
    return FIXTURES / "tiny-bert"


@pytest.fixture()
def in_repo(monkeypatch):
    """Run from the repository root, as a user following the README does."""
    monkeypatch.chdir(ROOT)
    return ROOT
