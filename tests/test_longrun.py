"""Tests for keybias.studies.longrun.measure (measure), longrun_judge (prediction, extrapolation, claims) and longrun_show."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from keybias.build.recorder import Recorder
from keybias.studies import style
from keybias.studies.longrun import judge as J
from keybias.studies.longrun import measure as L
from keybias.studies.longrun import show as S
from keybias.studies.training import measure as training

SMALL = dict(num_layers=2, embed_dim=16, num_heads=2, context=16)
RUN = dict(**SMALL, batch_size=4, lr=3e-3, weight_decay=0.1, log_every=5, probe_every=10, probe_batch=2)


def _held(claims):
    rec = Recorder("08_longrun", "/nonexistent", profile="test", device="cpu")
    return {c["id"]: c["holds"] for c in rec.claims_from(claims)}


@pytest.fixture(scope="module")
def tokens():
    return L.split_tokens(L.corpus()["bytes"])


# ----------------------------------------------------------------------------- data and model


def test_corpus_is_the_pinned_sympy_source():
    text = L.corpus()
    assert text["sha256"] == L.CORPUS_SHA256
    assert text["n_bytes"] == len(text["bytes"]) > 100_000
    assert text["package"].startswith("sympy==")
    assert _held([J.corpus_claim(text["sha256"], L.CORPUS_SHA256)]) == {"longrun-corpus-is-pinned-text": True}
    assert _held([J.corpus_claim("0" * 64, L.CORPUS_SHA256)]) == {"longrun-corpus-is-pinned-text": False}


def test_split_and_windows(tokens):
    assert tokens["train"].dtype == torch.int64 and int(tokens["train"].max()) < L.VOCAB
    starts = L.batch_starts(len(tokens["train"]), 8, 3, 5, seed=1)
    assert starts.shape == (5, 3) and torch.equal(starts, L.batch_starts(len(tokens["train"]), 8, 3, 5, seed=1))
    x, y = L.windows(tokens["train"], starts[0], 8)
    assert x.shape == y.shape == (3, 8) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="shorter"):
        L.batch_starts(5, 8, 1, 1, seed=0)


def test_bad_config_raises_before_work():
    with pytest.raises(ValueError, match="divisible"):
        L.check_config(num_layers=1, embed_dim=10, num_heads=3, context=8, batch_size=1)
    with pytest.raises(ValueError, match="dtype='float16'"):
        L.check_config(**SMALL, batch_size=1, dtypes=["float16"], adam_eps=[1e-8], long_dtype="float16")
    with pytest.raises(ValueError, match="must be in the grid"):
        L.check_config(**SMALL, batch_size=1, dtypes=["float32"], adam_eps=[1e-8], long_dtype="bfloat16")
    with pytest.raises(ValueError, match="context"):
        L.check_config(num_layers=1, embed_dim=8, num_heads=2, context=0, batch_size=1)


def test_model_is_causal_and_key_bias_is_redundant(tokens):
    model = L.build_model(0, **SMALL)
    mhas = training.attention_modules(model)
    assert len(mhas) == SMALL["num_layers"]
    assert all(isinstance(m.b_k, torch.nn.Parameter) and not m.b_k.any() for m in mhas)
    x = tokens["held_out"][:32].reshape(2, 16)
    with torch.no_grad():
        ref = model(x)
        changed = x.clone()
        changed[:, -1] = (changed[:, -1] + 1) % L.VOCAB
        assert torch.equal(model(changed)[:, :-1], ref[:, :-1])  # no position sees a later byte
        for m in mhas:
            m.b_k.copy_(torch.randn(m.embed_dim))
        assert (model(x) - ref).abs().max() < 1e-4  # a shift of every score of a query: softmax ignores it
        mhas[0].b_q.copy_(torch.randn(mhas[0].embed_dim))
        assert (model(x) - ref).abs().max() > 1e-3  # b_q is not redundant


def test_noise_law_matches_notebook_04_closed_form():
    rng = np.random.default_rng(0)
    sigma = np.abs(rng.normal(1e-6, 3e-7, size=(200, 2)))
    law = L._NoiseLaw(2, eps=1e-8)
    for row in sigma:
        law.update(row)
    for layer in range(2):
        expected = training.random_walk_drift(sigma[:, layer], lr=1e-3, eps=1e-8, n_elements=16)
        assert 1e-3 * math.sqrt(16 * law.total[layer]) == pytest.approx(expected, rel=1e-9)


def test_short_run_is_reproducible_and_logs_per_layer(tokens):
    a = L.train_run(0, dtype="bfloat16", eps=1e-8, steps=12, tokens=tokens, **RUN)
    b = L.train_run(0, dtype="bfloat16", eps=1e-8, steps=12, tokens=tokens, **RUN)
    pd.testing.assert_frame_equal(a[0], b[0])
    pd.testing.assert_frame_equal(a[3], b[3])
    traj, probes, timing, entries = a
    assert sorted(traj["step"].unique()) == [5, 10, 12] and set(traj["layer"]) == {0, 1}
    assert set(probes["step"]) == {0, 10, 12}
    assert (traj["drift_b_k"] > 0).all() and (traj["noise_sum"] > 0).all()
    assert (probes["key_norm"] > 0).all() and probes["output_change_rms"].notna().all()
    assert timing["steps"] == 12 and timing["threads"] == 1
    # the entries' displacements are the logged drift, entry by entry
    last = entries[entries["step"] == 12].groupby("layer")["displacement"].apply(lambda d: float(np.sqrt((d**2).sum())))
    assert last.to_numpy() == pytest.approx(traj[traj["step"] == 12]["drift_b_k"].to_numpy(), rel=1e-5)


def test_entry_steps_are_log_spaced_and_end_at_the_last_step():
    steps = L.entry_steps(40_000, 100)
    assert steps[0] == 100 and steps[-1] == 40_000 and 40 <= len(steps) <= 61
    assert all(s % 100 == 0 for s in steps)
    assert sum(s >= 4_000 for s in steps) >= 15  # the last decade has enough points for a fit


# ----------------------------------------------------------------------------- config


def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses
    from pathlib import Path

    from keybias.studies import params

    assert {f.name for f in dataclasses.fields(L.LongRunConfig)} == set(L.PARAMETERS)
    root = Path(__file__).resolve().parents[1] / "params"
    smoke = params.load_profile("smoke", root, ["08_longrun"])["08_longrun"]
    assert L.LongRunConfig().as_dict() == smoke
    paper = params.load_profile("paper", root, ["08_longrun"])["08_longrun"]
    assert L.LongRunConfig.from_mapping(paper).long_steps == paper["long_steps"]


def test_config_rejects_misspelled_and_bad_values_naming_them():
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match="did you mean 'long_steps'"):
        L.LongRunConfig.from_mapping({"long_step": 10})
    with pytest.raises(ParameterError, match="did you mean 'grid_seeds'"):
        L.LongRunConfig().replace(grid_seed=[1])
    with pytest.raises(ParameterError, match="long_steps"):
        L.LongRunConfig(long_steps=0)
    with pytest.raises(ParameterError, match="divisible"):
        L.LongRunConfig(embed_dim=10, num_heads=3)
    with pytest.raises(ParameterError, match="must be in the grid"):
        L.LongRunConfig(long_dtype="bfloat16", dtypes=["float32"])
    with pytest.raises(TypeError):
        L.LongRunConfig(long_step=10)  # the dataclass itself refuses an unknown keyword
    cfg = L.LongRunConfig(grid_seeds=[0, 1])
    assert cfg.grid_seeds == (0, 1) and hash(cfg) == hash(L.LongRunConfig(grid_seeds=(0, 1)))


# ----------------------------------------------------------------------------- prediction and claims


def _walk(steps, rate, *, lr=1e-3, n=16, layers=2, seeds=(0, 1), dtype="bfloat16", eps=1e-8, drift_power=0.5,
          role="grid"):
    """Synthetic trajectories: noise sum S = rate t; drift lr sqrt(n S) (a walk) or, with drift_power 1,
    growing linearly in t (a consistent direction), equal to the walk at t = steps[0]."""
    rows = []
    for seed in seeds:
        for t in steps:
            for layer in range(layers):
                s = rate * t
                walk = lr * math.sqrt(n * s)
                drift = walk * (t / steps[0]) ** (drift_power - 0.5)
                rows.append({"role": role, "dtype": dtype, "eps": eps, "seed": seed, "step": t, "layer": layer,
                             "noise_sum": s, "drift_b_k": drift, "norm_b_k": drift, "grad_rms_b_k": 1e-6,
                             "loss": 2.0, "n_bias": n, "lr": lr})
    return pd.DataFrame(rows)


def _probes(steps, key_norm=5.0, layers=2):
    return pd.DataFrame([{"step": t, "layer": layer, "key_norm": key_norm, "norm_b_k": 0.1,
                          "output_change_rms": 1e-3, "predicted_change_rms": 1e-3}
                         for t in (0, *steps) for layer in range(layers)])


LONG_STEPS = list(range(100, 10_001, 100))
# the paper profile's long run: 40,000 steps logged every 100, one layer of 32 entries
PAPER_STEPS, PAPER_LOG, PAPER_ENTRIES = 40_000, 100, 32


def _entries(power: float, *, seed: int = 0, n: int = PAPER_ENTRIES, layers: int = 1, steps: int = PAPER_STEPS,
             lr: float = 1e-3) -> pd.DataFrame:
    """Per-entry displacements as `train_run` logs them: each entry an independent Adam-like walk of
    +-lr steps (its RMS grows like t^(1/2)), multiplied by (t / t_0)^(power - 1/2), so the drift grows
    like t^power with the walk's own fluctuations (power 1/2: a pure walk)."""
    rng = np.random.default_rng(seed)
    keep = np.array(L.entry_steps(steps, PAPER_LOG))
    rows = []
    for layer in range(layers):
        walks = np.cumsum(rng.choice([-lr, lr], size=(steps, n)), axis=0)[keep - 1]
        scaled = walks * (keep[:, None] / keep[0]) ** (power - 0.5)
        for k, t in enumerate(keep):
            rows += [{"role": "long", "dtype": "float32", "eps": 1e-12, "seed": 3, "step": int(t), "layer": layer,
                      "entry": j, "displacement": float(v)} for j, v in enumerate(scaled[k])]
    return pd.DataFrame(rows)


def _exponent_holds(entries) -> bool:
    return _held([J.exponent_claim(J.drift_exponent(entries))])["longrun-drift-exponent-decided"]


def test_prediction_continues_the_grid_rate():
    grid = _walk(list(range(100, 1001, 100)), rate=2.0)
    other = _walk(list(range(100, 1001, 100)), rate=50.0, dtype="float32")  # another setting: ignored
    pred = J.predict_drift(pd.concat([grid, other]), dtype="bfloat16", eps=1e-8, steps=[500, 1000, 4000], lr=1e-3,
                           n_bias=16)
    assert pred["predicted_drift"].to_numpy() == pytest.approx(
        [1e-3 * math.sqrt(16 * 2.0 * t) for t in (500, 1000, 4000)] * 2, rel=1e-9)
    with pytest.raises(ValueError, match="no grid run"):
        J.predict_drift(grid, dtype="float32", eps=1e-6, steps=[10], lr=1e-3, n_bias=16)


def _judged(long):
    grid = _walk(list(range(100, 1001, 100)), rate=2.0)
    pred = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=LONG_STEPS, lr=1e-3, n_bias=16)
    return J.compare_with_prediction(long, pred, lr=1e-3)


def test_comparison_with_the_law():
    comparison = _judged(_walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long"))
    assert comparison["log2_vs_predicted"].abs().max() < 1e-9
    assert comparison["log2_vs_own_law"].abs().max() < 1e-9


def test_walks_and_systematic_drifts_are_decided_and_named():
    for seed in range(5):
        ex = J.drift_exponent(_entries(0.5, seed=seed))
        assert ex["exponent_low"].iloc[0] < ex["exponent"].iloc[0] < ex["exponent_high"].iloc[0]
        assert ex["exponent"].iloc[0] == pytest.approx(0.5, abs=0.1)
        assert _exponent_holds(_entries(0.5, seed=seed)) and J.drift_verdict(ex) == "random walk"
        systematic = J.drift_exponent(_entries(1.0, seed=seed))
        assert _exponent_holds(_entries(1.0, seed=seed)) and J.drift_verdict(systematic) == "systematic drift"


@pytest.mark.claim_mutation("longrun-drift-exponent-decided")
def test_exponent_claim_fails_for_a_drift_growing_like_t_to_the_0_7(record_mutation):
    # the smallest violation: a drift that grows like T^0.7 (with a walk's fluctuations) is neither a
    # walk nor a systematic drift at this length: the run does not decide, and the claim fails
    for seed in range(8):
        entries = _entries(0.7, seed=seed)
        record_mutation(J.exponent_claim(J.drift_exponent(entries)))
        assert J.drift_verdict(J.drift_exponent(entries)) == "undecided"
    nan = _entries(1.0)
    nan.loc[nan.index[-1], "displacement"] = np.nan
    assert not _exponent_holds(nan)


def test_exponent_is_read_over_the_last_decade_only():
    entries = _entries(0.5)
    ex = J.drift_exponent(entries)
    assert ex["window_start"].iloc[0] >= PAPER_STEPS / 10 and ex["steps"].iloc[0] == PAPER_STEPS
    assert ex["entries"].iloc[0] == PAPER_ENTRIES
    early = entries.copy()
    early.loc[early["step"] < PAPER_STEPS / 10, "displacement"] *= 100  # the first nine tenths of log-time: ignored
    assert J.drift_exponent(early)["exponent"].iloc[0] == pytest.approx(ex["exponent"].iloc[0])


def test_extrapolation_uses_the_measured_exponent():
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    exps = pd.DataFrame({"layer": [0, 1], "exponent": [0.5, 0.5], "exponent_high": [0.6, 0.6]})
    ext = J.extrapolate(long, _probes(LONG_STEPS, key_norm=5.0), exps, horizons=[100_000, 1_000_000])
    norm_end = 1e-3 * math.sqrt(16 * 2.0 * 10_000)
    assert ext["ratio_at_1000000"].iloc[0] == pytest.approx(norm_end * 100**0.5 / 5)
    assert ext["ratio_high_at_1000000"].iloc[0] == pytest.approx(norm_end * 100**0.6 / 5)
    assert ext["steps_to_key_norm"].iloc[0] == pytest.approx(10_000 * (5 / norm_end) ** 2)
    big = J.extrapolate(long, _probes(LONG_STEPS, key_norm=0.1), exps, horizons=[1_000_000])
    assert big["steps_to_key_norm"].iloc[0] == 10_000  # already there


def test_empty_selection_fails_loudly():
    with pytest.raises(ValueError, match="empty"):
        J.drift_exponent(_entries(0.5).iloc[0:0])


def test_figures_tables_and_macros():
    grid = pd.concat([_walk(list(range(100, 1001, 100)), rate=r, dtype=d, eps=e)
                      for r, d, e in ((2.0, "bfloat16", 1e-8), (0.01, "float32", 1e-8))], ignore_index=True)
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    pred = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=LONG_STEPS, lr=1e-3, n_bias=16)
    far = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=[10, 1000, 1_000_000], lr=1e-3, n_bias=16)
    comparison = J.compare_with_prediction(long, pred, lr=1e-3)
    probes = _probes(LONG_STEPS)
    exps = J.drift_exponent(_entries(0.5, layers=2, steps=10_000))
    ext = J.extrapolate(long, probes, exps, horizons=[100_000, 1_000_000])
    for fig in (S.plot_drift(grid, comparison, ext, probes, far), S.plot_output_error(probes)):
        assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
        assert fig.get_figwidth() in (pytest.approx(style.FULL_WIDTH), pytest.approx(style.HALF_WIDTH))
    grid_probes = pd.concat([_probes([1000]).assign(dtype=d, eps=e) for d, e in (("bfloat16", 1e-8), ("float32", 1e-8))])
    summary = J.grid_summary(grid, grid_probes, lr=1e-3)
    assert list(summary["noise_rate"]) == pytest.approx([2.0, 0.01])
    assert summary["steps_to_key_norm"].iloc[0] == pytest.approx(25 / (1e-6 * 16 * 2.0))
    assert set(J.grid_macros(summary)) == {"LongRateBfloatSixteenEpsEight", "LongStepsToKeyBfloatSixteenEpsEight",
                                           "LongRateFloatThirtyTwoEpsEight", "LongStepsToKeyFloatThirtyTwoEpsEight"}
    assert r"\toprule" in S.grid_table_latex(summary)
    assert S.extrapolation_table_latex(ext, [100_000, 1_000_000]).count(r"\\") == 3  # header and two layers
    macros = J.macros(comparison=comparison, extrap=ext, exponents=exps, long=long, probes=probes, grid=grid,
                      horizons=[100_000, 1_000_000])
    assert macros["LongGridSettings"] == 2 and "LongRatioAtTenSix" in macros and "LongExponentHigh" in macros
    assert macros["LongDriftVerdict"] == "random walk" and macros["LongExponentSeparation"] > 0
    assert all(name.isalpha() for name in macros)
