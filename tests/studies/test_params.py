"""Bad input is refused before any work, with a message naming the parameter and what is allowed."""

import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from keybias.pipeline import steps as pipeline
from keybias.studies import params as P

NOTEBOOKS = pipeline.discover_notebooks()


@pytest.mark.parametrize("profile", ["paper", "smoke"])
def test_committed_profiles_are_valid(profile):
    checked = P.load_profile(profile, ROOT / "params", NOTEBOOKS)
    assert set(checked) == set(NOTEBOOKS)


def write_profile(tmp_path, change):
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    change(data)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["01_symbolic"].update(grid_size=[1]), r"unknown parameter 01_symbolic.grid_size; allowed: \['grid_d'"),
        (lambda d: d["01_symbolic"].update(grid_n="3"), r"01_symbolic.grid_n must be a non-empty list of int"),
        (lambda d: d["01_symbolic"].update(grid_n=[2, 0]), r"01_symbolic.grid_n\[1\] = 0 must be positive"),
        (lambda d: d["01_symbolic"].update(grid_d=[1.5]), r"01_symbolic.grid_d\[0\] must be list of int"),
        (lambda d: d["01_symbolic"].pop("grid_d"), r"01_symbolic lacks parameter\(s\) \['grid_d'\]"),
        (lambda d: d["01_symbolic"].update(device="cuda"), r"set by the pipeline"),
        (lambda d: d.update({"07_extra": {}}), r"unknown notebook section\(s\) \['07_extra'\]"),
        (lambda d: d.pop("01_symbolic"), r"missing section '01_symbolic:'"),
    ],
)
def test_bad_profiles_name_the_parameter(tmp_path, change, message):
    params_dir = write_profile(tmp_path, change)
    with pytest.raises(P.ParameterError, match=message):
        P.load_profile("bad", params_dir, NOTEBOOKS)


def test_choices_and_dtypes():
    dtypes = P.Param(str, many=True, choices=P.DTYPES)
    assert dtypes.check("dtypes", ["float32"]) == ["float32"]
    with pytest.raises(P.ParameterError, match=r"'float8' is not allowed; allowed: \['float64'"):
        dtypes.check("dtypes", ["float32", "float8"])
    with pytest.raises(P.ParameterError, match="must be bool"):
        P.Param(bool).check("flag", 1)


def test_unknown_profile_and_device():
    with pytest.raises(P.ParameterError, match=r"PROFILE='nope' is unknown; allowed: \['paper', 'smoke'\]"):
        P.load_profile("nope", ROOT / "params", NOTEBOOKS)
    with pytest.raises(P.ParameterError, match=r"DEVICE='tpu' is unknown; allowed: \['cpu', 'cuda', 'mps', 'auto'\]"):
        P.resolve_device("tpu")
    assert P.resolve_device("cpu") == "cpu"
    assert P.resolve_device("auto") in {"cpu", "cuda", "mps"}


@pytest.mark.skipif(P.devices_present()["cuda"], reason="this machine has CUDA")
def test_absent_device_is_an_error_before_work():
    result = subprocess.run(
        [sys.executable, "-m", "keybias.pipeline.steps", "--device", "cuda", "--results", "/nonexistent/x", "check", "--only", "01_symbolic"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert result.returncode == 2
    assert "DEVICE='cuda' is not present on this machine" in result.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@pytest.mark.parametrize("args, message", [
    (["PROFILE=nope"], "PROFILE=nope is unknown; allowed: paper smoke"),
    (["DEVICE=tpu"], "DEVICE=tpu is unknown; allowed: cpu cuda mps auto"),
])
def test_make_refuses_unknown_profile_or_device_at_once(args, message):
    result = subprocess.run(["make", "-C", str(ROOT), "all", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert message in result.stderr


def _parameters_cell_values(name: str) -> dict:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    namespace: dict = {}
    exec(compile(cell.source, f"{name}:parameters", "exec"), {}, namespace)
    return {k: v for k, v in namespace.items() if k not in P.INJECTED and not k.startswith("_")}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_defaults_are_the_smoke_profile(name):
    """A notebook opened by hand runs in seconds, exactly as `make test` runs it: its parameters
    cell holds the smoke profile's values, so no default disagrees with a declared setting."""
    profile = P.load_profile("smoke", ROOT / "params", [name])[name]
    defaults = _parameters_cell_values(name)
    differ = {k: (defaults.get(k), v) for k, v in profile.items() if defaults.get(k) != v}
    assert not differ, f"notebooks/{name}.ipynb parameters cell (default, smoke profile): {differ}"
