"""Training dynamics of the key bias: judge (claims, macros and tables from `keybias.studies.training.measure`'s frames).

Pure functions: DataFrames in, claims (`keybias.core.recorder.Claim`s) and macros out, so a test can
hand them doctored data or the output of a mutated model and check that the claim then fails. Every
bound is fixed here, before any run, and each claim says where its bound comes from.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from keybias import verdict
from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim, format_number, latex_escape
from keybias.core.reduce import (
    finite_max,
    finite_mean,
    finite_median,
    finite_min,
    finite_sum,
    finite_values,
    require_columns,
    require_finite,
)
from keybias.studies.params import check_choice
from keybias.studies.training.measure import DEFAULT_EPS, OPTIMIZERS, TRAIN_DTYPES, TrainingConfig

_NUMBER_WORDS = ("Zero", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
                 "Eleven", "Twelve", "Thirteen", "Fourteen", "Fifteen", "Sixteen")


def setting_macro_name(optimizer: str, eps: float, dtype: str) -> str:
    """A letters-only LaTeX macro stem for one bias-study setting, e.g. AdamEpsTwelve,
    SgdBfloatSixteen, AdamWBiasDecay."""
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("dtype", dtype, TRAIN_DTYPES)
    name = {"sgd": "Sgd", "sgd_momentum": "SgdMomentum", "adam": "Adam", "adamw": "AdamW",
            "adamw_bias_decay": "AdamWBiasDecay"}[optimizer]
    if optimizer == "adam":
        exponent = -int(round(math.log10(eps)))
        word = _NUMBER_WORDS[exponent] if 0 <= exponent < len(_NUMBER_WORDS) else "Other"
        mantissa = eps / 10.0**-exponent
        if abs(mantissa - 1) > 1e-9:
            word += "Scaled"
        name += f"Eps{word}"
    if dtype == "bfloat16":
        name += "BfloatSixteen"
    return name


# ----------------------------------------------------------------------------- claims, macros, tables
#
# The bounds of the claims. Each is also written as a macro (Train...Bound) so that the paper
# states exactly the number the claim checks.

# Discordant test images (right with exactly one of the kept and removed models), pooled over
# optimizers and seeds, as a fraction of the paired images: a b_k that changes predictions, in either
# direction, moves images across; two runs that differ by rounding alone flip only the rare image on
# a decision boundary. One image in 200, fixed before the runs.
DISCORDANT_FRACTION_BOUND = 0.005
# kept-vs-removed divergence / the larger divergence of two one-ulp controls (up and down) of the
# same run: rounding-sized differences, so the same order; one decade, fixed before the runs.
DIVERGENCE_RATIO_BOUND = 10
# One-sided normal quantile for the minimum detectable effects: an effect at the stated size fails
# its claim in 95% of reruns whose only difference is the rounding the controls measure.
DETECT_Z = 1.645
GRAD_RATIO_BOUND = 1  # |g_bk| / rounding tolerance of the verdict rule
SGD_WALK_BOUND = 3  # SGD drift / random walk of tolerance-sized noise (a tail factor of an n-entry walk)
ADAM_FACTOR_BOUND = 2  # measured / predicted Adam drift within this factor either way
DECAY_DEV_BOUND = 2  # |norm - decayed norm| / predicted walk, with weight decay on biases

# Optimizers whose drift the noise model of `predicted_adam_drift` describes: Adam-family runs
# WITHOUT weight decay on b_k. With decay on biases (adamw_bias_decay) the drift is dominated
# by the deterministic shrinkage (1 - lr wd)^T, checked by its own claim instead.
ADAM_NOISE_OPTIMIZERS = ("adam", "adamw")

_OPTIMIZER_MACRO = {"sgd": "Sgd", "sgd_momentum": "SgdMomentum", "adam": "Adam", "adamw": "AdamW",
                    "adamw_bias_decay": "AdamWBiasDecay"}


def _require_columns(frame: pd.DataFrame, name: str, columns) -> None:
    require_columns(frame, columns, name)


def _mean(values, what: str) -> float:
    """A macro's mean over seeds: raises on NaN or on an empty selection."""
    return finite_mean(values, what, strict=True)


def bound_macros() -> dict[str, object]:
    """The claim bounds as macros (the same constants the claims compare against)."""
    return {
        "TrainDiscordantFractionBound": DISCORDANT_FRACTION_BOUND,
        "TrainDivergenceBound": DIVERGENCE_RATIO_BOUND,
        "TrainGradRatioBound": GRAD_RATIO_BOUND,
        "TrainSgdWalkBound": SGD_WALK_BOUND,
        "TrainAdamFactorBound": ADAM_FACTOR_BOUND,
        "TrainDecayDevBound": DECAY_DEV_BOUND,
    }


def config_macros(cfg: TrainingConfig, *, n_train: int, n_test: int, n_params: int,
                  n_settings: int) -> dict[str, object]:
    """Macros for the setup of the runs (data sizes, model, optimizer settings, counts)."""

    def one(x):  # one significant digit for parameters such as 0.003
        return format_number(float(x), 1)

    return {
        "TrainNTrain": int(n_train), "TrainNTest": int(n_test), "TrainNParams": int(n_params),
        "TrainEmbedDim": cfg.embed_dim, "TrainHeads": cfg.num_heads, "TrainLayers": cfg.num_layers,
        "TrainTokens": (8 // cfg.patch) ** 2, "TrainSteps": cfg.steps, "TrainBatch": cfg.batch_size,
        "TrainSeeds": len(cfg.seeds), "TrainBiasSeeds": len(cfg.bias_seeds),
        "TrainLrSgd": one(cfg.lr_sgd), "TrainLrAdam": one(cfg.lr_adam), "TrainMomentum": one(cfg.momentum),
        "TrainWeightDecay": one(cfg.weight_decay), "TrainKeyBiasInit": one(cfg.key_bias_init),
        "TrainEpsDefault": one(DEFAULT_EPS), "TrainBiasSettings": int(n_settings),
    }


def discordant_bound(n_images: int) -> int:
    """The largest pooled count of discordant images the accuracy claim allows for `n_images` paired
    images: floor(DISCORDANT_FRACTION_BOUND * n_images)."""
    if n_images <= 0:
        raise ValueError(f"n_images must be positive, got {n_images!r}")
    return int(math.floor(DISCORDANT_FRACTION_BOUND * n_images))


def discordant_min_detectable(pairs: pd.DataFrame, bound: int) -> int:
    """The fewest paired images that a b_k changing predictions would have to move for the accuracy
    claim to fail: rounding alone already moves as many images as the one-ulp controls disagree on
    (pooled), so the claim fails once b_k adds bound + 1 minus those. At least one image; where the
    controls already reach the bound it is one (the claim could then fail on rounding alone)."""
    control = int(finite_sum(pairs["control_discordant"], "control discordant images", strict=True))
    return max(bound + 1 - control, 1)


def divergence_min_detectable(pairs: pd.DataFrame) -> float:
    """The smallest kept / control divergence ratio (geometric mean over an optimizer's seeds) that a
    b_k changing the function would have to cause for the divergence claim to fail in 95% of reruns:
    the bound times 10^(z s / sqrt(k)), where s is the run-to-run spread of a log10 ratio of
    rounding-sized divergences, measured by the two one-ulp controls of each run (the RMS of
    log10(up / down) over the runs, divided by sqrt(2) as each is a difference of two), and k the
    fewest seeds of an optimizer. A run whose controls ended at zero divergence has no ratio: it
    raises, as nothing could be calibrated on it."""
    up = pairs["final_divergence_control"].to_numpy(float)
    down = pairs["final_divergence_control_down"].to_numpy(float)
    if not ((up > 0) & (down > 0)).all():
        raise ValueError("a one-ulp control ended with zero divergence: no rounding spread to calibrate on")
    log_ratio = finite_values(np.log10(up / down), "log10 ratios of the two one-ulp controls")
    spread = float(np.sqrt(np.mean(log_ratio ** 2)) / math.sqrt(2))
    seeds = int(pairs.groupby("optimizer", sort=False).size().min())
    return float(DIVERGENCE_RATIO_BOUND * 10.0 ** (DETECT_Z * spread / math.sqrt(seeds)))


def drift_verdict_min_detectable(verdicts: pd.DataFrame) -> float | None:
    """The smallest change of function the end-of-training verdicts would have seen, as a share of a
    size-matched control's change (`control_delta`, the same verdict's positive control): the largest
    tolerance / control_delta over the layers with power (verdict not invalid). Layers without power
    are `invalid`, counted apart (`TrainVerdictInvalid`), and no claim passes on them. None where no
    layer has power: nothing was detectable, and the power check (`train-drift-verdict-has-power`)
    fails."""
    powered = verdicts[verdicts["verdict"] != verdict.INVALID]
    if powered.empty:
        return None
    ratio = powered["tolerance"].to_numpy(float) / powered["control_delta"].to_numpy(float)
    return finite_max(ratio, "tolerance / control change of the powered layers", strict=True)


def pair_results(pairs: pd.DataFrame) -> tuple[list[Claim], dict[str, object]]:
    """Claims and macros of the kept-vs-removed comparison (`pair_summary` output).

    Macros per optimizer (Sgd, Adam, ...): fewest bit-identical steps over seeds, mean final
    accuracy removed/kept over seeds, and the max over seeds of the accuracy difference, the
    step-by-step relative loss difference (kept and control) and the final divergence (kept and
    control). Claims:
    - train-accuracy-agrees-kept-removed: the pooled count of discordant test images (right with
      exactly one of the paired models, either way) is at most `discordant_bound` of the paired
      images, so a b_k that changes predictions symmetrically fails as well as one that loses images;
    - train-divergence-within-rounding-control: max over optimizers of the geometric mean over seeds
      of the kept divergence over the larger of the two one-ulp controls' divergences."""
    _require_columns(pairs, "pairs", ["optimizer", "identical_steps", "test_acc_removed", "test_acc_kept",
                                      "acc_diff", "max_loss_rel_diff", "max_loss_rel_diff_control",
                                      "final_divergence_kept", "final_divergence_control",
                                      "final_divergence_control_down", "kept_only_correct",
                                      "removed_only_correct", "control_discordant", "n_test"])
    if pairs.empty:
        raise ValueError("pairs is empty: no kept-vs-removed run to summarize")
    macros: dict[str, object] = {}
    for opt, g in pairs.groupby("optimizer", sort=False):
        key = _OPTIMIZER_MACRO[opt]
        macros[f"TrainIdenticalSteps{key}"] = int(finite_min(g["identical_steps"], f"{opt} identical steps",
                                                             strict=True))
        macros[f"TrainAccRemoved{key}"] = _mean(g["test_acc_removed"], f"{opt} accuracies, b_k removed")
        macros[f"TrainAccKept{key}"] = _mean(g["test_acc_kept"], f"{opt} accuracies, b_k kept")
        macros[f"TrainMaxAccDiff{key}"] = finite_max(g["acc_diff"], f"{opt} accuracy differences")
        macros[f"TrainLossRelDiff{key}"] = finite_max(g["max_loss_rel_diff"], f"{opt} loss differences")
        macros[f"TrainLossRelDiffControl{key}"] = finite_max(g["max_loss_rel_diff_control"],
                                                             f"{opt} control loss differences")
        macros[f"TrainDivergence{key}"] = finite_max(g["final_divergence_kept"], f"{opt} divergences")
        macros[f"TrainDivergenceControl{key}"] = finite_max(
            np.maximum(g["final_divergence_control"], g["final_divergence_control_down"]),
            f"{opt} control divergences")
    discordant = int(finite_sum(pairs["kept_only_correct"], "images right only with b_k kept", strict=True)
                     + finite_sum(pairs["removed_only_correct"], "images right only with b_k removed", strict=True))
    n_images = int(finite_sum(pairs["n_test"], "paired test images", strict=True))
    bound = discordant_bound(n_images)
    # per run, kept over the larger control; per optimizer, the geometric mean over seeds: one seed's
    # chaotic amplification (a single run's ratio swings by up to a decade between CPUs) is averaged
    # with the others', while a b_k that changed the function would raise every seed of its optimizer
    # (a kept run still bit-identical to the removed one has ratio 0, and so has its optimizer's mean)
    control = np.maximum(pairs["final_divergence_control"], pairs["final_divergence_control_down"])
    ratio = pairs["final_divergence_kept"] / control
    per_optimizer = [0.0 if (r == 0).any() else 10.0 ** finite_mean(np.log10(r), f"{opt} divergence ratios")
                     for opt, r in ratio.groupby(pairs["optimizer"], sort=False)]
    div_ratio = finite_max(per_optimizer, "kept / control divergence ratios")
    div_detectable = divergence_min_detectable(pairs)
    acc_detectable = discordant_min_detectable(pairs, bound)
    macros.update({"TrainAccDiscordant": discordant, "TrainAccDiscordantBound": bound,
                   "TrainAccDiscordantControl": int(finite_sum(pairs["control_discordant"],
                                                               "control discordant images", strict=True)),
                   "TrainAccPairedImages": n_images, "TrainDivergenceRatio": div_ratio,
                   "TrainAccMinDetectable": acc_detectable,
                   "TrainDivergenceMinDetectable": div_detectable})
    claims = [
        build_claim(id="train-accuracy-agrees-kept-removed",
             statement=("Kept and removed b_k classify the same test images: the images that exactly one of the "
                        "two paired models gets right, in either direction, pooled over optimizers and seeds, "
                        f"number at most {DISCORDANT_FRACTION_BOUND:g} of the paired images ({bound} of {n_images})."),
             value=discordant, bound=bound, comparison="<=", kind="test",
             bound_origin="one image in 200, the rate of boundary flips between runs that differ by rounding; "
                          "fixed before the runs",
             min_detectable=acc_detectable),
        build_claim(id="train-divergence-within-rounding-control",
             statement=("The kept-b_k run ends within one decade (at most "
                        f"{DIVERGENCE_RATIO_BOUND} times) of the removed-b_k run, relative to the larger of two "
                        "controls of the same run whose initial weights differ by one unit in the last place, up "
                        "or down, in relative parameter distance (max over optimizers of the geometric mean "
                        f"over seeds). The divergence is chaotic: over these seeds the test reliably sees a ratio "
                        f"of {div_detectable:.2g}, not one of {DIVERGENCE_RATIO_BOUND}."),
             value=div_ratio, bound=DIVERGENCE_RATIO_BOUND, comparison="<=", kind="test",
             bound_origin="one decade around rounding-sized controls of the same run, fixed before the runs",
             min_detectable=div_detectable),
    ]
    return claims, macros


def bias_results(bias: pd.DataFrame) -> tuple[list[Claim], dict[str, object]]:
    """Claims and macros of the bias study (`bias_summary` output).

    - train-bk-gradient-within-rounding: over the powered steps only (b_q's gradient above the
      tolerance, see `training.bias_summary`), max |g_bk| / tolerance <= GRAD_RATIO_BOUND; NaN, so
      failing, when no step of any run is powered;
    - train-sgd-bk-stays-put (only if the profile has SGD runs): max drift / random walk of the
      measured noise <= SGD_WALK_BOUND;
    - train-adam-drift-matches-noise-prediction (Adam, or AdamW without decay on biases):
      max |log2(measured / predicted)| <= log2(ADAM_FACTOR_BOUND);
    - train-adamw-bias-decay-shrinks-bk (adamw_bias_decay runs): max |norm - decayed norm| /
      predicted walk <= DECAY_DEV_BOUND.
    A claim whose runs are absent from the profile is not produced (the profile's claim manifest
    names the claims it must produce); a NaN value makes a claim fail. Per-setting macros
    TrainDrift<S>, TrainPred<S>, TrainAcc<S> are means over seeds."""
    _require_columns(bias, "bias", ["setting", "optimizer", "eps", "dtype", "seed", "steps", "drift_b_k",
                                    "predicted_drift", "sgd_walk", "sgd_walk_ratio", "sgd_walk_ratio_b_q",
                                    "decayed_norm", "norm_b_k", "norm_b_k_initial", "test_acc", "grad_rms_b_k", "grad_rms_b_q",
                                    "powered_steps", "max_grad_over_tolerance_powered",
                                    "detectable_gradient_fraction"])
    if bias.empty:
        raise ValueError("bias is empty: no bias-study run to summarize")
    claims: list[Claim] = []
    macros: dict[str, object] = {}
    # a NaN count must not read as "not powered", nor a NaN eps or seed drop a run from its setting
    require_finite(bias, ["powered_steps", "eps", "seed"], "bias")
    powered = bias[bias["powered_steps"] > 0]
    grad_ratio = finite_max(powered["max_grad_over_tolerance_powered"], "powered runs' gradient ratios")
    detectable = finite_median(powered["detectable_gradient_fraction"], "powered runs' detectable fractions")
    macros["TrainGradRatio"] = grad_ratio
    macros["TrainGradDetectable"] = detectable
    macros["TrainGradPoweredRuns"] = len(powered)
    macros["TrainGradRuns"] = len(bias)
    for dtype, word in (("float32", "FloatThirtyTwo"), ("bfloat16", "BfloatSixteen")):
        d = bias[bias["dtype"] == dtype]
        if len(d):
            macros[f"TrainGradPoweredRuns{word}"] = int((d["powered_steps"] > 0).sum())
            macros[f"TrainGradRuns{word}"] = len(d)
    tested = ", ".join(sorted(powered["dtype"].unique())) or "none"
    claims.append(build_claim(
        id="train-bk-gradient-within-rounding",
        statement=("At every step where the b_q gradient exceeds the rounding tolerance (so a real gradient of "
                   f"that size would show; dtypes tested: {tested}), the b_k gradient of every layer lies within "
                   "the tolerance of the verdict rule (max |g_bk| / tolerance)."),
        value=grad_ratio, bound=GRAD_RATIO_BOUND, comparison="<=", kind="test",
        bound_origin="verdict.gradient_tolerance from each step's measured query, value and upstream maxima",
        min_detectable=detectable))
    sgd = bias[bias["optimizer"].str.startswith("sgd")]
    if len(sgd):
        # powered: b_q, whose gradient is real, moved farther than the bound allows b_k to move, so a b_k
        # gradient as real as b_q's would have failed the claim
        require_finite(sgd, ["sgd_walk_ratio_b_q"], "SGD runs")  # NaN must not read as "not powered"
        sgd_powered = sgd[sgd["sgd_walk_ratio_b_q"] > SGD_WALK_BOUND]
        sgd_ratio = finite_max(sgd_powered["sgd_walk_ratio"], "powered SGD runs' walk ratios")
        macros["TrainSgdWalkRatio"] = sgd_ratio
        macros["TrainSgdPoweredRuns"] = len(sgd_powered)
        macros["TrainSgdRuns"] = len(sgd)
        macros["TrainSgdDriftMax"] = finite_max(sgd["drift_b_k"], "SGD drifts")
        sgd_tested = ", ".join(sorted(sgd_powered["dtype"].unique())) or "none"
        claims.append(build_claim(
            id="train-sgd-bk-stays-put",
            statement=("Under SGD and SGD with momentum, in every run where b_q moved farther than the bound "
                       f"(dtypes tested: {sgd_tested}), b_k moves no farther than {SGD_WALK_BOUND} times the "
                       "random walk a tolerance-sized noise gradient would make, lr/(1-mu) (n sum_t tol_t^2)^(1/2) "
                       "(max drift / walk)."),
            value=sgd_ratio, bound=SGD_WALK_BOUND, comparison="<=", kind="test",
            bound_origin="tail of an n-entry random walk of the verdict rule's per-step tolerances (theory)",
            # b_k moving a fraction f of b_q's walk ratio fails the bound in the best-powered run once
            # f * ratio_bq > SGD_WALK_BOUND
            min_detectable=float(SGD_WALK_BOUND / finite_max(sgd_powered["sgd_walk_ratio_b_q"], "powered SGD runs' b_q walks"))
            if len(sgd_powered) else None))
    noise = bias[bias["optimizer"].isin(ADAM_NOISE_OPTIMIZERS)]
    if len(noise):
        log_err = finite_max(np.abs(np.log2(noise["drift_b_k"] / noise["predicted_drift"])), "Adam drift ratios")
        macros["TrainAdamLogErr"] = log_err
        macros["TrainAdamFactor"] = 2.0**log_err
        # The effect the claim exists to see is a consistent gradient, whose displacement adds to the
        # walk's in quadrature: a run at ratio r fails once a systematic displacement s (in units of
        # its predicted walk) reaches sqrt(F^2 - r^2). The run nearest the bound sets the smallest s.
        ratio_max = finite_max(noise["drift_b_k"] / noise["predicted_drift"], "Adam drift over prediction")
        detectable = math.sqrt(max(ADAM_FACTOR_BOUND**2 - ratio_max**2, 0.0))
        macros["TrainAdamMinDetectable"] = detectable
        steps = ", ".join(str(int(n)) for n in sorted(set(noise["steps"])))
        claims.append(build_claim(
            id="train-adam-drift-matches-noise-prediction",
            statement=(f"Over these runs' {steps} steps, under Adam (every eps and dtype) and AdamW without weight "
                       "decay on biases, the measured drift of b_k agrees with the random-walk prediction from the "
                       f"measured gradient noise and eps within a factor of {ADAM_FACTOR_BOUND} "
                       "(max |log2(measured/predicted)|); a systematic displacement of "
                       f"{detectable:.2g} predicted walks would have failed it. Over tens of thousands of steps "
                       "the long-run study finds drift faster than a walk."),
            value=log_err, bound=math.log2(ADAM_FACTOR_BOUND), comparison="<=", kind="test",
            bound_origin="a factor of two, fixed before the runs (a consistent gradient drifts sqrt(T) farther)",
            min_detectable=detectable))
    decay = bias[bias["optimizer"] == "adamw_bias_decay"]
    if len(decay):
        decay_dev = finite_max((decay["norm_b_k"] - decay["decayed_norm"]).abs() / decay["predicted_drift"],
                               "decay deviations")
        # the effect the claim checks, the shrinkage ||b_k(0)|| - decayed norm, in units of the allowed
        # deviation (DECAY_DEV_BOUND predicted walks): the claim has power only where this is large
        effect = finite_min((decay["norm_b_k_initial"] - decay["decayed_norm"])
                            / (DECAY_DEV_BOUND * decay["predicted_drift"]), "decay effects")
        macros["TrainDecayDev"] = decay_dev
        macros["TrainDecayEffectOverBound"] = effect
        claims.append(build_claim(
            id="train-adamw-bias-decay-shrinks-bk",
            statement=("With weight decay on biases, ||b_k|| follows (1 - lr wd)^T ||b_k(0)|| within "
                       f"{DECAY_DEV_BOUND} times the predicted Adam random walk (max deviation / predicted walk)."),
            value=decay_dev, bound=DECAY_DEV_BOUND, comparison="<=", kind="consistency",
            # (1 - lr wd)^T is AdamW's own decay rule, which the noise walk barely perturbs: a
            # cross-check of the optimizer, not a test of the bias
            bound_origin="the noise law's factor-of-two tolerance, fixed before the runs; AdamW's own decay rule",
            min_detectable=float(DECAY_DEV_BOUND / effect) if effect > 0 else None))
    adam_family = bias[bias["optimizer"].str.startswith("adam")]
    if len(adam_family):
        macros["TrainDriftAdamMax"] = finite_max(adam_family["drift_b_k"], "Adam-family drifts")
    for (opt, eps, dtype), g in bias.groupby(["optimizer", "eps", "dtype"], sort=False):
        name = setting_macro_name(opt, float(eps), dtype)
        macros[f"TrainDrift{name}"] = _mean(g["drift_b_k"], f"{name} drifts")
        # the noise model predicts the drift of the Adam family only (the other rows carry NaN by design)
        if opt.startswith("adam"):
            macros[f"TrainPred{name}"] = _mean(g["predicted_drift"], f"{name} predicted drifts")
        macros[f"TrainAcc{name}"] = _mean(g["test_acc"], f"{name} accuracies")
    for dtype, word in (("float32", "FloatThirtyTwo"), ("bfloat16", "BfloatSixteen")):
        d = bias[bias["dtype"] == dtype]
        if len(d):
            macros[f"TrainGradRmsKey{word}"] = finite_median(d["grad_rms_b_k"], f"{dtype} b_k gradient RMS", strict=True)
            macros[f"TrainGradRmsQuery{word}"] = finite_median(d["grad_rms_b_q"], f"{dtype} b_q gradient RMS",
                                                               strict=True)
    return claims, macros


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "--"
    return "$" + format_number(float(value), 2) + "$"


def _tabular(header: list[str], rows: list[list[str]]) -> str:
    body = [r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\toprule", " & ".join(header) + r" \\",
            r"\midrule"]
    body += [" & ".join(r) + r" \\" for r in rows]
    body += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(body)


def bias_table(bias: pd.DataFrame) -> pd.DataFrame:
    """Per setting, means over seeds: test accuracy, final ||b_q||, ||b_v||, drift of b_k, predicted
    drift (Adam family; NaN otherwise) and the RMS of the b_k gradient."""
    require_columns(bias, ["setting", "optimizer", "test_acc", "norm_b_q", "norm_b_v", "drift_b_k",
                           "predicted_drift", "grad_rms_b_k"], "bias")
    rows = []
    for setting, g in bias.groupby("setting", sort=False):
        adam = bool(g["optimizer"].str.startswith("adam").all())  # the noise model's predictions (NaN otherwise)
        rows.append({"setting": setting, **{out: _mean(g[col], f"{setting} {col}") for out, col in (
            ("acc", "test_acc"), ("norm_q", "norm_b_q"), ("norm_v", "norm_b_v"), ("drift", "drift_b_k"))},
            "predicted": _mean(g["predicted_drift"], f"{setting} predicted drifts") if adam else math.nan,
            "grad_k": _mean(g["grad_rms_b_k"], f"{setting} b_k gradient RMS")})
    return pd.DataFrame(rows)


def bias_table_latex(table: pd.DataFrame) -> str:
    """The `bias_table` as a booktabs tabular ("--" where there is no prediction)."""
    header = ["setting", "test acc.", r"$\|b_q\|$", r"$\|b_v\|$", r"drift of $b_k$", "predicted", r"RMS $g_{b_k}$"]
    rows = [[latex_escape(r["setting"])] + [_fmt(r[c]) for c in ("acc", "norm_q", "norm_v", "drift", "predicted",
                                                                  "grad_k")]
            for _, r in table.iterrows()]
    return _tabular(header, rows)


def verdict_table(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Per setting, over seeds and layers: counts of each verdict and the largest output change,
    tolerance and logit change."""
    require_columns(verdicts, ["setting", "verdict", "delta", "tolerance", "logit_delta"], "verdicts")
    return verdicts.groupby("setting", sort=False).agg(
        layers=("verdict", "size"),
        redundant=("verdict", lambda v: int((v == verdict.REDUNDANT).sum())),
        invalid=("verdict", lambda v: int((v == verdict.INVALID).sum())),
        not_redundant=("verdict", lambda v: int((v == verdict.NOT_REDUNDANT).sum())),
        max_delta=("delta", lambda v: finite_max(v, "output changes", strict=True)),
        max_tolerance=("tolerance", lambda v: finite_max(v, "tolerances", strict=True)),
        max_logit_delta=("logit_delta", lambda v: finite_max(v, "logit changes", strict=True))).reset_index()


def verdict_table_latex(table: pd.DataFrame) -> str:
    header = ["setting", "layers", "redundant", "invalid", "not red.", r"max $\Delta$", "tolerance",
              r"max $\Delta$logit"]
    rows = [[latex_escape(r["setting"]), str(int(r["layers"])), str(int(r["redundant"])), str(int(r["invalid"])),
             str(int(r["not_redundant"]))] + [_fmt(r[c]) for c in ("max_delta", "max_tolerance", "max_logit_delta")]
            for _, r in table.iterrows()]
    return _tabular(header, rows)


def verdict_results(verdicts: pd.DataFrame) -> tuple[list[Claim], dict[str, object]]:
    """Claims and macros of the end-of-training verdicts (`run_bias_study`'s second output).

    - train-drifted-bk-never-changes-function: number of not-redundant verdicts <= 0;
    - train-drift-verdict-has-power (only if the profile has Adam-family runs; a consistency check:
      the drifted b_k is large enough that the positive control shows): min over those runs of the
      number of redundant (powered) layers >= 1."""
    _require_columns(verdicts, "verdicts", ["setting", "seed", "optimizer", "verdict", "logit_delta",
                                            "prediction_changes", "tolerance", "control_delta"])
    if verdicts.empty:
        raise ValueError("verdicts is empty: no trained model to test")
    counts = verdicts["verdict"].value_counts()
    n_not = int(counts.get(verdict.NOT_REDUNDANT, 0))
    # a layer without power, or with no verdict at all, is not evidence of redundancy: it counts against
    not_shown = int((verdicts["verdict"] != verdict.REDUNDANT).sum())
    macros: dict[str, object] = {
        "TrainVerdictRedundant": int(counts.get(verdict.REDUNDANT, 0)),
        "TrainVerdictNotRedundant": n_not,
        "TrainVerdictInvalid": int(counts.get(verdict.INVALID, 0)),
        "TrainVerdictTotal": len(verdicts),
        "TrainMaxLogitDelta": finite_max(verdicts["logit_delta"], "logit changes"),
        "TrainPredictionChanges": int(finite_sum(verdicts.groupby(["setting", "seed"])["prediction_changes"].first(),
                                                 "prediction changes", strict=True)),
    }
    detectable = drift_verdict_min_detectable(verdicts)
    if detectable is not None:
        macros["TrainVerdictMinDetectable"] = detectable
    claims: list[Claim] = [build_claim(
        id="train-drifted-bk-never-changes-function",
        statement=("No trained key bias, under any optimizer, eps or dtype, changes an attention output beyond "
                   "rounding: every layer's verdict is redundant (number of verdicts that are not: not redundant, "
                   "without power, or missing)."),
        value=not_shown, bound=0, comparison="<=", kind="test",
        bound_origin="verdict.output_tolerance from the measured score and value maxima",
        min_detectable=detectable)]
    adam = verdicts[verdicts["optimizer"].str.startswith("adam")]
    if len(adam):
        powered = adam.groupby(["setting", "seed"])["verdict"].apply(lambda v: int((v == verdict.REDUNDANT).sum()))
        claims.append(build_claim(
            id="train-drift-verdict-has-power",
            statement=("The verdict could see a change of the drifted size in at least one layer of every "
                       "Adam-family run (min over those runs of the number of redundant, that is powered, layers)."),
            value=int(powered.min()), bound=1, comparison=">=", kind="consistency",
            bound_origin="at least one powered layer per run, the verdict rule's definition of a usable test"))
    return claims, macros

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
TRAIN_ACCURACY_AGREES_KEPT_REMOVED = register_claim(ClaimSpec(
    'train-accuracy-agrees-kept-removed', '04_training', 'test',
    origin='one image in 200, the rate of boundary flips between runs that differ by rounding; fixed before the runs',
    finding='training-unchanged',
    value_class='images',
))
TRAIN_DIVERGENCE_WITHIN_ROUNDING_CONTROL = register_claim(ClaimSpec(
    'train-divergence-within-rounding-control', '04_training', 'test',
    bound=DIVERGENCE_RATIO_BOUND,
    origin='one decade around rounding-sized controls of the same run, fixed before the runs',
    finding='training-unchanged',
    value_class='noise',
))
TRAIN_BK_GRADIENT_WITHIN_ROUNDING = register_claim(ClaimSpec(
    'train-bk-gradient-within-rounding', '04_training', 'test',
    bound=1.0,
    origin="verdict.gradient_tolerance from each step's measured query, value and upstream maxima",
    finding='training-unchanged',
    value_class='noise',
))
TRAIN_SGD_BK_STAYS_PUT = register_claim(ClaimSpec(
    'train-sgd-bk-stays-put', '04_training', 'test',
    bound=SGD_WALK_BOUND,
    origin="tail of an n-entry random walk of the verdict rule's per-step tolerances (theory)",
    finding='adam-drift-regimes',
    value_class='noise',
))
TRAIN_ADAM_DRIFT_MATCHES_NOISE_PREDICTION = register_claim(ClaimSpec(
    'train-adam-drift-matches-noise-prediction', '04_training', 'test',
    bound=1.0,
    origin='a factor of two, fixed before the runs (a consistent gradient drifts sqrt(T) farther)',
    finding='adam-drift-regimes',
    value_class='chaotic',
))
TRAIN_ADAMW_BIAS_DECAY_SHRINKS_BK = register_claim(ClaimSpec(
    'train-adamw-bias-decay-shrinks-bk', '04_training', 'consistency',
    bound=DECAY_DEV_BOUND,
    origin="the noise law's factor-of-two tolerance, fixed before the runs; AdamW's own decay rule",
    value_class='chaotic',
))
TRAIN_DRIFTED_BK_NEVER_CHANGES_FUNCTION = register_claim(ClaimSpec(
    'train-drifted-bk-never-changes-function', '04_training', 'test',
    bound=0.0,
    origin='verdict.output_tolerance from the measured score and value maxima',
    finding='training-unchanged',
    # the value is a count; min_detectable (tolerance / control change) is set by where training landed
    value_class='trained',
))
TRAIN_DRIFT_VERDICT_HAS_POWER = register_claim(ClaimSpec(
    'train-drift-verdict-has-power', '04_training', 'consistency',
    comparison='>=',
    bound=1.0,
    origin="at least one powered layer per run, the verdict rule's definition of a usable test",
))
