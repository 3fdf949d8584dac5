import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "claim_mutation(*claim_ids): the test feeds the named test claims' own code data or a model "
        "that violates the claimed property and asserts the claim then fails",
    )


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """Every notebook run once with the smoke profile into a scratch results folder."""
    from keybias.build import pipeline

    results = tmp_path_factory.mktemp("smoke") / "results"
    os.environ["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    code = pipeline.main(["--profile", "smoke", "--device", "cpu", "--results", str(results), "notebooks"])
    assert code == 0, "the smoke run of the notebooks failed (see the log above)"
    return results
