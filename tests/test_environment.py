"""The venv lock and the conda environment carry the same exact pins."""

import re

import yaml

from conftest import ROOT

REQUIRED = {"torch", "papermill", "ipykernel", "nbconvert", "pandas", "seaborn", "sympy", "pytest", "ruff"}


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert match, f"requirements.lock line is not an exact pin: {line!r}"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = {}
    for item in pip_section:
        if item.startswith("-e"):
            continue
        name, version = item.split("==")
        pins[name.lower()] = version
    assert "python=3.11" in env["dependencies"]
    return pins


def test_lock_and_environment_agree():
    assert lock_pins() == conda_pins()


def test_lock_pins_what_the_project_needs():
    pins = lock_pins()
    assert REQUIRED <= set(pins), f"missing from the lock: {REQUIRED - set(pins)}"
    assert pins["torch"] == "2.13.0"


def test_installed_versions_match_the_lock():
    import importlib.metadata

    for name, version in lock_pins().items():
        installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == version, f"{name}: installed {installed}, locked {version}"
