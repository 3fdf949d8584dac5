"""The invariance map's controls: the held-out calibration of the rounding null and the
size-matched positive control (power).

`calibrate_null_factor` fixes, before the sweep and on seeds it never uses, the factor kappa of
the low-precision tolerance (keybias.verdict.null_tolerance). `min_detectable_break` breaks
assumption (A1) by a known amount eps and returns the smallest eps the verdict rule detects.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from keybias import verdict as VD
from keybias.studies.invariance import cases as C
from keybias.studies.invariance import judge as J
from keybias.studies.invariance import measure as M

# the power probe and the power categories live with the cases (`measure` runs the probe and
# marks the cells; this module calibrates them), so that measure never imports this module
from keybias.studies.invariance.cases import (  # noqa: F401  (names of this module's interface)
    BREAK_GROUPS,
    BREAK_OPTIONS,
    POOLS,
    POWER_CASES_MHA,
    POWER_DTYPES,
    _pool_of,
    has_power,
    has_power_control,
    min_detectable_break,
    power_group,
)

CALIBRATION_CASES = 48
FAMILY_ALPHA = 0.05  # family-wise false-alarm rate of the low-precision tests of one dtype and magnitude
TAIL_FRACTION = 0.1  # the largest tenth of the held-out ratios fits the exponential tail
HELD_OUT_SEED_OFFSET = 1000  # calibration seeds: the sweep seed + this + k, never used by the sweep
# held-out calibration shapes: (embed_dim, num_heads, tgt_len, src_len, batch, mode, mask)
CALIBRATION_SHAPES = (
    (8, 2, 5, 5, 2, "eval", "none"), (16, 4, 7, 7, 2, "inference", "none"), (4, 2, 3, 3, 2, "eval", "causal"),
    (32, 4, 9, 9, 1, "inference", "bool"), (16, 2, 6, 6, 2, "eval", "key_padding"),
    (12, 3, 4, 8, 2, "eval", "none"), (4, 1, 5, 5, 2, "inference_no_fastpath", "float"),
    (16, 16, 5, 5, 2, "eval", "is_causal"),
)
EPS_GRID = C.EPS_GRID  # per-key score perturbations of the power control, 100 down to 10^-15
POWER_BOUND = C.POWER_BOUND  # a break of this size must be seen; a state that does not see it has no power


# ----------------------------------------------------------------------------- calibration
def _held_out_pool(configs: list[dict], dtype: str) -> list[dict]:
    """The sweep's own plain-MHA configurations of `dtype` (every shape, mask, mode and
    need_weights it runs), plus the generic CALIBRATION_SHAPES, as calibration templates."""
    own = [c for c in configs if c["family"] in ("mha", "sizes") and c["option"] == "plain" and c["bias"]
           and c["dtype"] == dtype and c["mask"] != "is_causal_only" and c["src_len"] >= 2]
    generic = [C.base_config(family="mha", case="calibration", embed_dim=e, num_heads=h, tgt_len=lq, src_len=lk,
                             batch=b, mode=mode, mask=mask, dtype=dtype, self_attention=lq == lk)
               for e, h, lq, lk, b, mode, mask in CALIBRATION_SHAPES]
    return own + generic


def calibrate_null_factor(configs: list[dict], magnitudes, *, cases: int = CALIBRATION_CASES,
                          seed_offset: int = HELD_OUT_SEED_OFFSET) -> tuple[dict, pd.DataFrame]:
    """The factor kappa of the low-precision tolerance, per dtype and magnitude, from held-out runs.

    Held out: the sweep's own plain nn.MultiheadAttention configurations of each low-precision dtype
    (and a few generic shapes), rerun with seeds the sweep never uses (its seed + seed_offset + k),
    cycled until there are at least `cases` per dtype. Plain MHA is the one configuration whose exact
    invariance the proof (notebook 01) and the float64 analytic bound establish without any
    low-precision data; so in its own dtype the b_k change there is rounding alone, and

        change caused by b_k / (null at the start + null at the perturbed state)

    is what kappa must cover. kappa[dtype][m] is 1 or, if larger, `tail_quantile` of the ratios at magnitude m: the
    ratio the sweep's tests of that dtype exceed with probability at most FAMILY_ALPHA together
    (the rounding of a state moved far by a large b_k differs from that of a small move, so each
    magnitude gets its own factor). The sweep then judges every configuration, plain MHA included, on its own seed.
    Returns ({dtype: {magnitude: kappa}}, the calibration rows)."""
    magnitudes = [float(m) for m in magnitudes]
    low = [d for d in dict.fromkeys(c["dtype"] for c in configs if c["family"] != "device") if d != "float64"]
    rows = []
    threads = torch.get_num_threads()
    for dt in low:
        dtype = C.TORCH_DTYPES[dt]
        pool = _held_out_pool(configs, dt)
        for k in range(max(cases, len(pool))):
            cfg = {**pool[k % len(pool)], "seed": pool[k % len(pool)]["seed"] + seed_offset + k}
            big = cfg["embed_dim"] * max(cfg["tgt_len"], cfg["src_len"]) * cfg["batch"] >= 65536
            torch.set_num_threads(threads if big else 1)  # tiny problems: no thread-pool wake-ups
            case = C.case(cfg)
            with C.mode_context(cfg):
                obj, inp = case["build"](dtype)
                bk = case["roles"](obj)["b_k"]
                typical = C.tolerance_stats(*case["stats"](obj, inp)[:4], cfg["num_heads"])["norm_k"]
                gen = torch.Generator().manual_seed(cfg["seed"] + 7)
                y0 = C.first_output(case["run"](obj, inp))
                n0 = C.rounding_null(case, obj, inp, y0)
                for mag in magnitudes:
                    direction = torch.randn(bk[0].numel(), generator=gen, dtype=torch.float64)
                    with C.perturbed(bk, direction / direction.norm() * mag * typical):
                        y1 = C.first_output(case["run"](obj, inp))
                        n1 = C.rounding_null(case, obj, inp, y1)
                    d = C.change(y1, y0)
                    denom = n0 + n1
                    rows.append({"dtype": dt, "case": k, "seed": cfg["seed"], "embed_dim": cfg["embed_dim"],
                                 "num_heads": cfg["num_heads"], "tgt_len": cfg["tgt_len"], "src_len": cfg["src_len"],
                                 "batch": cfg["batch"], "mode": cfg["mode"], "mask": cfg["mask"],
                                 "need_weights": cfg["need_weights"], "batch_first": cfg["batch_first"],
                                 "magnitude": mag, "change": d, "null_sum": denom,
                                 "ratio": d / denom if denom > 0 else math.nan})
    torch.set_num_threads(threads)
    frame = pd.DataFrame(rows)
    factors = {}
    for dt in low:
        # every low-precision decision of the dtype: b_k at each magnitude, the drop and the joint shift
        tests = sum(c["dtype"] == dt and c["family"] != "device" for c in configs) * (len(magnitudes) + 2)
        factors[dt] = {}
        for mag in magnitudes:
            ratios = frame.loc[(frame.dtype == dt) & (frame.magnitude == mag), "ratio"].to_numpy(dtype=float)
            ratios = ratios[np.isfinite(ratios)]
            if not ratios.size:
                raise ValueError(f"calibration of the rounding null for {dt} at magnitude {mag:g} has no case "
                                 "with a nonzero null")
            # 1 is the triangle inequality's value if each null were as large as its state's own
            # rounding error; the held-out tail can only raise it
            factors[dt][mag] = max(1.0, tail_quantile(ratios, tests))
    return factors, frame


def tail_quantile(ratios: np.ndarray, tests: int, *, alpha: float = FAMILY_ALPHA,
                  tail_fraction: float = TAIL_FRACTION) -> float:
    """The ratio that `tests` independent draws exceed with probability at most `alpha` together.

    The largest of n held-out ratios is only their (1 - 1/n) quantile; the sweep makes `tests`
    draws of its own, so the factor must reach the (1 - alpha/tests) quantile (Bonferroni). The
    upper tail is modelled as exponential above the threshold t that leaves the largest k = a tenth
    (at least ten) of the ratios: with beta their mean excess over t, the quantile is
    t + beta ln((k/n) / (alpha/tests)). Never below the largest ratio seen."""
    r = np.sort(np.asarray(ratios, dtype=float))
    n = r.size
    k = min(max(int(math.ceil(tail_fraction * n)), 10), n - 1)
    if k < 1 or tests < 1:
        return float(r.max())
    threshold = r[n - k - 1]
    beta = float((r[n - k:] - threshold).mean())
    quantile = threshold + beta * math.log((k / n) / (alpha / tests))
    return float(max(quantile, r.max()))


# ----------------------------------------------------------------------------- power of a cell
# the share of known breaks a (category, dtype, magnitude) cell may miss: the bound the sweep's claim then tests
MAX_MISS_RATE = J.MAX_MISS_RATE
MIN_HELD_OUT_BREAKS = 10  # fewer known breaks with a verdict than this: the cell's power is not shown
POWER_CASES = 32  # held-out known-break cases per breaking category and half-precision dtype
def _as_group(cfg: dict, group: str) -> dict:
    """A template configuration turned into one of `group` (same shape, mask and mode)."""
    if group.startswith("MHA "):
        option = group.removeprefix("MHA ")
        return {**cfg, "option": option, "case": group, "add_bias_kv": "add_bias_kv" in option,
                "add_zero_attn": "zero_attn" in option}
    name = group.split(" ", 1)[1]
    if group.startswith("variant "):
        return {**cfg, "variant": name, "case": group}
    return {**cfg, "variant": name, "case": group, "mask": "causal" if name in ("gpt2", "qwen2") else "none"}


def _power_templates(configs: list[dict], dtype: str, group: str) -> list[dict]:
    """The sweep's own configurations of a breaking category in `dtype` (every shape, mask, mode and
    need_weights it runs), or, where the sweep has none, its family's configurations turned into
    that category; for MHA also the generic CALIBRATION_SHAPES. Seeds are replaced later."""
    pool = _pool_of(group)
    usable = [c for c in configs if c["dtype"] == dtype and c["family"] != "device" and c["bias"]
              and c["mask"] != "is_causal_only" and c["src_len"] >= 2]
    if pool == "MHA":
        family = [c for c in usable if c["family"] in ("mha", "sizes") and (c["option"] == "plain" or power_group(c) == group)]
    else:
        family = [c for c in usable if c["family"] == ("variants" if pool == "variants" else "hf")]
    own = [c for c in family if power_group(c) == group]
    out = own or [_as_group(c, group) for c in family]
    if pool == "MHA":
        out = out + [_as_group(C.base_config(family="mha", case=group, embed_dim=e, num_heads=h, tgt_len=lq,
                                             src_len=lk, batch=b, mode=mode, mask=mask, dtype=dtype,
                                             self_attention=lq == lk), group)
                     for e, h, lq, lk, b, mode, mask in CALIBRATION_SHAPES if mask != "is_causal"]
    return out


POWER_COLUMNS = ["dtype", "group", "pool", "case", "option", "variant", "seed", "embed_dim", "src_len", "mode",
                 "mask", "need_weights", "magnitude", "verdict", "verdict_float64", "bk_rel_float64",
                 "tolerance_rel"]


def calibrate_power(configs: list[dict], magnitudes, null_factor: dict, *, cases: int = POWER_CASES,
                    seed_offset: int = HELD_OUT_SEED_OFFSET) -> tuple[frozenset, pd.DataFrame]:
    """The (category, dtype, magnitude) cells whose low-precision verdict has no power, from held-out runs.

    Per half-precision dtype and per breaking category of each family the sweep runs in it (MHA's
    add_bias_kv, add_zero_attn and both; each breaking variant; each breaking Hugging Face model;
    `BREAK_GROUPS`): held-out runs of that category's own sweep configurations (each at least once,
    cycled to at least `cases`), with seeds the sweep never uses. Each is measured exactly as the
    sweep measures (`measure.measure`, kappa from `null_factor`, at every magnitude, so at every
    perturbed state); its float64 twin says whether b_k changed the exact function. A category's
    cell whose verdict calls more than MAX_MISS_RATE of those known breaks redundant, or that has
    fewer than MIN_HELD_OUT_BREAKS of them with a valid verdict, has no power there; a category the
    proof calls redundant is judged on its family's pool (all of that family's breaking categories
    together). The sweep marks the verdicts of cells without power `invalid`, before it runs.
    Returns (frozenset of unpowered (group, dtype, magnitude), one row per held-out case and magnitude)."""
    magnitudes = [float(m) for m in magnitudes]
    low = [d for d in dict.fromkeys(c["dtype"] for c in configs if c["family"] != "device") if d in POWER_DTYPES]
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dt in low:
            present = {_pool_of(power_group(c)) for c in configs if c["dtype"] == dt and c["family"] != "device"}
            for group in [g for g, pool in BREAK_GROUPS.items() if pool in present]:
                templates = _power_templates(configs, dt, group)
                # every template at least once (the category's every shape, mask and mode), cycled to `cases`
                for k in range(max(cases, len(templates)) if templates else 0):
                    base = templates[k % len(templates)]
                    cfg = {**base, "seed": base["seed"] + seed_offset + cases + k}
                    try:
                        _, per_mag = M.measure(cfg, magnitudes, null_factor)
                    except RuntimeError as exc:  # PyTorch's own refusal of a template: not a case
                        if not M.pytorch_rejection(exc):
                            raise
                        continue
                    rows += [{"dtype": dt, "group": group, "pool": _pool_of(group), "case": k,
                              "option": cfg["option"], "variant": cfg["variant"], "seed": cfg["seed"],
                              "embed_dim": cfg["embed_dim"], "src_len": cfg["src_len"], "mode": cfg["mode"],
                              "mask": cfg["mask"], "need_weights": cfg["need_weights"],
                              "magnitude": e["magnitude"], "verdict": e["verdict"],
                              "verdict_float64": e["verdict_float64"], "bk_rel_float64": e["bk_rel_float64"],
                              "tolerance_rel": e["tolerance_rel"]} for e in per_mag]
    finally:
        torch.set_num_threads(threads)
    frame = pd.DataFrame(rows, columns=POWER_COLUMNS)
    cells = power_cells(frame)
    unpowered = frozenset((r.group, r.dtype, float(r.magnitude)) for r in cells.itertuples() if not r.powered)
    return unpowered, frame


def _known_and_missed(g: pd.DataFrame) -> tuple[int, int]:
    known = g[(g.verdict_float64 == VD.NOT_REDUNDANT) & g.verdict.isin([VD.REDUNDANT, VD.NOT_REDUNDANT])]
    return len(known), int((known.verdict == VD.REDUNDANT).sum())


def power_cells(frame: pd.DataFrame, unpowered: frozenset | None = None) -> pd.DataFrame:
    """Per held-out (group, dtype, magnitude): known breaks with a valid verdict, how many were
    missed, and whether the cell has power (at least MIN_HELD_OUT_BREAKS known, at most
    MAX_MISS_RATE of them missed). One row per breaking category and one per family pool (its
    categories together: the cell of the family's redundant categories). `unpowered`, if given,
    must agree (it is what the sweep used)."""
    cols = ["group", "dtype", "magnitude", "known_breaks", "missed", "miss_rate", "powered"]
    if not len(frame):
        return pd.DataFrame(columns=cols)
    out = []
    for by in (frame.groupby(["group", "dtype", "magnitude"], sort=False),
               frame.groupby(["pool", "dtype", "magnitude"], sort=False)):
        for (group, dt, mag), g in by:
            known, missed = _known_and_missed(g)
            powered = known >= MIN_HELD_OUT_BREAKS and missed <= MAX_MISS_RATE * known
            out.append({"group": group, "dtype": dt, "magnitude": float(mag), "known_breaks": known,
                        "missed": missed, "miss_rate": missed / known if known else math.nan, "powered": powered})
    t = pd.DataFrame(out, columns=cols)
    if unpowered is not None:
        t["powered"] = [(r.group, r.dtype, float(r.magnitude)) not in unpowered for r in t.itertuples()]
    return t
