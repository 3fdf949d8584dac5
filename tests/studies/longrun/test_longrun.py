"""Tests for keybias.studies.longrun.measure (measure), longrun_judge (prediction, extrapolation, claims) and longrun_show."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from keybias.core.recorder import Recorder
from keybias.core.reduce import NonFiniteValues
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
    assert _held([J.corpus_claim(text["sha256"], L.CORPUS_SHA256)]) == {J.LONGRUN_CORPUS_IS_PINNED_TEXT.id: True}
    assert _held([J.corpus_claim("0" * 64, L.CORPUS_SHA256)]) == {J.LONGRUN_CORPUS_IS_PINNED_TEXT.id: False}


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
    root = Path(__file__).resolve().parents[3] / "params"
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
    return _held([J.exponent_claim(J.drift_exponent(entries))])[J.LONGRUN_DRIFT_EXPONENT_DECIDED.id]


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


@pytest.mark.claim_mutation(J.LONGRUN_DRIFT_EXPONENT_DECIDED.id)
def test_exponent_claim_fails_for_a_drift_growing_like_t_to_the_0_7(record_mutation):
    # the smallest violation: a drift that grows like T^0.7 (with a walk's fluctuations) is neither a
    # walk nor a systematic drift at this length: the run does not decide, and the claim fails
    for seed in range(8):
        entries = _entries(0.7, seed=seed)
        record_mutation(J.exponent_claim(J.drift_exponent(entries)))
        assert J.drift_verdict(J.drift_exponent(entries)) == "undecided"
    nan = _entries(1.0)
    nan.loc[nan.index[-1], "displacement"] = np.nan
    with pytest.raises(NonFiniteValues, match="displacements: 1 of"):  # NaN never passes: it raises
        _exponent_holds(nan)


def test_exponent_is_read_over_the_last_decade_only():
    entries = _entries(0.5)
    ex = J.drift_exponent(entries)
    assert ex["window_start"].iloc[0] >= PAPER_STEPS / 10 and ex["steps"].iloc[0] == PAPER_STEPS
    assert ex["entries"].iloc[0] == PAPER_ENTRIES
    early = entries.copy()
    early.loc[early["step"] < PAPER_STEPS / 10, "displacement"] *= 100  # the first nine tenths of log-time: ignored
    assert J.drift_exponent(early)["exponent"].iloc[0] == pytest.approx(ex["exponent"].iloc[0])


def test_empty_selection_fails_loudly():
    with pytest.raises(ValueError, match="empty"):
        J.drift_exponent(_entries(0.5).iloc[0:0])


def test_figures_tables_and_macros():
    grid = pd.concat([_walk(list(range(100, 1001, 100)), rate=r, dtype=d, eps=e)
                      for r, d, e in ((2.0, "bfloat16", 1e-8), (0.01, "float32", 1e-8))], ignore_index=True)
    long = _walk(LONG_STEPS, rate=2.0, seeds=(2,), role="long")
    pred = J.predict_drift(grid, dtype="bfloat16", eps=1e-8, steps=LONG_STEPS, lr=1e-3, n_bias=16)
    comparison = J.compare_with_prediction(long, pred, lr=1e-3)
    probes = _probes(LONG_STEPS)
    exps = J.drift_exponent(_entries(0.5, layers=2, steps=10_000))
    for fig in (S.plot_drift(grid, comparison, probes), S.plot_output_error(probes)):
        assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
        assert fig.get_figwidth() in (pytest.approx(style.FULL_WIDTH), pytest.approx(style.HALF_WIDTH))
    grid_probes = pd.concat([_probes([1000]).assign(dtype=d, eps=e) for d, e in (("bfloat16", 1e-8), ("float32", 1e-8))])
    summary = J.grid_summary(grid, grid_probes, lr=1e-3)
    assert list(summary["noise_rate"]) == pytest.approx([2.0, 0.01])
    assert set(J.grid_macros(summary)) == {"LongRateBfloatSixteenEpsEight", "LongRateFloatThirtyTwoEpsEight"}
    assert r"\toprule" in S.grid_table_latex(summary)
    macros = J.macros(comparison=comparison, exponents=exps, long=long, probes=probes, grid=grid)
    assert macros["LongGridSettings"] == 2 and "LongExponentHigh" in macros
    assert not any(name.startswith(("LongRatio", "LongStepsToKey")) for name in macros)  # nothing extrapolated
    assert macros["LongDriftVerdict"] == "random walk" and macros["LongExponentSeparation"] > 0
    assert all(name.isalpha() for name in macros)


# ----------------------------------------------------------------------------- the recorded full grid

from keybias.studies.longrun import judge_full as F  # noqa: E402
from keybias.studies.longrun import record as R  # noqa: E402

FULL_SEEDS = (21, 22, 23)
REGIMES = (("float32", 1e-12), ("float32", 1e-8), ("bfloat16", 1e-8))


def _full_frames(*, alpha=1.0, sigma_power=0.0, along=0.2, cos=0.6, steps=20_000, short=5_000, lr=1e-3):
    """Synthetic recorded files (`record.load_recorded`'s frames) for both sizes, three seeds and three
    regimes: per entry a displacement d_i(t) = c t^alpha (entries equal), ||b_k|| = drift, sigma =
    1e-9 ||b_k||^sigma_power, the bias along the drift `along` in every interval, and the noise sum's
    rate 1 (eps 1e-12, bfloat16) or 0.01 (float32 eps 1e-8), whose drift is 0.1 of the small-eps one."""
    traj, probes, entries = [], [], []
    for size, n, layers in (("small", 32, 1), ("medium", 64, 2)):
        for dtype, eps in REGIMES:
            t_end = short if dtype == "bfloat16" else steps
            rate = 0.01 if (dtype, eps) == ("float32", 1e-8) else 1.0
            damp = 0.1 if rate < 1 else 1.0
            keep = set(L.entry_steps(t_end, 100))
            for seed in FULL_SEEDS:
                for layer in range(layers):
                    # velocity at the end of alpha * D / t must equal lr * along * sigma / (sigma + eps)
                    for t in range(100, t_end + 1, 100):
                        drift = damp * lr * along * steps * (t / steps) ** alpha / alpha
                        sigma = 1e-9 * drift ** sigma_power
                        traj.append({"size": size, "role": "full", "dtype": dtype, "eps": eps, "seed": seed,
                                     "step": t, "layer": layer, "norm_b_k": drift, "drift_b_k": drift,
                                     "grad_rms_b_k": sigma, "grad_mean_rms_b_k": sigma / 10,
                                     "grad_along_drift": along * (1 + 0.01 * ((t // 100) % 3 - 1)),
                                     "noise_sum": rate * t, "loss": 2.0, "lr": lr, "n_bias": n})
                        if t in keep:
                            entries += [{"size": size, "role": "full", "dtype": dtype, "eps": eps, "seed": seed,
                                         "step": t, "layer": layer, "entry": j, "displacement": drift / math.sqrt(n)}
                                        for j in range(n)]
                    for t in (0, t_end):
                        probes.append({"size": size, "role": "full", "dtype": dtype, "eps": eps, "seed": seed,
                                       "step": t, "layer": layer, "key_norm": 8.0, "query_norm": 10.0,
                                       "norm_b_k": 1.0, "cos_b_k_mean_query": cos if t else 0.0,
                                       "output_change_rms": 1e-7, "predicted_change_rms": 1e-7,
                                       "predicted_bias_rms": 1e-8})
    return pd.DataFrame(traj), pd.DataFrame(probes), pd.DataFrame(entries)


@pytest.fixture(scope="module")
def full_units():
    return F.units(*_full_frames())


def _holds(claims):
    return _held(claims)


def test_full_grid_units_recover_the_planted_numbers(full_units):
    u = full_units
    assert len(u) == 3 * 3 * (1 + 2)
    small = u[(u["size"] == "small") & (u["dtype"] == "float32") & (u["eps"] == 1e-12)]
    assert small["exponent"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert small["step_rate"].to_numpy() == pytest.approx(1.0)
    assert small["noise_elasticity"].to_numpy() == pytest.approx(0.0, abs=1e-9)
    assert small["cos_mean_query_sqrt_n"].to_numpy() == pytest.approx(0.6 * math.sqrt(32))
    assert (small["velocity_measured"] / small["velocity_predicted"]).to_numpy() == pytest.approx(1.0, rel=0.05)
    spans = F.intervals(u)
    row = spans[(spans["size"] == "small") & (spans["eps"] == 1e-12)].iloc[0]
    assert row["seeds"] == 3 and row["low"] <= row["mean"] <= row["high"]
    planted = F.units(*_full_frames(alpha=0.5, sigma_power=1.0))
    s = planted[(planted["size"] == "small") & (planted["eps"] == 1e-12)]
    assert s["exponent"].to_numpy() == pytest.approx(0.5, abs=1e-6)
    assert s["noise_elasticity"].to_numpy() == pytest.approx(1.0, abs=1e-6)


def test_full_grid_claims_hold_on_the_planted_good_case(full_units):
    claims = F.claims(full_units)
    assert all(_holds(claims).values()), _holds(claims)
    ids = [c.id for c in claims]
    assert len(ids) == len(set(ids)) == len(F.explanation_claims(full_units)) + len(F.regime_claims(full_units)) == 7
    tests = [c.id for c in claims if c.kind == "test"]
    assert set(tests) == set(F.FINDING_OF)  # every test claim decides a named finding
    assert set(F.FINDING_OF.values()) == {"long-run-drift", "adam-drift-regimes"}


def test_intervals_spread_over_seeds_not_entries(full_units):
    u = full_units.copy()
    sel = (u["size"] == "small") & (u["eps"] == 1e-12) & (u["dtype"] == "float32")
    u.loc[sel, "exponent"] = [0.9, 1.0, 1.1]
    row = F.intervals(u).query("size == 'small' and eps == 1e-12 and dtype == 'float32'").iloc[0]
    from scipy import stats

    assert row["high"] - row["mean"] == pytest.approx(stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3))


def test_full_grid_macros_and_text(full_units):
    spans = pd.concat([F.intervals(full_units, c) for c in ("exponent", "step_rate", "noise_elasticity")])
    run = {"wall_seconds": 1500.0, "commit": "0123456789", "cpu": "AMD EPYC", "torch": "2.13.0+cpu"}
    m = F.macros(full_units, spans, run)
    assert all(name.isalpha() for name in m)
    assert m["LongFullRuns"] == 18 and m["LongFullSeeds"] == 3 and m["LongFullMinutes"] == 25
    assert m["LongFullExponentSmallFloatEpsTwelve"] == pytest.approx(1.0, abs=1e-6)
    assert m["LongFullDampingMax"] == pytest.approx(0.1)
    text = F.findings_text(full_units, spans, m)
    assert "faster than a random walk" in text and "does not grow" in text
    slow = F.units(*_full_frames(alpha=0.5, sigma_power=1.0))
    spans_slow = pd.concat([F.intervals(slow, c) for c in ("exponent",)])
    assert "no faster than a walk" in F.findings_text(slow, spans_slow, F.macros(slow, spans_slow, run))


def test_full_grid_figures_and_table(full_units):
    traj, _, _ = _full_frames()
    spans = F.intervals(full_units)
    fig, caption = S.plot_full_drift(traj.assign(num_layers=1, embed_dim=32), spans)
    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT and fig.get_figwidth() == pytest.approx(style.FULL_WIDTH)
    assert "1.00 [" in caption
    fig, caption = S.plot_explanation(traj, full_units)
    assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT and "hardly follows" in caption
    assert S.full_table_latex(full_units).count(r"\\") == 1 + 18


def test_load_recorded_names_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="longrun_full_trajectory.csv"):
        R.load_recorded(tmp_path)
    assert len(R.grid()) == 18 and {r["seed"] for r in R.grid()} == set(R.SEEDS)
    assert not set(R.SEEDS) & {0, 1, 2, 3, 5}  # fresh: not the seeds of the earlier analysis or its pilot


def test_recorded_grid_is_committed_and_matches_the_grid():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "recorded" / "longrun-cpu"
    data = R.load_recorded(folder)
    assert not data["run"]["dirty"] and not data["run"]["quick"]
    runs = data["times"][["size", "dtype", "eps", "seed", "steps"]]
    assert len(runs) == len(R.grid())
    for run in R.grid():
        row = runs[(runs["size"] == run["size"]) & (runs["dtype"] == run["dtype"])
                   & np.isclose(runs["eps"], run["eps"], rtol=1e-9, atol=0) & (runs["seed"] == run["seed"])]
        assert len(row) == 1 and int(row["steps"].iloc[0]) == run["steps"]


def _mutated(full_units, column, value, *, size="small", dtype="float32", eps=1e-12, rows=None):
    u = full_units.copy()
    sel = (u["size"] == size) & (u["dtype"] == dtype) & np.isclose(u["eps"], eps, rtol=1e-9, atol=0)
    idx = u.index[sel] if rows is None else u.index[sel][:rows]
    u.loc[idx, column] = value
    return u


def test_the_retired_bias_prediction_is_still_judged_and_reported(full_units):
    """Retired after the recorded grid contradicted it: it is no claim, but every build still judges
    it as it was registered, and a run with a bias of 2.9 standard errors fails it."""
    assert "longrun-gradient-biased-along-drift" not in {c.id for c in F.claims(full_units)}
    (reported,) = F.failed_predictions(full_units)
    assert reported["id"] == "longrun-gradient-biased-along-drift" and reported["bound"] == F.BIAS_SE_BOUND
    u = _mutated(full_units, "grad_along_drift_se", 1.0, eps=1e-8, rows=1)
    u = u.copy()
    u.loc[u["grad_along_drift_se"] == 1.0, "grad_along_drift"] = 2.9
    assert not F.bias_claim(u).holds


@pytest.mark.claim_mutation(F.LONGRUN_VELOCITY_FROM_GRADIENT_BIAS.id)
def test_mutation_one_run_moving_2_02_times_its_predicted_velocity(full_units, record_mutation):
    u = full_units.copy()
    i = u.index[(u["size"] == "small") & (u["dtype"] == "float32")][0]
    u.loc[i, "velocity_measured"] = 2.02 * u.loc[i, "velocity_predicted"]
    record_mutation(F.velocity_claim(u))
    u.loc[i, "velocity_measured"] = -u.loc[i, "velocity_predicted"]  # opposite sign: fails
    record_mutation(F.velocity_claim(u))



@pytest.mark.claim_mutation(F.LONGRUN_NOISE_NOT_TRACKING_BIAS.id)
def test_mutation_noise_elasticity_at_one_half(full_units, record_mutation):
    u = _mutated(_mutated(full_units, "noise_elasticity", 0.5), "noise_elasticity", 0.5, eps=1e-8)
    record_mutation(F.noise_claim(u))


@pytest.mark.claim_mutation(F.ADAM_FULL_STEPS_FLOAT32_SMALL_EPS.id)
def test_mutation_one_float32_small_eps_run_at_rate_0_49(full_units, record_mutation):
    claims = F.step_rate_claims(_mutated(full_units, "step_rate", 0.49, size="medium", rows=1))
    record_mutation(claims[0])


@pytest.mark.claim_mutation(F.ADAM_FULL_STEPS_BFLOAT16_DEFAULT_EPS.id)
def test_mutation_one_bfloat16_run_at_rate_0_49(full_units, record_mutation):
    claims = F.step_rate_claims(_mutated(full_units, "step_rate", 0.49, dtype="bfloat16", eps=1e-8, rows=1))
    record_mutation(claims[1])


@pytest.mark.claim_mutation(F.ADAM_SGD_STEPS_FLOAT32_DEFAULT_EPS.id)
def test_mutation_one_float32_default_eps_run_at_rate_0_26(full_units, record_mutation):
    claims = F.step_rate_claims(_mutated(full_units, "step_rate", 0.26, eps=1e-8, rows=1))
    record_mutation(claims[2])


@pytest.mark.claim_mutation(F.ADAM_DEFAULT_EPS_DAMPS_DRIFT.id)
def test_mutation_one_pair_damped_only_to_0_51(full_units, record_mutation):
    u = full_units.copy()
    big = u.index[(u["size"] == "medium") & (u["dtype"] == "float32") & (u["eps"] == 1e-12)][0]
    key = u.loc[big, ["size", "seed", "layer"]]
    small = u.index[(u["size"] == key["size"]) & (u["seed"] == key["seed"]) & (u["layer"] == key["layer"])
                    & (u["dtype"] == "float32") & (u["eps"] == 1e-8)][0]
    u.loc[small, "drift_end"] = 0.51 * u.loc[big, "drift_end"]
    record_mutation(F.damping_claims(u)[0])


def test_damping_control_fails_when_bfloat16_is_damped_too(full_units):
    u = _mutated(full_units, "drift_at_short", 0.0, dtype="bfloat16", eps=1e-8, rows=1)
    assert _holds(F.damping_claims(u)[1:]) == {F.ADAM_DRIFT_RATIO_CONTROL_BFLOAT16.id: False}


# ----------------------------------------------------------------------------- the pure-noise null


def test_along_drift_is_nan_before_any_drift_and_signed_by_descent():
    g = np.array([[1.0, 0.0], [0.0, 2.0]])
    before = np.array([[0.0, 0.0], [0.0, -3.0]])
    along = L.along_drift(g, np.array([1.0, 2.0]), before)
    assert math.isnan(along[0]) and along[1] == pytest.approx(1.0)  # -g . d / (|d| rms) = 6 / (3 * 2)


def test_adam_noise_walk_is_torch_adam_on_the_same_gradients():
    sigma, eps, n, lr, seed = np.array([1e-9, 3e-9]), 1e-8, 3, 1e-3, 7
    log_steps = [1, 2, 5, 9]
    walk = L.adam_noise_walk(sigma, eps, log_steps=log_steps, n_bias=n, lr=lr, seed=seed)
    assert list(walk.columns[:5]) == ["walk", "step", "drift_b_k", "grad_rms_b_k", "grad_along_drift"]
    rng = np.random.default_rng(seed)  # the walk's draws, one block per logged interval
    p = torch.zeros(2, n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr, betas=(0.9, 0.999), eps=eps, foreach=False)
    done, moved_before = 0, np.zeros((2, n))
    for t in log_steps:
        g = rng.standard_normal((t - done, 2, n)) * sigma[None, :, None]
        for gi in g:
            p.grad = torch.from_numpy(gi.copy())
            opt.step()
        rows = walk[walk["step"] == t].sort_values("walk")
        moved = p.detach().numpy()
        assert rows["drift_b_k"].to_numpy() == pytest.approx(np.linalg.norm(moved, axis=1), rel=1e-10)
        rms = np.sqrt((g**2).mean(axis=(0, 2)))
        assert rows["grad_rms_b_k"].to_numpy() == pytest.approx(rms, rel=1e-12)
        along = L.along_drift(g.mean(axis=0), rms, moved_before)
        np.testing.assert_allclose(rows["grad_along_drift"].to_numpy(), along, rtol=1e-12)
        moved_before, done = moved.copy(), t
    assert walk["grad_along_drift"][walk["step"] == 1].isna().all()  # no drift before the first interval
    again = L.adam_noise_walk(sigma, eps, log_steps=log_steps, n_bias=n, lr=lr, seed=seed)
    pd.testing.assert_frame_equal(walk, again)  # fixed by the seed
    with pytest.raises(ValueError, match="sigma"):
        L.adam_noise_walk([np.nan], eps, log_steps=log_steps, n_bias=n, lr=lr, seed=seed)
    with pytest.raises(ValueError, match="log_steps"):
        L.adam_noise_walk(sigma, eps, log_steps=[5, 5], n_bias=n, lr=lr, seed=seed)


@pytest.fixture(scope="module")
def full_null(full_units):
    traj, _, _ = _full_frames()
    return F.null_units(full_units, traj, replicates=6)


def test_null_walks_are_matched_and_judged_by_the_same_code(full_units, full_null):
    null = full_null
    judged = F.velocity_runs(full_units)
    assert len(null) == 6 * len(judged) and set(null["seed"]) == set(FULL_SEEDS)
    assert set(null["size"]) == {"small"} and set(null["dtype"]) == {"float32"}
    # the same function that judges a run judges each walk: recompute one walk by hand
    run = judged.sort_values(F.UNIT).iloc[0]
    traj, _, _ = _full_frames()
    steps = traj[(traj["size"] == "small") & (traj["dtype"] == "float32") & (traj["eps"] == run["eps"])
                 & (traj["seed"] == run["seed"]) & (traj["layer"] == 0)]["step"].to_numpy()
    walk = L.adam_noise_walk(np.full(6, run["grad_rms_late"]), run["eps"], log_steps=steps, n_bias=32, lr=1e-3,
                             seed=F.NULL_SEED)
    speed = F.velocities(F.last_decade(walk[walk["walk"] == 2]), eps=run["eps"], lr=1e-3, what="walk")
    row = null[(null["eps"] == run["eps"]) & (null["seed"] == run["seed"]) & (null[F.NULL_REPLICATE] == 2)].iloc[0]
    assert row["velocity_predicted"] == speed["velocity_predicted"]
    assert row["velocity_measured"] == speed["velocity_measured"]
    # pure noise: no bias along the drift beyond its standard errors, and a walk's velocity
    z = null["grad_along_drift"] / null["grad_along_drift_se"]
    assert abs(z.mean()) < 4 / math.sqrt(len(z)) + 0.5 and (null["velocity_measured"] > 0).all()


def test_null_fails_the_velocity_check_and_reports_how_much_faster_the_runs_drift(full_null):
    claim = F.null_claim(full_null)
    assert claim.id == F.LONGRUN_VELOCITY_NULL_FAILS.id and claim.kind == "control"
    assert claim.protects == (F.LONGRUN_VELOCITY_FROM_GRADIENT_BIAS.id,)
    assert _holds([claim]) == {claim.id: True} and claim.value == 0.0
    summary = F.null_summary(full_null)
    assert len(summary) == 6 and (summary[F.NULL_SPEEDUP] > 1).all()
    m = F.null_macros(full_null)
    assert all(name.isalpha() for name in m) and m["LongFullNullWalks"] == 6
    assert m["LongFullNullSpeedupMin"] <= m["LongFullNullSpeedupMedian"] <= m["LongFullNullSpeedupMax"]
    assert "not built into" in F.null_text(m)
    from keybias.studies.longrun import schema

    assert set(m) <= set(schema.MACROS)
    assert set(summary.columns) == set(schema.TABLES["data/longrun_full_null.csv"])


def _null_frame(passing: int, grids: int = 50):
    """A synthetic null: `grids` replicates of the six judged runs, whose measured velocity equals the
    predicted one (a pass) in the first `passing` replicates and is 3 times it otherwise."""
    rows = []
    for r in range(grids):
        for eps in (1e-12, 1e-8):
            for seed in FULL_SEEDS:
                rows.append({"size": "small", "dtype": "float32", "eps": eps, "seed": seed, "layer": 0,
                             F.NULL_REPLICATE: r, "velocity_predicted": 0.01,
                             "velocity_measured": 0.01 if r < passing else 0.03, F.NULL_REAL_VELOCITY: 0.1})
    return pd.DataFrame(rows)


@pytest.mark.claim_mutation(F.LONGRUN_VELOCITY_NULL_FAILS.id)
def test_mutation_null_passing_the_velocity_check_in_3_of_50_grids(record_mutation):
    assert F.null_claim(_null_frame(2)).holds  # 4%: below the bound
    record_mutation(F.null_claim(_null_frame(3)))  # 6%: the match would be partly built in
    record_mutation(F.null_claim(_null_frame(50)))  # an identity: every null grid passes
    assert "built into how the bias is measured" in F.null_text(
        {**F.null_macros(_null_frame(50)), "LongFullNullPassFraction": 1.0})


def test_null_with_a_nan_velocity_fails_loudly():
    frame = _null_frame(0)
    frame.loc[0, "velocity_measured"] = np.nan
    with pytest.raises(NonFiniteValues):
        F.null_claim(frame)
