"""Shared test fixtures. Each part of the package keeps its fixtures in its own marked section."""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


@pytest.fixture(scope="session")
def multi30k_dir():
    """The Multi30k folder beside the repository (CI has it there too)."""
    if not MULTI30K.is_dir():
        pytest.fail(f"Multi30k data not found at {MULTI30K}; the tests expect ../shared beside the repository.")
    return MULTI30K

# ---------------------------------------------------------------- model core
