"""Tests for keybias.studies.training.measure: removal of b_k, optimizers, drift predictions, a short training run."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from keybias import verdict
from keybias.core.reduce import NonFiniteValues
from keybias.studies.training import judge as J
from keybias.studies.training import measure as T
from keybias.studies.training import model as M
from keybias.studies.training import show as S

ARCH = dict(embed_dim=16, num_heads=2, num_layers=1, patch=4)


@pytest.fixture(scope="module")
def data():
    return T.load_digits_split()


def _params_in_optimizer(opt):
    return {id(p) for g in opt.param_groups for p in g["params"]}


# ----------------------------------------------------------------------------- model and removal


def test_removed_key_bias_is_a_zero_buffer_not_a_parameter():
    model = T.build_model(0, keep_key_bias=False, **ARCH)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith("b_k") for n in names)
    assert any(n.endswith("b_q") for n in names) and any(n.endswith("b_v") for n in names)
    for mha in T.attention_modules(model):
        assert torch.equal(mha.b_k, torch.zeros(mha.embed_dim))
        assert "b_k" in dict(mha.named_buffers())


def test_kept_and_removed_identical_at_init(data):
    x = data["x_test"][:50]
    kept = T.build_model(3, keep_key_bias=True, **ARCH)
    removed = T.build_model(3, keep_key_bias=False, **ARCH)
    with torch.no_grad():
        assert torch.equal(kept(x), removed(x))
    other_seed = T.build_model(4, keep_key_bias=False, **ARCH)
    with torch.no_grad():
        assert not torch.equal(other_seed(x), removed(x))


def test_large_key_bias_is_redundant_but_query_bias_is_not(data):
    x = data["x_test"][:50]
    model = T.build_model(0, keep_key_bias=True, **ARCH)
    with torch.no_grad():
        ref = model(x)
        mha = T.attention_modules(model)[0]
        mha.b_k.copy_(torch.randn(mha.embed_dim))
        moved_k = model(x)
        mha.b_k.zero_()
        mha.b_q.copy_(torch.randn(mha.embed_dim))
        moved_q = model(x)
    assert (moved_k - ref).abs().max() < 1e-5
    assert (moved_q - ref).abs().max() > 1e-3


@pytest.mark.parametrize("name", T.OPTIMIZERS)
def test_removed_key_bias_stays_exactly_zero_and_is_in_no_optimizer(name, data):
    model = T.build_model(0, keep_key_bias=False, **ARCH)
    opt = T.make_optimizer(model, name, lr=0.01, weight_decay=0.1)
    ids = _params_in_optimizer(opt)
    assert ids == {id(p) for p in model.parameters()}
    assert all(id(m.b_k) not in ids for m in T.attention_modules(model))
    for _ in range(3):
        T._step(model, opt, data["x_train"][:32], data["y_train"][:32], "float32")
        opt.step()
    assert all(torch.equal(m.b_k, torch.zeros_like(m.b_k)) for m in T.attention_modules(model))


def test_adamw_weight_decay_groups():
    model = T.build_model(0, keep_key_bias=True, **ARCH)
    mha = T.attention_modules(model)[0]
    for name, expect_bias_wd in (("adamw", 0.0), ("adamw_bias_decay", 0.25)):
        opt = T.make_optimizer(model, name, lr=1e-3, weight_decay=0.25)
        wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
        assert wd[id(mha.b_k)] == expect_bias_wd
        assert wd[id(mha.in_proj_weight)] == 0.25
    sgd_m = T.make_optimizer(model, "sgd_momentum", lr=0.1, momentum=0.8)
    assert sgd_m.param_groups[0]["momentum"] == 0.8


def test_bad_names_and_sizes_raise_before_training():
    model = T.build_model(0, keep_key_bias=True, **ARCH)
    with pytest.raises(ValueError, match="optimizer='rmsprop'.*allowed"):
        T.make_optimizer(model, "rmsprop", lr=0.1)
    with pytest.raises(ValueError, match="divisible"):
        T.build_model(0, keep_key_bias=True, embed_dim=30, num_heads=4, num_layers=1, patch=2)
    with pytest.raises(ValueError, match="patch"):
        T.build_model(0, keep_key_bias=True, embed_dim=16, num_heads=2, num_layers=1, patch=3)
    with pytest.raises(ValueError, match="dtype='float16'"):
        T.study_settings(["sgd"], [1e-8], ["float16"])
    with pytest.raises(ValueError, match="pair_optimizers.*'lbfgs'"):
        T.TrainingConfig(pair_optimizers=["lbfgs"])
    with pytest.raises(ValueError, match="batch_size"):
        T.train_bias_run(0, optimizer="sgd", steps=2, batch_size=0, lr=0.1, **ARCH)


def test_batch_order_is_determined_by_the_seed():
    a = T.batch_order(100, 32, 7, seed=1)
    b = T.batch_order(100, 32, 7, seed=1)
    c = T.batch_order(100, 32, 7, seed=2)
    assert len(a) == 7 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    assert all(len(x) == 32 for x in a)


def test_optimizer_lr_and_macro_names():
    assert T.optimizer_lr("sgd_momentum", lr_sgd=0.3, lr_adam=1e-3, momentum=0.9) == pytest.approx(0.03)
    names = [J.setting_macro_name(o, e, d) for o, e, d in
             [("adam", 1e-8, "float32"), ("adam", 1e-12, "float32"), ("adam", 1e-8, "bfloat16"),
              ("sgd", 1e-8, "float32"), ("adamw_bias_decay", 1e-8, "float32")]]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z]+", n) for n in names)


# ----------------------------------------------------------------------------- predictions


def test_drift_predictions_limits():
    T_steps, n, lr = 400, 10, 1e-3
    loud = np.full(T_steps, 1e-3)  # noise far above eps: unit steps, a random walk
    walk = lr * math.sqrt(n * T_steps)
    assert T.random_walk_drift(loud, lr=lr, eps=1e-12, n_elements=n) == pytest.approx(walk, rel=1e-6)
    assert T.predicted_adam_drift(loud, lr=lr, eps=1e-12, n_elements=n) == pytest.approx(walk, rel=0.15)
    quiet = np.full(T_steps, 1e-12)  # noise far below eps: step lr * g / eps
    assert T.random_walk_drift(quiet, lr=lr, eps=1e-6, n_elements=n) == pytest.approx(walk * 1e-6, rel=1e-5)
    assert T.predicted_adam_drift(quiet, lr=lr, eps=1e-6, n_elements=n) == pytest.approx(walk * 1e-6, rel=0.15)
    # the larger eps must predict less drift
    assert T.predicted_adam_drift(loud, lr=lr, eps=1e-3, n_elements=n) < 0.6 * walk
    with pytest.raises(ValueError):
        T.predicted_adam_drift([1.0, -1.0], lr=lr, eps=1e-8, n_elements=n)
    with pytest.raises(ValueError):
        T.random_walk_drift([1.0], lr=lr, eps=0.0, n_elements=n)


def test_random_walk_model_matches_adam_on_pure_noise():
    # Adam fed synthetic zero-mean noise drifts as predicted; fed a constant-sign gradient it drifts
    # ~sqrt(T) times further, so the prediction can fail.
    gen = torch.Generator().manual_seed(0)
    n, steps, sigma, lr = 64, 300, 1e-9, 1e-3
    drifts = {}
    for kind in ("noise", "constant"):
        p = torch.nn.Parameter(torch.zeros(n))
        opt = torch.optim.Adam([p], lr=lr, eps=1e-8)
        for _ in range(steps):
            g = sigma * torch.randn(n, generator=gen)
            p.grad = g if kind == "noise" else g.abs()
            opt.step()
        drifts[kind] = float(p.detach().norm())
    pred = T.predicted_adam_drift(np.full(steps, sigma), lr=lr, eps=1e-8, n_elements=n)
    assert abs(math.log2(drifts["noise"] / pred)) <= 1.0
    assert abs(math.log2(drifts["constant"] / pred)) > 1.0


def test_sgd_random_walk():
    # lr / (1 - mu) * sqrt(n * sum sigma^2) = 0.1 / 0.5 * sqrt(4 * 5)
    assert T.sgd_random_walk([1.0, 2.0], lr=0.1, momentum=0.5, n_elements=4) == pytest.approx(0.2 * math.sqrt(20))
    with pytest.raises(ValueError):
        T.sgd_random_walk([], lr=0.1)


# ----------------------------------------------------------------------------- short training runs


def test_short_pair_run_agrees_step_by_step(data):
    threads = torch.get_num_threads()
    curves = T.train_pair(0, optimizer="adam", steps=6, batch_size=32, eval_every=3, lr=3e-3, data=data, **ARCH)
    first = curves.iloc[0]
    assert first["loss_kept"] == first["loss_removed"]  # identical before b_k receives any update
    assert first["param_divergence_kept"] == 0.0
    assert first["param_divergence_control"] > 0.0  # the controls start one ulp away
    assert first["param_divergence_control_down"] > 0.0
    assert curves["param_divergence_kept"].max() < 1e-5
    summary = T.pair_summary(curves)
    assert summary["identical_steps"].iloc[0] >= 1
    assert summary["acc_diff"].iloc[0] <= 2 * summary["acc_standard_error"].iloc[0]
    # the discordant images are counts over the same test images, and agree with the accuracies
    n = int(summary["n_test"].iloc[0])
    diff = (summary["kept_only_correct"] - summary["removed_only_correct"]).iloc[0] / n
    assert diff == pytest.approx(summary["test_acc_kept"].iloc[0] - summary["test_acc_removed"].iloc[0], abs=1e-6)
    assert curves["test_acc_kept"].notna().sum() == 2
    assert summary["control_discordant"].iloc[0] >= 0
    assert torch.get_num_threads() == threads  # single_thread() restores the caller's setting


def test_short_bias_runs_sgd_still_adam_moves(data):
    common = dict(steps=10, batch_size=32, data=data, **ARCH)
    sgd, sgd_model = T.train_bias_run(0, optimizer="sgd", lr=0.3, **common)
    adam, adam_model = T.train_bias_run(0, optimizer="adam", lr=3e-3, eps=1e-12, **common)
    assert sgd["grad_over_tolerance"].max() <= 1.0 and adam["grad_over_tolerance"].max() <= 1.0
    assert sgd["drift_b_k"].iloc[-1] < 1e-6
    assert adam["drift_b_k"].iloc[-1] > 1e-3
    summary = T.bias_summary(adam, momentum=0.9)
    assert abs(math.log2(summary["drift_over_predicted"].iloc[0])) <= 1.0
    v = T.key_bias_verdicts(adam_model, data["x_test"][:100])
    assert set(v["verdict"]) == {verdict.REDUNDANT}
    # built to fail: a removed (zero) b_k gives a zero positive control, so the test has no power
    removed = T.build_model(0, keep_key_bias=False, **ARCH)
    v0 = T.key_bias_verdicts(removed, data["x_test"][:100])
    assert set(v0["verdict"]) == {verdict.INVALID}


def test_verdict_flags_a_real_change(data):
    # built to fail: the same machinery with a b_q change (not redundant) exceeds the tolerance
    model = T.build_model(0, keep_key_bias=True, key_bias_init=0.5, **ARCH)
    mha = T.attention_modules(model)[0]
    probe = T._AttentionProbe(model)
    with torch.no_grad():
        model(data["x_test"][:100])
    probe.remove()
    x = probe.inputs[0]
    zero = torch.zeros_like(mha.b_k)
    y0 = T._attention_output(mha, x, mha.b_q, zero, mha.b_v)
    yk = T._attention_output(mha, x, mha.b_q, mha.b_k, mha.b_v)
    yq = T._attention_output(mha, x, mha.b_q + mha.b_k, zero, mha.b_v)
    tol = T.key_bias_verdicts(model, data["x_test"][:100])["tolerance"].iloc[0]
    assert float((yk - y0).abs().max()) <= tol
    assert float((yq - y0).abs().max()) > tol


# ----------------------------------------------------------------------------- claims, macros, tables


def _held(claims):
    """claim id -> holds, computed by the Recorder itself."""
    from keybias.core.recorder import Recorder

    rec = Recorder("04_training", "/nonexistent", profile="test", device="cpu")
    return {c["id"]: c["holds"] for c in rec.claims_from(claims)}


def _by_id(claims, claim_id):
    """The judged claim `claim_id` of `claims` (for record_mutation)."""
    return {c.id: c for c in claims}[claim_id]


def _pairs(kept_only=(1, 1, 1, 0), removed_only=(1, 1, 0, 1), div_kept=1e-6, div_seeds=(1,)):
    import pandas as pd

    rows = []
    for i, (opt, seed) in enumerate((("sgd", 0), ("sgd", 1), ("adam", 0), ("adam", 1))):
        rows.append({"optimizer": opt, "seed": seed, "identical_steps": 3 + seed, "test_acc_removed": 0.90,
                     "test_acc_kept": 0.90 + (kept_only[i] - removed_only[i]) / 360, "max_loss_rel_diff": 1e-6,
                     "max_loss_rel_diff_control": 2e-6,
                     "final_divergence_kept": div_kept if opt == "adam" and seed in div_seeds else 1e-6,
                     "final_divergence_control": 2e-6, "final_divergence_control_down": 4e-6,
                     "kept_only_correct": kept_only[i], "removed_only_correct": removed_only[i],
                     "control_discordant": 1, "n_test": 360})
    frame = pd.DataFrame(rows)
    frame["acc_diff"] = (frame["test_acc_kept"] - frame["test_acc_removed"]).abs()
    return frame


def test_pair_claims_state_their_smallest_detectable_effects():
    """The accuracy claim sees a b_k that moves (bound + 1 - the controls' flips) images; the
    divergence claim a kept / control ratio of the bound times the controls' spread at 95%."""
    claims = {c.id: c for c in J.pair_results(_pairs())[0]}
    accuracy = claims[J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id]
    assert accuracy.min_detectable == 7 + 1 - 4  # 4 rounding flips in the controls
    # that many images moved by b_k on top of the rounding level fails the claim
    flips = int(accuracy.min_detectable) + 4
    moved = J.pair_results(_pairs(kept_only=(flips - 3, 1, 1, 1), removed_only=(0, 0, 0, 0)))[0]
    assert not _held(moved)[J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id]
    spread = abs(math.log10(2e-6 / 4e-6)) / math.sqrt(2)  # the two one-ulp controls of every run
    divergence = claims[J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id]
    assert divergence.min_detectable == pytest.approx(J.DIVERGENCE_RATIO_BOUND * 10 ** (J.DETECT_Z * spread / math.sqrt(2)))
    assert divergence.min_detectable > J.DIVERGENCE_RATIO_BOUND
    equal = _pairs()
    equal["final_divergence_control_down"] = 2e-6  # identical controls: no spread, the bound itself
    assert {c.id: c for c in J.pair_results(equal)[0]}[J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id].min_detectable \
        == pytest.approx(J.DIVERGENCE_RATIO_BOUND)
    zero = _pairs()
    zero.loc[0, "final_divergence_control"] = 0.0
    with pytest.raises(ValueError, match="zero divergence"):
        J.pair_results(zero)


def test_pair_results_pass():
    claims, macros = J.pair_results(_pairs())
    assert all(_held(claims).values())
    assert all(c.kind == "test" and c.bound_origin for c in claims)
    assert macros["TrainIdenticalStepsAdam"] == 3 and macros["TrainDivergenceRatio"] == pytest.approx(0.25)
    assert macros["TrainAccDiscordant"] == 6 and macros["TrainAccDiscordantBound"] == 7  # floor(0.005 * 1440)
    assert macros["TrainAccDiscordantControl"] == 4


def test_discordant_bound():
    assert J.discordant_bound(1440) == 7 and J.discordant_bound(359 * 4) == 7 and J.discordant_bound(100) == 0
    with pytest.raises(ValueError):
        J.discordant_bound(0)


@pytest.mark.claim_mutation(J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id)
def test_discordant_claim_fails_one_image_past_the_bound_even_symmetric(record_mutation):
    # at the bound (7 of 1440 images) it holds; one more discordant image fails it, whether the kept
    # model loses images or changes predictions symmetrically (4 gained, 4 lost: accuracy unchanged)
    assert _held(J.pair_results(_pairs(kept_only=(1, 1, 1, 0), removed_only=(1, 1, 1, 1)))[0])[
        J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id]
    for kept_only, removed_only in (((1, 1, 1, 1), (1, 1, 1, 1)), ((0, 0, 0, 0), (2, 2, 2, 2)),
                                    ((2, 2, 0, 0), (0, 0, 2, 2))):
        claims = J.pair_results(_pairs(kept_only=kept_only, removed_only=removed_only))[0]
        record_mutation(_by_id(claims, J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id))  # 8 of 1440 images, bound 7


@pytest.mark.claim_mutation(J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id)
def test_divergence_claim_fails_just_past_one_decade_of_the_larger_control(record_mutation):
    # controls 2e-6 (up) and 4e-6 (down): the bound is 10 x 4e-6 for every seed of an optimizer
    assert _held(J.pair_results(_pairs(div_kept=3.9e-5, div_seeds=(0, 1)))[0])[
        J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id]
    record_mutation(_by_id(J.pair_results(_pairs(div_kept=4.1e-5, div_seeds=(0, 1)))[0],
                           J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id))
    # one seed's chaotic outlier (30x) beside an ordinary seed (0.25x) averages to 2.7x: holds
    assert _held(J.pair_results(_pairs(div_kept=1.2e-4))[0])[J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id]
    # a missing value raises, never skipped by max(); a kept run still identical to the removed one holds
    with pytest.raises(NonFiniteValues, match="divergences"):
        J.pair_results(_pairs(div_kept=float("nan")))
    assert _held(J.pair_results(_pairs(div_kept=0.0))[0])[J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id]


def _bias(*, drift_scale=1.0, decayed_norm=0.30, optimizers=("sgd", "adam", "adamw", "adamw_bias_decay"),
          powered_steps=10, grad_ratio=1e-4, sgd_ratio=0.5):
    import pandas as pd

    rows = []
    for opt in optimizers:
        for seed in (0, 1):
            adam = opt.startswith("adam")
            rows.append({
                "setting": opt, "optimizer": opt, "eps": 1e-8, "dtype": "float32", "seed": seed, "steps": 150,
                "drift_b_k": (0.03 + 0.01 * seed) * (drift_scale if opt in ("adam", "adamw") else 1.0)
                if adam else 1e-9,
                "predicted_drift": 0.03 if adam else np.nan, "sgd_walk": np.nan if adam else 2e-9,
                "sgd_walk_ratio": np.nan if adam else sgd_ratio, "sgd_walk_ratio_b_q": np.nan if adam else 12.0,
                "decayed_norm": decayed_norm if opt == "adamw_bias_decay" else np.nan,
                "norm_b_k": 0.31, "norm_b_k_initial": 0.6, "norm_b_q": 0.2, "norm_b_v": 0.3, "test_acc": 0.8 + 0.1 * seed,
                "grad_rms_b_k": 1e-9, "grad_rms_b_q": 1e-2, "powered_steps": powered_steps,
                "max_grad_over_tolerance_powered": grad_ratio if powered_steps else np.nan,
                "detectable_gradient_fraction": 1e-4 if powered_steps else np.nan,
            })
    return pd.DataFrame(rows)


def test_bias_results_pass():
    claims, macros = J.bias_results(_bias())
    held = _held(claims)
    assert set(held) == {J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id, J.TRAIN_SGD_BK_STAYS_PUT.id,
                         J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id, J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id}
    assert all(held.values())
    assert all(c.kind == ("consistency" if c.id == J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id else "test") and c.bound_origin
               for c in claims)
    assert macros["TrainDriftAdamEpsEight"] == pytest.approx(0.035)  # mean over seeds
    assert macros["TrainAccAdamEpsEight"] == pytest.approx(0.85)
    assert macros["TrainDriftAdamMax"] == pytest.approx(0.04)
    # the noise claim excludes AdamW with decay on biases, whose drift is mostly the decay itself
    far = _bias()
    far.loc[far["optimizer"] == "adamw_bias_decay", "drift_b_k"] = 0.1
    assert _held(J.bias_results(far)[0])[J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id]
    # no decay runs in the profile: that claim (and its macro) is not produced at all
    claims, macros = J.bias_results(_bias(optimizers=("sgd", "adam")))
    assert J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id not in _held(claims) and "TrainDecayDev" not in macros
    with pytest.raises(ValueError, match="empty"):
        J.bias_results(_bias().iloc[:0])


@pytest.mark.claim_mutation(J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id)
def test_gradient_claim_fails_on_doctored_and_unpowered_data(record_mutation):
    # one percent past the tolerance in every powered run
    record_mutation(_by_id(J.bias_results(_bias(grad_ratio=1.01))[0], J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id))
    # no powered step anywhere (the b_q control never above the tolerance): nothing tested, so it fails
    assert _held(J.bias_results(_bias(powered_steps=0))[0])[J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id] is False


@pytest.mark.claim_mutation(J.TRAIN_SGD_BK_STAYS_PUT.id, J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id)
def test_sgd_and_adam_claims_fail_on_doctored_drift(record_mutation):
    assert _held(J.bias_results(_bias(sgd_ratio=0.5))[0])[J.TRAIN_SGD_BK_STAYS_PUT.id]
    # one percent past each bound: SGD drift 3.03 walks (bound 3); Adam's seed-1 drift 0.04 x 1.515 against a
    # prediction of 0.03, a factor 2.02 (bound 2)
    claims = J.bias_results(_bias(sgd_ratio=3 * 1.01, drift_scale=2 * 0.03 / 0.04 * 1.01))[0]
    record_mutation(_by_id(claims, J.TRAIN_SGD_BK_STAYS_PUT.id),
                    _by_id(claims, J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id))
    # no SGD run where b_q outran the bound: nothing tested, so it fails
    unpowered = _bias()
    unpowered["sgd_walk_ratio_b_q"] = 2.0
    assert _held(J.bias_results(unpowered)[0])[J.TRAIN_SGD_BK_STAYS_PUT.id] is False
    nan_pred = _bias()
    nan_pred.loc[nan_pred["optimizer"] == "adam", "predicted_drift"] = np.nan
    with pytest.raises(NonFiniteValues, match="Adam drift ratios: 2 of 4"):
        J.bias_results(nan_pred)


@pytest.mark.claim_mutation(J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id)
def test_decay_claim_fails_at_the_smallest_violation_at_the_paper_settings(record_mutation):
    # the paper profile's settings: lr 0.003, wd 0.5, 150 steps, ||b_k(0)|| of 32 x 2 entries drawn with
    # std key_bias_init, and a predicted walk of the size the committed runs measured (0.027)
    from pathlib import Path

    from keybias.studies import params

    paper = T.TrainingConfig.from_mapping(params.load_profile(
        "paper", Path(__file__).resolve().parents[3] / "params", ["04_training"])["04_training"])
    n = paper.embed_dim * paper.num_layers
    initial = paper.key_bias_init * math.sqrt(n)
    factor = (1 - paper.lr_adam * paper.weight_decay) ** paper.steps
    walk = 0.027
    decayed = factor * initial
    frame = _bias(decayed_norm=decayed)
    decay = frame["optimizer"] == "adamw_bias_decay"
    frame.loc[decay, "norm_b_k_initial"] = initial
    frame.loc[decay, "predicted_drift"] = walk
    # the design: the shrinkage the claim checks is at least 5 times the allowed deviation
    _, macros = J.bias_results(frame)
    assert macros["TrainDecayEffectOverBound"] >= 5
    # within the bound (a walk of 1.9 predicted walks on top of the decay): holds
    frame.loc[decay, "norm_b_k"] = decayed + 1.9 * walk
    assert _held(J.bias_results(frame)[0])[J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id]
    # the smallest violation: a decay rate 15% short of lr*wd, i.e. a deviation just past 2 walks
    short = (1 - 0.85 * paper.lr_adam * paper.weight_decay) ** paper.steps * initial
    assert 2 * walk < short - decayed < 2.5 * walk
    frame.loc[decay, "norm_b_k"] = short
    record_mutation(_by_id(J.bias_results(frame)[0], J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id))


def _coupled_refresh(module, args):
    # a mutated attention in which b_k also shifts the values: b_k then changes the function and
    # receives a real (non-noise) gradient
    module.in_proj_bias = torch.cat([module.b_q, module.b_k, module.b_v + module.b_k])


def _study(frames, momentum=0.9):
    import pandas as pd

    return J.bias_results(T.bias_summary(pd.concat(frames, ignore_index=True), momentum=momentum))[0]


@pytest.mark.claim_mutation(J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id, J.TRAIN_SGD_BK_STAYS_PUT.id)
def test_a_real_key_bias_gradient_fails_the_gradient_and_sgd_claims(data, monkeypatch, record_mutation):
    # (Adam's noise law alone would not catch this one: over 40 minibatch steps a real gradient
    # also walks; its size, far above the rounding tolerance, is what fails.)
    common = dict(steps=40, batch_size=32, data=data, key_bias_init=0.05, **ARCH)
    honest = [T.train_bias_run(0, optimizer="sgd", lr=0.1, **common)[0],
              T.train_bias_run(0, optimizer="adam", lr=3e-3, **common)[0]]
    assert all(_held(_study(honest)).values())
    monkeypatch.setattr(M, "_refresh_in_proj_bias", _coupled_refresh)
    coupled = [T.train_bias_run(0, optimizer="sgd", lr=0.1, **common)[0],
               T.train_bias_run(0, optimizer="adam", lr=3e-3, **common)[0]]
    claims = _study(coupled)
    record_mutation(_by_id(claims, J.TRAIN_BK_GRADIENT_WITHIN_ROUNDING.id), _by_id(claims, J.TRAIN_SGD_BK_STAYS_PUT.id))


@pytest.mark.claim_mutation(J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id, J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id)
def test_weight_decay_coupling_fails_the_noise_and_decay_claims(data, record_mutation):
    common = dict(steps=40, batch_size=32, data=data, key_bias_init=0.5, lr=3e-3, weight_decay=5.0, **ARCH)
    # b_k coupled to weight decay, presented as AdamW without decay on biases: the noise law must fail
    decayed, _ = T.train_bias_run(0, optimizer="adamw_bias_decay", **common)
    decayed["optimizer"] = "adamw"
    record_mutation(_by_id(_study([decayed]), J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id))
    # and a b_k that is not decayed, presented as decayed: the decay claim must fail
    free, _ = T.train_bias_run(0, optimizer="adamw", **common)
    free["optimizer"] = "adamw_bias_decay"
    record_mutation(_by_id(_study([free]), J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id))


def _verdict_frame(model, images, optimizer="adam"):
    v = T.key_bias_verdicts(model, images)
    for key, value in (("setting", optimizer), ("optimizer", optimizer), ("seed", 0)):
        v.insert(0, key, value)
    return v


@pytest.mark.claim_mutation(J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id)
def test_function_claim_fails_when_attention_depends_on_key_bias(data, monkeypatch, record_mutation):
    model = T.build_model(0, keep_key_bias=True, key_bias_init=0.5, **ARCH)
    images = data["x_test"][:100]
    assert _held(J.verdict_results(_verdict_frame(model, images))[0])[J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id]
    original = T._attention_output
    monkeypatch.setattr(T, "_attention_output",
                        lambda mha, x, b_q, b_k, b_v: original(mha, x, b_q, b_k, b_v + b_k))
    record_mutation(_by_id(J.verdict_results(_verdict_frame(model, images))[0],
                           J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id))


def test_power_check_fails_without_a_powered_layer(data):
    # a zero b_k gives a zero positive control: every layer invalid, no power (a consistency check)
    removed = T.build_model(0, keep_key_bias=False, **ARCH)
    claims = J.verdict_results(_verdict_frame(removed, data["x_test"][:100]))[0]
    assert _held(claims)[J.TRAIN_DRIFT_VERDICT_HAS_POWER.id] is False
    assert _by_id(claims, J.TRAIN_DRIFT_VERDICT_HAS_POWER.id).kind == "consistency"


def test_bound_macros_match_claim_bounds():
    bounds = J.bound_macros()
    claims = J.pair_results(_pairs())[0] + J.bias_results(_bias())[0]
    by_id = {c.id: c.bound for c in claims}
    assert by_id[J.TRAIN_ACCURACY_AGREES_KEPT_REMOVED.id] == J.discordant_bound(1440)
    assert bounds["TrainDiscordantFractionBound"] == J.DISCORDANT_FRACTION_BOUND
    assert by_id[J.TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL.id] == bounds["TrainDivergenceBound"]
    assert by_id[J.TRAIN_SGD_BK_STAYS_PUT.id] == bounds["TrainSgdWalkBound"]
    assert by_id[J.TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION.id] == math.log2(bounds["TrainAdamFactorBound"])
    assert by_id[J.TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK.id] == bounds["TrainDecayDevBound"]
    assert all(re.fullmatch(r"[A-Za-z]+", k) for k in bounds)


def test_verdict_results_and_tables():
    import pandas as pd

    rows = [{"setting": s, "optimizer": o, "seed": 0, "layer": layer, "verdict": v, "delta": 1e-7,
             "tolerance": 1e-6, "control_delta": 1e-4 * (1 + layer), "logit_delta": 1e-6, "prediction_changes": 0}
            for s, o, vs in (("SGD", "sgd", ("invalid", "invalid")), ("Adam_x", "adam", ("redundant", "invalid")))
            for layer, v in enumerate(vs)]
    verdicts = pd.DataFrame(rows)
    claims, macros = J.verdict_results(verdicts)
    held = _held(claims)
    # a layer without power is no evidence of redundancy: the three invalid verdicts count against
    assert not held[J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id]
    assert {c.id: c for c in claims}[J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id].value == 3
    assert held[J.TRAIN_DRIFT_VERDICT_HAS_POWER.id]
    all_redundant = verdicts.assign(verdict="redundant")
    assert all(_held(J.verdict_results(all_redundant)[0]).values())
    assert macros["TrainVerdictRedundant"] == 1 and macros["TrainVerdictInvalid"] == 3
    # the one powered layer sees a change of 1e-6 / 1e-4 of its size-matched control's
    assert {c.id: c for c in claims}[J.TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION.id].min_detectable == pytest.approx(1e-2)
    assert macros["TrainVerdictMinDetectable"] == pytest.approx(1e-2)
    table = J.verdict_table(verdicts)
    assert list(table["redundant"]) == [0, 1]
    latex = J.verdict_table_latex(table)
    assert r"\toprule" in latex and r"Adam\_x" in latex and latex.count(r"\\") == 3
    bias_latex = J.bias_table_latex(J.bias_table(_bias()))
    assert "--" in bias_latex  # SGD has no Adam prediction


def test_figures_print_at_seven_points_or_more(data):
    import pandas as pd

    curves = T.train_pair(0, optimizer="adam", steps=4, batch_size=32, eval_every=2, lr=3e-3, data=data, **ARCH)
    traj = pd.concat([T.train_bias_run(0, optimizer=o, steps=4, batch_size=32, lr=lr, data=data, **ARCH)[0]
                      for o, lr in (("sgd", 0.1), ("adam", 3e-3))], ignore_index=True)
    from keybias.studies import style

    for fig in (S.plot_curves(curves), S.plot_bias_norms(traj)):
        assert style.smallest_font_pt(fig) >= style.MIN_FONT_PT
        assert fig.get_figwidth() == pytest.approx(style.FULL_WIDTH)


# ----------------------------------------------------------------------------- config


def test_config_defaults_are_the_smoke_profile_and_fields_are_the_parameters():
    import dataclasses
    from pathlib import Path

    from keybias.studies import params

    assert {f.name for f in dataclasses.fields(T.TrainingConfig)} == set(T.PARAMETERS)
    root = Path(__file__).resolve().parents[3] / "params"
    smoke = params.load_profile("smoke", root, ["04_training"])["04_training"]
    assert T.TrainingConfig().as_dict() == smoke
    paper = params.load_profile("paper", root, ["04_training"])["04_training"]
    assert T.TrainingConfig.from_mapping(paper).as_dict() == paper


def test_config_rejects_misspelled_and_bad_values_naming_them():
    from keybias.studies.params import ParameterError

    with pytest.raises(ParameterError, match="did you mean 'bias_seeds'"):
        T.TrainingConfig.from_mapping({"bias_seed": [0]})
    with pytest.raises(ParameterError, match="did you mean 'key_bias_init'"):
        T.TrainingConfig().replace(key_bias_int=0.1)
    with pytest.raises(ParameterError, match="steps"):
        T.TrainingConfig(steps=0)
    with pytest.raises(ParameterError, match="divisible"):
        T.TrainingConfig(embed_dim=30, num_heads=4)
    with pytest.raises(ParameterError, match="patch"):
        T.TrainingConfig(patch=3)
    with pytest.raises(TypeError):
        T.run_pairs(T.TrainingConfig(), stepz=3)  # no keyword is silently dropped
