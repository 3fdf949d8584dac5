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
    traj, probes, timing = a
    assert sorted(traj["step"].unique()) == [5, 10, 12] and set(traj["layer"]) == {0, 1}
    assert set(probes["step"]) == {0, 10, 12}
    assert (traj["drift_b_k"] > 0).all() and (traj["noise_sum"] > 0).all()
    assert (probes["key_norm"] > 0).all() and probes["output_change_rms"].notna().all()
    assert timing["steps"] == 12 and timing["threads"] == 1


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


def test_walk_that_follows_the_law_passes():
    comparison = _judged(_walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long"))
    held = _held([J.prediction_claim(comparison), J.own_law_claim(comparison)])
    assert all(held.values())
    assert comparison["log2_vs_predicted"].abs().max() < 1e-9


@pytest.mark.claim_mutation("longrun-drift-matches-grid-prediction")
def test_prediction_claim_fails_when_the_noise_level_changes():
    # the long run's noise is 9x the grid's: its (self-consistent) walk is 3x the prediction
    comparison = _judged(_walk(LONG_STEPS, rate=18.0, seeds=(2,), role="long"))
    assert _held([J.prediction_claim(comparison)]) == {"longrun-drift-matches-grid-prediction": False}


@pytest.mark.claim_mutation("longrun-drift-is-noise-walk", "longrun-drift-matches-grid-prediction")
def test_noise_walk_claims_fail_on_a_consistent_direction():
    # b_k moving in a consistent direction: the drift grows like t, not sqrt(t)
    comparison = _judged(_walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long", drift_power=1.0))
    held = _held([J.prediction_claim(comparison), J.own_law_claim(comparison)])
    assert held == {"longrun-drift-matches-grid-prediction": False, "longrun-drift-is-noise-walk": False}


def test_extrapolation_formula():
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    ext = J.extrapolate(long, _probes(LONG_STEPS, key_norm=5.0), lr=1e-3, horizons=[100_000, 1_000_000])
    per_step = 1e-6 * 16 * 2.0
    norm_end = 1e-3 * math.sqrt(16 * 2.0 * 10_000)
    assert ext["steps_to_key_norm"].iloc[0] == pytest.approx(10_000 + (25 - norm_end**2) / per_step)
    assert ext["ratio_at_1000000"].iloc[0] == pytest.approx(math.sqrt(norm_end**2 + per_step * 990_000) / 5)
    # at 10^6 steps ||b_k|| = 5.66 > ||k|| = 5: the regime is reached, the claim fails
    assert _held([J.extrapolation_claim(ext)]) == {"longrun-bk-below-key-norm-at-bert-length": False}


def test_extrapolation_claim_holds_for_large_keys_or_no_walk():
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    far = J.extrapolate(long, _probes(LONG_STEPS, key_norm=50.0), lr=1e-3, horizons=[1_000_000])
    assert _held([J.extrapolation_claim(far)]) == {"longrun-bk-below-key-norm-at-bert-length": True}
    still = _walk(LONG_STEPS, rate=0.0, seeds=(2,), role="long")
    never = J.extrapolate(still, _probes(LONG_STEPS), lr=1e-3, horizons=[1_000_000])
    assert never["steps_to_key_norm"].iloc[0] == math.inf
    assert _held([J.extrapolation_claim(never)]) == {"longrun-bk-below-key-norm-at-bert-length": True}


@pytest.mark.claim_mutation("longrun-bk-below-key-norm-at-bert-length")
def test_extrapolation_claim_fails_when_the_walk_outruns_the_keys():
    # a noise rate 100x larger: ||b_k|| passes ||k|| = 50 long before 10^6 steps
    fast = _walk(LONG_STEPS, rate=200.0, seeds=(2,), role="long")
    ext = J.extrapolate(fast, _probes(LONG_STEPS, key_norm=50.0), lr=1e-3, horizons=[1_000_000])
    assert _held([J.extrapolation_claim(ext)]) == {"longrun-bk-below-key-norm-at-bert-length": False}
    nan = ext.copy()
    nan.loc[0, "ratio_at_1000000"] = np.nan
    assert _held([J.extrapolation_claim(nan)]) == {"longrun-bk-below-key-norm-at-bert-length": False}


def test_empty_selection_fails_loudly():
    comparison = _judged(_walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long"))
    with pytest.raises(ValueError, match="empty"):
        J.prediction_claim(comparison[comparison["step"] <= 1000])
    nan = comparison.copy()
    nan.loc[nan.index[-1], "log2_vs_predicted"] = np.nan
    assert _held([J.prediction_claim(nan)]) == {"longrun-drift-matches-grid-prediction": False}


def test_figures_tables_and_macros():
    grid = pd.concat([_walk(list(range(100, 1001, 100)), rate=r, dtype=d, eps=e)
                      for r, d, e in ((2.0, "bfloat16", 1e-8), (0.01, "float32", 1e-8))], ignore_index=True)
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    pred = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=LONG_STEPS, lr=1e-3, n_bias=16)
    far = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=[10, 1000, 1_000_000], lr=1e-3, n_bias=16)
    comparison = J.compare_with_prediction(long, pred, lr=1e-3)
    probes = _probes(LONG_STEPS)
    ext = J.extrapolate(long, probes, lr=1e-3, horizons=[100_000, 1_000_000])
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
    macros = J.macros(comparison=comparison, extrap=ext, probes=probes, grid=grid, horizons=[100_000, 1_000_000])
    assert macros["LongGridSettings"] == 2 and "LongRatioAtTenSix" in macros
    assert all(name.isalpha() for name in macros)
