"""The GPU profile: its command (run here on the CPU at tiny sizes), the loader of recorded files,
and the judge of notebook 09 on doctored data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from keybias.core.recorder import Claim
from keybias.studies.gpu import judge, measure, show
from keybias.studies.params import ParameterError

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "recorded" / "gpu-h200"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu")
    assert measure.main(["--out", str(out), "--commit", "0" * 40, "--device", "cpu", "--quick"]) == 0
    return out


def test_quick_run_writes_every_file_the_loader_needs(quick_run):
    data = measure.load_recorded(quick_run)
    record = data["runs"]["run"]
    assert set(record["sections"]) == set(measure.SECTIONS)
    assert all(s["status"] == "measured" for s in record["sections"].values())
    assert record["machine"]["commit"] == "0" * 40
    assert not data["invariance_configs"].empty and not data["precision_errors"].empty


def test_a_missing_recorded_file_is_named_before_anything_is_judged(quick_run, tmp_path):
    copy = tmp_path / "rec"
    shutil.copytree(quick_run, copy)
    (copy / "cost_model.csv").unlink()
    with pytest.raises(FileNotFoundError, match="cost_model.csv"):
        measure.load_recorded(copy)


def test_a_section_no_run_record_covers_is_an_error(quick_run, tmp_path):
    copy = tmp_path / "rec"
    shutil.copytree(quick_run, copy)
    record = json.loads((copy / "run.json").read_text())
    del record["sections"]["memory"]
    (copy / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="memory"):
        measure.load_recorded(copy)


def test_config_fields_match_parameters_and_the_profiles():
    assert set(measure.GpuConfig.PARAMETERS) == {"recorded"}
    for profile in ("smoke", "paper"):
        section = yaml.safe_load((ROOT / "params" / f"{profile}.yaml").read_text())["09_gpu"]
        assert measure.GpuConfig.from_mapping(section) == measure.GpuConfig()
    with pytest.raises(ParameterError, match="did you mean 'recorded'"):
        measure.GpuConfig.from_mapping({"recordd": "x"})


def test_unfinished_section_in_a_run_record_stops_the_judge():
    runs = {n: json.loads((RECORDED / f"{n}.json").read_text()) for n in ("run_invariance",)}
    runs["run_invariance"]["sections"]["invariance"]["status"] = "failed"
    with pytest.raises(ValueError, match="did not finish"):
        judge.machine_macros(runs)


def _allocator(extra_bytes: int = 0) -> pd.DataFrame:
    rows = pd.read_csv(RECORDED / "memory_allocator.csv")
    rows.loc[0, "measured_bytes"] += extra_bytes
    return rows


def test_the_recorded_allocator_bytes_equal_the_count():
    [claim], macros = judge.memory_claims(_allocator())
    assert claim.holds and claim.value == 0
    assert macros["GpuMemoryRows"] == 6


@pytest.mark.claim_mutation(judge.GPU_MEMORY_ALLOCATOR_MATCHES_COUNT.id)
def test_one_extra_float_of_optimizer_state_fails_the_allocator_claim(record_mutation):
    # the smallest violation: one 4-byte value more than the count, at one width and optimizer
    [claim], _ = judge.memory_claims(_allocator(extra_bytes=4))
    record_mutation(claim)


def test_no_measured_allocator_row_is_an_error():
    rows = _allocator().assign(status="not run")
    with pytest.raises(ValueError, match="no allocator row"):
        judge.memory_claims(rows)


def test_on_gpu_renames_id_statement_and_implied_by():
    c = judge.on_gpu(Claim("x-y", "It holds.", 0, 0, kind="implied", implied_by=("x-z",)), "NVIDIA H200")
    assert (c.id, c.implied_by) == ("gpu-x-y", ("gpu-x-z",))
    assert c.statement.startswith("On the NVIDIA H200:")


def test_transfer_sentence_names_each_failing_check_and_only_those():
    holds = Claim("precision-a", "s", 0.5, 1.0, kind="test")
    fails = Claim("invariance-b_c", "s", 2.0, 1.0, kind="test")
    table = show.transfer_table([holds, fails])
    assert list(table["study"]) == ["precision (03)", "invariance (02)"]
    sentence = show.transfer_sentence(table)
    assert r"\texttt{invariance-{}\allowbreak{}b\_c}" in sentence and "precision-a" not in sentence
    assert " fails;" in sentence
    assert show.transfer_sentence(show.transfer_table([holds])) == "Every one of these checks holds on the GPU."
    assert "&" in show.transfer_latex(table) and "fails" in show.transfer_latex(table)


def test_recorded_precision_grid_is_even_and_a_broken_grid_is_refused():
    errors = pd.read_csv(RECORDED / "precision_errors.csv")
    assert judge.grid_step_log10(errors) == pytest.approx(4.5 / 18)
    broken = errors[errors["ratio"] != sorted(errors["ratio"].unique())[3]]
    with pytest.raises(ValueError, match="even log grid"):
        judge.grid_step_log10(broken)
