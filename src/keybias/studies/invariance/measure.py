"""The invariance map, measurement layer: does changing b_k change what attention computes?

For each configuration (module, options, mode, mask, sizes, dtype, device) `measure`

1. builds the module twice from one seed, in the configuration's dtype and in float64, with
   nonzero random biases (PyTorch initialises in_proj_bias to zero);
2. perturbs b_k, at each magnitude m separately, by a random vector of norm m times the median
   key norm, and b_q and b_v the same way (the positive controls: a control within the tolerance
   makes that magnitude `invalid`, the test had no power there);
3. judges each magnitude on its own. In float64 the tolerance is `verdict.output_tolerance`, the
   analytic rounding bound. Below float64 it is `verdict.null_tolerance`: the rounding null of
   this very computation, in its own dtype, measured by transformations that are exact in real
   arithmetic (query side times a, key side divided by a, `cases.qk_rescaled`), at the
   unperturbed and at the perturbed state, times a factor calibrated on held-out seeds
   (`calibrate_null_factor`). No float64 number enters a low-precision verdict;
4. runs the float64 twin the same way (`verdict_float64`, the noise floor), sets b_k to zero
   (the "drop" surgery) and takes one backward pass (the b_k gradient against its bound);
5. records the code path that ran (MHA's fused fast path or its slow path, and SDPA's backend).

`min_detectable_break` is the size-matched positive control: a per-key score perturbation of
known size eps, judged by the same rule, gives the smallest break each dtype and size would see.
A configuration PyTorch rejects is a row with status `rejected` and PyTorch's message; absent
devices, and devices present but not asked for, are rows saying so. All have verdict `skipped`.
`expected_verdict` states what the proof predicts and which assumption fails (keybias.studies.fixtures.variants).
The judge layer is keybias.studies.invariance.judge, the figures and tables keybias.studies.invariance.show.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import pandas as pd
import torch

from keybias import verdict as VD
from keybias.studies.config import StudyConfig
from keybias.studies.fixtures import variants as V
from keybias.studies.fixtures.hf_attention import EXPECTED as HF_EXPECTED
from keybias.studies.fixtures.hf_attention import MODELS as HF_MODELS
from keybias.studies.invariance import cases as C
from keybias.studies.invariance.schema import TABLES
from keybias.studies.params import DTYPES, Param, ParameterError

FAMILIES = ("mha", "sizes", "realistic", "layers", "sdpa", "variants", "hf")
OPTIONS = (
    "plain",
    "bias_false",
    "add_bias_kv",
    "add_zero_attn",
    "add_bias_kv_zero_attn",
    "kdim_vdim",
    "dropout",
)
MODES = C.MODES
MASKS = (
    "none",
    "bool",
    "float",
    "causal",
    "is_causal",
    "is_causal_only",
    "key_padding",
    "fully_masked_row",
)
SDPA_BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
LAYERS = ("encoder_layer", "decoder_layer_self", "decoder_layer_cross", "transformer")
ALL_DEVICES = ("cpu", "cuda", "mps")
_base = C.base_config  # the tests build single configurations with it
NULL_FACTORS = C.NULL_FACTORS
REALISTIC_OPTIONS = ("plain", "kdim_vdim", "add_bias_kv", "add_zero_attn", "add_bias_kv_zero_attn")
DROPOUT_P = 0.1
PARAMETERS = {
    "families": Param(str, many=True, choices=FAMILIES, help="which parts of the map to run"),
    "embed_dims": Param(int, many=True, positive=True, help="model widths E of the MHA grid"),
    "num_heads": Param(
        int, many=True, positive=True,
        help="head counts of the MHA grid (those dividing E; one head per channel is always added)",
    ),
    "seq_len": Param(int, positive=True, help="query = key length of the option grid"),
    "batch_size": Param(int, positive=True, help="batch of the option grid"),
    "options": Param(str, many=True, choices=OPTIONS, help="constructor options of nn.MultiheadAttention"),
    "modes": Param(str, many=True, choices=MODES, help="train, eval or no-grad mode, with the fast path on or off"),
    "masks": Param(str, many=True, choices=MASKS, help="kinds of mask (attn_mask, is_causal, key_padding_mask)"),
    "need_weights": Param(bool, many=True, help="values of need_weights"),
    "batch_first": Param(bool, many=True, help="values of batch_first (cycled over the grid)"),
    "dtypes": Param(str, many=True, choices=DTYPES, help="dtypes"),
    "sizes": Param(
        str, many=True,
        help="size sweep of plain MHA (entries 'embed_dim:num_heads:tgt_len:src_len:batch')",
    ),
    "size_dtypes": Param(str, many=True, choices=DTYPES, help="dtypes of the size sweep"),
    "variants": Param(str, many=True, choices=V.VARIANTS, help="reference variants (keybias.studies.fixtures.variants)"),
    "hf_models": Param(str, many=True, choices=HF_MODELS, help="Hugging Face families (keybias.studies.fixtures.hf_attention.MODELS)"),
    "magnitudes": Param(
        float, many=True, positive=True, help="|delta| / median key norm of the perturbations"
    ),
    "realistic": Param(
        str, many=True,
        help="realistic-size subset (entries 'embed_dim:num_heads:tgt_len:src_len:batch:option', "
             f"option one of {list(REALISTIC_OPTIONS)})",
    ),
    "realistic_dtypes": Param(str, many=True, choices=DTYPES, help="dtypes of the realistic-size subset"),
    "calibration_cases": Param(int, positive=True,
                               help="held-out configurations per dtype that calibrate the rounding null"),
    "seed": Param(int, minimum=0, help="seed of weights, inputs and perturbations"),
}


# ----------------------------------------------------------------------------- validation
def _check_list(name: str, values, allowed) -> list:
    values = list(values)
    if not values:
        raise ValueError(f"{name} must be non-empty; allowed: {list(allowed)}")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: {bad} not allowed; allowed: {list(allowed)}")
    return values


def parse_size(text: str) -> tuple[int, int, int, int, int]:
    """'E:H:Lq:Lk:B' -> ints; ValueError if malformed or num_heads does not divide embed_dim."""
    parts = str(text).split(":")
    try:
        e, h, lq, lk, b = (int(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"sizes entry {text!r} must be 'embed_dim:num_heads:tgt_len:src_len:batch' (integers)"
        ) from None
    if min(e, h, lq, lk, b) <= 0 or e % h:
        raise ValueError(f"sizes entry {text!r}: all positive and num_heads must divide embed_dim")
    return e, h, lq, lk, b


def parse_realistic(text: str) -> tuple[int, int, int, int, int, str]:
    """'E:H:Lq:Lk:B:option' -> (E, H, Lq, Lk, B, option); ValueError names what is wrong."""
    size, sep, option = str(text).rpartition(":")
    if not sep or option not in REALISTIC_OPTIONS:
        raise ValueError(f"realistic entry {text!r} must be 'embed_dim:num_heads:tgt_len:src_len:batch:option' "
                         f"with option one of {list(REALISTIC_OPTIONS)}")
    return (*parse_size(size), option)


# ----------------------------------------------------------------------------- configurations
def _option_kwargs(option: str, embed_dim: int) -> dict:
    kw = {"option": option}
    if option == "bias_false":
        kw["bias"] = False
    if option in ("add_bias_kv", "add_bias_kv_zero_attn"):
        kw["add_bias_kv"] = True
    if option in ("add_zero_attn", "add_bias_kv_zero_attn"):
        kw["add_zero_attn"] = True
    if option == "kdim_vdim":
        kw.update(kdim=embed_dim + 3, vdim=max(embed_dim // 2, 1) + 1, self_attention=False)
    if option == "dropout":
        kw["dropout"] = DROPOUT_P
    return kw


def _heads_for(embed_dim: int, num_heads: list[int]) -> list[int]:
    return sorted({h for h in num_heads if embed_dim % h == 0} | {embed_dim})


@dataclasses.dataclass(frozen=True)
class InvarianceConfig(StudyConfig):
    """Every setting of notebook 02, validated once against `PARAMETERS`; defaults = the smoke profile.
    `check` also parses the size entries, so a malformed one is refused before any work."""

    PARAMETERS = PARAMETERS
    STUDY = "02_invariance"

    families: tuple[str, ...] = ("mha", "sizes", "realistic", "layers", "sdpa", "variants")
    embed_dims: tuple[int, ...] = (4,)
    num_heads: tuple[int, ...] = (2,)
    seq_len: int = 3
    batch_size: int = 2
    options: tuple[str, ...] = ("plain", "add_zero_attn")
    modes: tuple[str, ...] = ("inference",)
    masks: tuple[str, ...] = ("none", "is_causal")
    need_weights: tuple[bool, ...] = (False,)
    batch_first: tuple[bool, ...] = (True,)
    dtypes: tuple[str, ...] = ("float32",)
    sizes: tuple[str, ...] = ("2:1:1:1:1",)
    size_dtypes: tuple[str, ...] = ("float32",)
    variants: tuple[str, ...] = ("softmax", "rope")
    hf_models: tuple[str, ...] = ("gpt2",)
    magnitudes: tuple[float, ...] = (1.0,)
    realistic: tuple[str, ...] = ("64:4:16:16:1:plain", "64:4:16:16:1:add_zero_attn")
    realistic_dtypes: tuple[str, ...] = ("float64",)
    calibration_cases: int = 48
    seed: int = 0

    def check(self) -> None:
        for entry in self.sizes:
            parse_size(entry)
        for entry in self.realistic:
            parse_realistic(entry)
        if any(not math.isfinite(m) for m in self.magnitudes):
            raise ParameterError(f"{self.STUDY}.magnitudes must be finite, got {list(self.magnitudes)}")


def build_configs(cfg: InvarianceConfig, *, device: str = "cpu") -> list[dict]:
    """All configurations of one sweep (`cfg` is validated when built; a device not in ALL_DEVICES
    is a ValueError naming the allowed ones)."""
    _check_list("device", [device], ALL_DEVICES)
    families, options, modes, masks = cfg.families, cfg.options, cfg.modes, cfg.masks
    dtypes, need_weights, batch_first, num_heads = cfg.dtypes, cfg.need_weights, cfg.batch_first, cfg.num_heads
    seq_len, batch_size, seed = cfg.seq_len, cfg.batch_size, cfg.seed
    parsed = [parse_size(s) for s in cfg.sizes]
    realistic = [parse_realistic(s) for s in cfg.realistic]
    if "realistic" in families and not realistic:
        raise ValueError("families includes 'realistic' but the realistic list is empty")
    size_dtypes, realistic_dtypes, variants, hf_models = cfg.size_dtypes, cfg.realistic_dtypes, cfg.variants, cfg.hf_models
    embed_dims = cfg.embed_dims
    devices = ["cpu"] + ([device] if device != "cpu" else [])
    pairs = [(e, h) for e in embed_dims for h in _heads_for(e, num_heads)]
    cfgs: list[dict] = []
    for dev in devices:
        common = {"device": dev, "seed": seed, "tgt_len": seq_len, "src_len": seq_len, "batch": batch_size}
        if "mha" in families:
            grid = itertools.product(options, modes, masks, dtypes, need_weights)
            for i, (opt, mode, mask, dt, nw) in enumerate(grid):
                e, h = pairs[i % len(pairs)]
                bf = batch_first[(i // len(pairs)) % len(batch_first)]
                kw = {**common, "embed_dim": e, "num_heads": h, "mode": mode, "mask": mask,
                      "dtype": dt, "need_weights": nw, "batch_first": bf}
                kw.update(_option_kwargs(opt, e))
                cfgs.append(C.base_config(family="mha", case=f"MHA {opt}", **kw))
            # every (embed_dim, num_heads) pair crossed with batch_first, mask, dtype and need_weights for
            # the plain module (the option grid above cycles the shapes); modes are cycled
            shapes = itertools.product(pairs, batch_first, masks, dtypes, need_weights)
            for i, ((e, h), bf, mask, dt, nw) in enumerate(shapes):
                cfgs.append(C.base_config(family="mha", case="MHA shapes", **{
                    **common, "embed_dim": e, "num_heads": h, "batch_first": bf, "mask": mask, "dtype": dt,
                    "need_weights": nw, "mode": modes[i % len(modes)]}))
            # single key and the option that breaks it
            for opt, dt in itertools.product(("plain", "add_zero_attn"), dtypes):
                kw = {**common, "tgt_len": 4, "src_len": 1, "self_attention": False, "dtype": dt}
                kw.update(_option_kwargs(opt, 8))
                cfgs.append(C.base_config(family="mha", case=f"MHA single key {opt}", **kw))
        if "sizes" in families:
            for (e, h, lq, lk, b), dt in itertools.product(parsed, size_dtypes):
                cfgs.append(C.base_config(
                    family="sizes", case="MHA sizes", embed_dim=e, num_heads=h, tgt_len=lq,
                    src_len=lk, batch=b, self_attention=lq == lk, dtype=dt, device=dev,
                    seed=seed, mode="inference",
                ))
        if "realistic" in families:
            for (e, h, lq, lk, b, opt), dt in itertools.product(realistic, realistic_dtypes):
                kw = _option_kwargs(opt, e)
                kw.setdefault("self_attention", lq == lk)
                cfgs.append(C.base_config(
                    family="realistic", case=f"realistic {opt}", embed_dim=e, num_heads=h, tgt_len=lq,
                    src_len=lk, batch=b, dtype=dt, device=dev, seed=seed, mode="eval", **kw,
                ))
        if "layers" in families:
            for layer, mode, dt, nf in itertools.product(LAYERS, ("train", "eval"), dtypes, (False, True)):
                cfgs.append(C.base_config(
                    family="layers", case=layer, variant=layer, option="norm_first" if nf else "plain",
                    mode=mode, mask="causal" if layer != "encoder_layer" else "none", dtype=dt,
                    embed_dim=16, num_heads=4, dropout=DROPOUT_P if mode == "train" else 0.0,
                    **{k: v for k, v in common.items()},
                ))
        if "sdpa" in families:
            for be, mask, dt, p in itertools.product(
                SDPA_BACKENDS, ("none", "bool", "float", "is_causal"), dtypes, (0.0, DROPOUT_P)
            ):
                cfgs.append(C.base_config(
                    family="sdpa", case=f"SDPA {be}", sdpa_backend=be, mask=mask, dtype=dt,
                    dropout=p, mode="train" if p else "eval", embed_dim=16, num_heads=2,
                    **common,
                ))
        if "variants" in families:
            for var, dt, mask in itertools.product(variants, dtypes, ("none", "causal")):
                cfgs.append(C.base_config(
                    family="variants", case=f"variant {var}", variant=var, dtype=dt, mask=mask,
                    embed_dim=16, num_heads=2, **common,
                ))
        if "hf" in families:
            for name, impl, dt in itertools.product(hf_models, ("eager", "sdpa"), dtypes):
                cfgs.append(C.base_config(
                    family="hf", case=f"HF {name}", variant=name, hf_attn_implementation=impl,
                    dtype=dt, embed_dim=16, num_heads=2, mask="causal" if name in ("gpt2", "qwen2") else "none",
                    **common,
                ))
    present = {"cpu": True, "cuda": torch.cuda.is_available(),
               "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())}
    for dev in ALL_DEVICES:
        if not present[dev]:
            why = f"absent_device: device {dev!r} not present on this machine (torch reports it unavailable)"
        elif dev not in devices:
            why = f"not_requested: device {dev!r} is present but was not asked for (DEVICE={device}); not run"
        else:
            continue
        cfgs.append(C.base_config(family="device", case=why, device=dev, dtype="float32"))
    return cfgs


# ----------------------------------------------------------------------------- measurement
TOLERANCE_RULE_FLOAT64 = "analytic bound"
TOLERANCE_RULE_LOW = "min(analytic bound, kappa x rounding null)"


def _min_or_nan(values) -> float:
    """min over the finite values, NaN if none is finite."""
    finite = [v for v in values if math.isfinite(v)]
    return min(finite) if finite else math.nan


def _max_or_nan(values) -> float:
    """max over all values, NaN if any is not finite (Python's max would depend on the order)."""
    values = list(values)
    return max(values) if values and all(math.isfinite(v) for v in values) else math.nan


def decision_margin(change: float, control: float, tolerance: float, output_abs: float) -> float:
    """How far a verdict sits from the thresholds that decide it, in decades: the smallest
    |log10| of change / tolerance (redundant or not), control / tolerance (power) and tolerance /
    (MAX_TOLERANCE_FRACTION |y|) (power). A verdict whose margin is below the spread of the
    tolerance across CPUs (its rounding null and its calibrated factor differ in the last digits,
    up to 6% for float32's factor) can flip on another machine; one far above it cannot. 0 for an
    exact tie; NaN where no ratio is finite."""
    ratios = (change / tolerance if tolerance > 0 else math.nan,
              control / tolerance if tolerance > 0 else math.nan,
              tolerance / (VD.MAX_TOLERANCE_FRACTION * output_abs) if output_abs > 0 else math.nan)
    logs = [abs(math.log10(r)) for r in ratios if math.isfinite(r) and r > 0]
    return min(logs) if logs else math.nan


def _combine(verdicts: list[str]) -> str:
    """One verdict for a configuration from its per-magnitude verdicts (each judged on its own)."""
    if VD.NOT_REDUNDANT in verdicts:
        return VD.NOT_REDUNDANT
    if VD.REDUNDANT in verdicts:
        return VD.REDUNDANT
    return VD.INVALID


def measure(cfg: dict, magnitudes, null_factor: dict | None = None,
            unpowered: frozenset = frozenset()) -> tuple[dict, list[dict]]:
    """Measure one configuration: (row of config columns plus summaries, one row per magnitude).

    Each magnitude is judged on its own: the b_k change, the b_q/b_v control and the tolerance
    all come from that magnitude. In float64 the tolerance is the analytic bound. Below float64
    it is `verdict.null_tolerance`: the analytic bound, or kappa (`null_factor[dtype][magnitude]`) times the rounding
    null measured in the same dtype at the unperturbed and at the perturbed state, whichever is
    smaller. No float64 number enters a low-precision verdict; the float64 twin of every
    configuration gives `verdict_float64` and the noise floor, separately.

    A magnitude has power only if its control exceeds the tolerance and the tolerance is at most
    `verdict.MAX_TOLERANCE_FRACTION` of the output; `unpowered` holds the (category, dtype, magnitude) cells the
    held-out calibration found without power (`controls.calibrate_power`, `controls.power_group`):
    their verdicts are `invalid`."""
    row = dict(cfg)
    dtype = C.TORCH_DTYPES[cfg["dtype"]]
    case = C.case(cfg)
    family = cfg["family"]
    low = dtype != torch.float64
    with C.mode_context(cfg):
        obj, inp = case["build"](dtype)
        roles = case["roles"](obj)
        if "b_k" not in roles:
            row.update(status="no_key_bias", reason="the module has no key bias (bias=False)",
                       verdict=VD.SKIPPED)
            return row, []
        log: list = []
        with C.trace_paths(log):
            base = C.first_output(case["run"](obj, inp))
        row["code_path"], row["sdpa_backend_used"] = C.describe_path(log, family)
        row.update(C.nonfinite(cfg, obj, base))
        if low:
            obj64, inp64 = case["build"](torch.float64)
            base64 = C.first_output(case["run"](obj64, inp64))
        else:
            obj64, inp64, base64 = obj, inp, base
        roles64 = case["roles"](obj64)
        q, k, v, w_o, n_slots = case["stats"](obj64, inp64)
        st0 = C.tolerance_stats(q, k, v, w_o, cfg["num_heads"], cfg["dropout"] if cfg["mode"] == "train" else 0.0)
        typical = {"b_q": st0["norm_q"], "b_k": st0["norm_k"], "b_v": st0["norm_v"], "joint": st0["norm_k"]}
        y_abs = C.finite_abs_max(base)
        y64_abs = C.finite_abs_max(base64)
        e_k = roles["b_k"][0].numel()
        # the precision the kernels work in: float64 models whose eager softmax is float32 round at float32
        work, work64 = dtype, torch.float64
        if case.get("working_dtype"):
            work64 = C.TORCH_DTYPES[case["working_dtype"]]
            if VD.unit_roundoff(case["working_dtype"]) > VD.unit_roundoff(dtype):
                work = work64
        null_base = C.rounding_null(case, obj, inp, base) if low else math.nan

        def judged_tolerance(st, null_pert, magnitude):
            analytic = C.output_tolerance_for(work, st, n_slots, y_abs)
            if not low:
                return analytic, analytic
            kappa = C.null_factor_for(null_factor, cfg["dtype"], magnitude)
            return VD.null_tolerance(analytic, null_base=null_base, null_perturbed=null_pert, factor=kappa), analytic

        gen = torch.Generator().manual_seed(cfg["seed"] + 7)
        per_mag = []
        joint_verdicts = []
        for mag in magnitudes:
            ch, ch64, smax, null_pert = {}, {}, {}, {}
            for r in roles:
                direction = torch.randn(e_k, generator=gen, dtype=torch.float64)
                delta = direction / direction.norm() * mag * typical[r]
                with C.perturbed(roles64[r], delta):
                    y64 = C.first_output(case["run"](obj64, inp64))
                    ch64[r] = C.change(y64, base64)
                    if r in ("b_k", "joint"):
                        st_m = C.tolerance_stats(*case["stats"](obj64, inp64)[:4], cfg["num_heads"])
                        smax[r] = max(st_m["S"], st0["S"])
                if low:
                    with C.perturbed(roles[r], delta):
                        y = C.first_output(case["run"](obj, inp))
                        ch[r] = C.change(y, base)
                        if r in ("b_k", "joint"):
                            null_pert[r] = C.rounding_null(case, obj, inp, y)
                else:
                    ch[r] = ch64[r]
            control = min(ch["b_q"], ch["b_v"])
            control64 = min(ch64["b_q"], ch64["b_v"])
            st = {**st0, "S": smax["b_k"]}
            tol, analytic = judged_tolerance(st, null_pert.get("b_k", math.nan), mag)
            tol64 = C.output_tolerance_for(work64, st, n_slots, y64_abs)
            cell_powered = C.has_power(unpowered, cfg, mag)
            entry = {
                "magnitude": mag, "bk_abs": ch["b_k"], "control_abs": control, "tolerance_abs": tol,
                "bk_rel": ch["b_k"] / y_abs, "control_rel": control / y_abs, "tolerance_rel": tol / y_abs,
                "analytic_rel": analytic / y_abs,
                "null_base_rel": null_base / y_abs, "null_perturbed_rel": null_pert.get("b_k", math.nan) / y_abs,
                "cell_powered": cell_powered,
                "verdict": (VD.classify(ch["b_k"], tol, control_delta=control, output_abs=y_abs)
                            if cell_powered else VD.INVALID),
                "bk_rel_float64": ch64["b_k"] / y64_abs, "tolerance_rel_float64": tol64 / y64_abs,
                "verdict_float64": VD.classify(ch64["b_k"], tol64, control_delta=control64, output_abs=y64_abs),
                "decision_margin": decision_margin(ch["b_k"], control, tol, y_abs),
            }
            if "joint" in roles:
                tol_j, _ = judged_tolerance({**st0, "S": smax["joint"]}, null_pert.get("joint", math.nan), mag)
                entry["joint_rel"] = ch["joint"] / y_abs
                entry["joint_tolerance_rel"] = tol_j / y_abs
                entry["verdict_joint"] = (VD.classify(ch["joint"], tol_j, control_delta=control, output_abs=y_abs)
                                          if cell_powered else VD.INVALID)
                joint_verdicts.append(entry["verdict_joint"])
            per_mag.append(entry)
        # drop: b_k -> 0, judged like a perturbation at the magnitude nearest to |b_k|
        drop = -roles64["b_k"][0].detach().double().cpu().clone()
        with C.perturbed(roles64["b_k"], drop):
            st_d = {**st0, "S": max(C.tolerance_stats(*case["stats"](obj64, inp64)[:4], cfg["num_heads"])["S"], st0["S"])}
        with C.perturbed(roles["b_k"], drop):
            y = C.first_output(case["run"](obj, inp))
            d_drop = C.change(y, base)
            null_drop = C.rounding_null(case, obj, inp, y) if low else math.nan
        drop_mag = float(drop.norm()) / typical["b_k"] if typical["b_k"] > 0 else 1.0
        tol_drop, _ = judged_tolerance(st_d, null_drop, drop_mag)
    nearest = min(per_mag, key=lambda e: abs(math.log(e["magnitude"]) - math.log(max(drop_mag, 1e-30))))
    verdicts = [e["verdict"] for e in per_mag]
    bk = [e["bk_rel"] for e in per_mag if math.isfinite(e["bk_rel"])]
    floor = [e["bk_rel_float64"] / e["tolerance_rel_float64"] for e in per_mag]
    row.update(
        status="measured", reason="", n_slots=n_slots, head_dim=st0["head_dim"],
        typical_key_norm=st0["norm_k"], output_abs_max=y_abs, working_dtype=str(work).removeprefix("torch."),
        max_rel_bk=max(bk) if bk else math.nan,
        verdict=_combine(verdicts),
        # the rule, not which of its two terms was smaller (that depends on the last bits)
        tolerance_rule=TOLERANCE_RULE_LOW if low else TOLERANCE_RULE_FLOAT64,
        magnitudes_judged=sum(v != VD.INVALID for v in verdicts),
        decision_margin_min=_min_or_nan([e["decision_margin"] for e in per_mag]),
        verdict_float64=_combine([e["verdict_float64"] for e in per_mag]),
        noise_floor_rel=_max_or_nan([e["bk_rel_float64"] for e in per_mag]),
        noise_floor_over_tol64=_max_or_nan(floor),
        null_factor=C.null_factor_for(null_factor, cfg["dtype"]) if low else math.nan,
        max_rel_drop=d_drop / y_abs,
        # the drop's tolerance and its size-matched control (b_q or b_v moved as far, at the nearest
        # magnitude): their ratio is the smallest share of a real bias's effect the drop would see
        drop_tolerance_rel=tol_drop / y_abs,
        drop_control_rel=nearest["control_abs"] / y_abs,
        drop_verdict=VD.classify(d_drop, tol_drop, control_delta=nearest["control_abs"], output_abs=y_abs),
    )
    if joint_verdicts:
        row["verdict_joint"] = _combine(joint_verdicts)
    if family == "layers":
        row["code_path"] = row["code_path"] + "(layer)"
    try:
        row.update(_gradient(cfg, case, dtype, st0, n_slots, work))
    except RuntimeError as exc:  # PyTorch's own refusal only; anything else stops the sweep
        if not pytorch_rejection(exc):
            raise
        row.update(grad_verdict=VD.SKIPPED, grad_reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return row, per_mag


def _gradient(cfg: dict, case: dict, dtype, st: dict, n_slots: int, work) -> dict:
    """One backward pass (grad enabled, so never the fused fast path)."""
    with C.mode_context(cfg, grad=True):
        obj, inp = case["build"](dtype)
        if isinstance(obj, dict):
            for t in obj.values():
                t.requires_grad_(True)
        out = C.first_output(case["run"](obj, inp))
        gen = torch.Generator().manual_seed(cfg["seed"] + 11)
        upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
        finite = torch.isfinite(out)
        (out.where(finite, torch.zeros_like(out)) * upstream).sum().backward()
        grads = case["grads"](obj)
    if grads is None:
        return {"grad_verdict": VD.INVALID}
    gq, gk, gv = (float(g.double().abs().max()) for g in grads)
    m = out.numel() // out.shape[-1]
    tol = VD.gradient_tolerance(
        work, head_dim=st["head_dim"], n_queries=m, n_keys=n_slots, query_abs_max=st["Q"],
        value_abs_max=st["V_g"], upstream_abs_max=float(upstream.double().abs().max()),
    )
    ctrl = max(gq, gv)
    return {
        "grad_bk": gk, "grad_bq": gq, "grad_bv": gv,
        "grad_ratio": gk / ctrl if ctrl > 0 else math.nan, "grad_tolerance": tol,
        "grad_verdict": VD.classify(gk, tol, control_delta=min(gq, gv)),
    }


# ----------------------------------------------------------------------------- the sweep
# PyTorch's own messages when it refuses a configuration. Only these make a row `rejected`: any
# other exception is a bug in the measurement or the environment, and stops the notebook.
PYTORCH_REJECTIONS = (
    "Need attn_mask if specifying the is_causal hint",
    "No viable backend for scaled_dot_product_attention was found",
    "No available kernel. Aborting execution",
)


def pytorch_rejection(exc: BaseException) -> bool:
    """True if `exc` is a RuntimeError whose message is one of PyTorch's refusals (PYTORCH_REJECTIONS)."""
    msg = " ".join(str(exc).split())
    return isinstance(exc, RuntimeError) and any(text in msg for text in PYTORCH_REJECTIONS)


def _rejected_row(cfg: dict, exc: Exception) -> dict:
    msg = " ".join(str(exc).split())[:300]
    return {**cfg, "status": "rejected", "reason": f"{type(exc).__name__}: {msg}", "verdict": VD.SKIPPED}
def expected_verdict(row: dict) -> tuple[str, str]:
    """What the proof predicts for a configuration, and which assumption decides it."""
    fam, var = row.get("family"), row.get("variant")
    if row.get("status") != "measured":
        return VD.SKIPPED, row.get("reason", "")
    if fam == "variants" and var in ("sigmoid",):
        return VD.NOT_REDUNDANT, V.DROP_IS_EXACT[var][1]
    if row.get("n_slots") == 1:
        return VD.INVALID, "a single key: softmax over one slot is 1, no score (b_q nor b_k) matters"
    if fam == "variants":
        exact, why = V.DROP_IS_EXACT[var]
        return (VD.REDUNDANT if exact else VD.NOT_REDUNDANT), why
    if fam == "hf":
        return HF_EXPECTED[var]
    if (row.get("add_zero_attn") or row.get("add_bias_kv")) and row.get("mask") == "is_causal" and not row.get("need_weights"):
        return VD.REDUNDANT, ("is_causal=True, need_weights=False: MHA hands is_causal to SDPA instead of the padded "
                              "attn_mask, and SDPA's causal mask hides the appended slots, so every visible slot shifts")
    if row.get("add_zero_attn"):
        return VD.NOT_REDUNDANT, "(A1) the zero key slot appended by add_zero_attn is not projected: its score stays 0"
    if row.get("add_bias_kv"):
        return VD.NOT_REDUNDANT, "(A1) the extra key bias_k is not projected, so its score misses q.b_k (exact jointly with bias_k += delta)"
    return VD.REDUNDANT, "all slots shifted by q.b_k; softmax is shift invariant"


def run_sweep(configs: list[dict], magnitudes, *, null_factor: dict | None = None,
              unpowered: frozenset = frozenset(), progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Measure every configuration.

    Returns (configurations, per magnitude, seconds): one row per configuration (rejected ones,
    absent devices and devices present but not asked for are `skipped` rows with the reason), one
    row per configuration and magnitude (`config_id` links them), and the wall seconds per
    configuration (machine-specific, kept apart from the data)."""
    magnitudes = [float(m) for m in magnitudes]
    if not magnitudes or any(not (m > 0 and math.isfinite(m)) for m in magnitudes):
        raise ValueError(f"magnitudes must be positive finite numbers, got {magnitudes!r}")
    rows, mags, times = [], [], []
    threads = torch.get_num_threads()
    for config_id, cfg in enumerate(configs):
        start, cpu = time.perf_counter(), time.process_time()
        # tiny problems run faster on one thread (no pool wake-ups); large ones use them all
        big = cfg["embed_dim"] * max(cfg["tgt_len"], cfg["src_len"]) * cfg["batch"] >= 65536
        torch.set_num_threads(threads if big else 1)
        per_mag = []
        if cfg["family"] == "device":
            row = {**cfg, "status": cfg["case"].split(":")[0], "verdict": VD.SKIPPED,
                   "reason": cfg["case"].split(":", 1)[1].strip()}
        else:
            try:
                row, per_mag = measure(cfg, magnitudes, null_factor, unpowered)
                if row["status"] == "measured" and C.has_power_control(cfg):
                    probe = C.min_detectable_break(cfg, null_factor, magnitudes, unpowered)
                    blind = set(probe.pop("blind_magnitudes", []))
                    row.update(probe, power_blind_states=len(blind))
                    if blind:  # the probe at that perturbed state saw no break: no power there
                        for e in per_mag:
                            if e["magnitude"] in blind:
                                e["verdict"] = VD.INVALID
                                if "verdict_joint" in e:
                                    e["verdict_joint"] = VD.INVALID
                        row["verdict"] = _combine([e["verdict"] for e in per_mag])
                        row["magnitudes_judged"] = sum(e["verdict"] != VD.INVALID for e in per_mag)
                        if "verdict_joint" in row:
                            row["verdict_joint"] = _combine([e["verdict_joint"] for e in per_mag])
            except RuntimeError as exc:  # PyTorch's own refusal is the result; anything else stops here
                if not pytorch_rejection(exc):
                    raise
                row, per_mag = _rejected_row(cfg, exc), []
        row["config_id"] = config_id
        row["expected"], row["assumption"] = expected_verdict(row)
        # every verdict is judged against its own dtype's tolerance (analytic, or the same-dtype
        # null): no float64 number enters it, so it is a test, not implied by the float64 twin
        # (the verdicts of one configuration in several dtypes are still correlated)
        row["independent"] = row.get("verdict") in (VD.REDUNDANT, VD.NOT_REDUNDANT)
        row["kdim"] = cfg["kdim"] or cfg["embed_dim"]
        row["vdim"] = cfg["vdim"] or cfg["embed_dim"]
        row["training"] = cfg["mode"] == "train"
        row["grad_enabled"] = cfg["mode"] in ("train", "eval")
        row["fastpath_enabled"] = cfg["mode"] != "inference_no_fastpath"
        rows.append(row)
        mags += [{"config_id": config_id, **e} for e in per_mag]
        times.append({"config_id": config_id, "family": cfg["family"], "dtype": cfg["dtype"],
                      "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu})
        if progress and config_id % 500 == 0:
            print(f"{config_id}/{len(configs)}", flush=True)
    torch.set_num_threads(threads)
    return (_declared(pd.DataFrame(rows), "data/invariance.csv"),
            _declared(pd.DataFrame(mags), "data/invariance_magnitudes.csv"), pd.DataFrame(times))


def _declared(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """`frame` with every column its schema declares: a quantity no configuration of this sweep
    measured (say the power probe, in a profile without a power-control configuration) is a
    column of NaN ("not measured"), so the judge reads every column by name and a missing one
    stops it instead of passing."""

    missing = [c for c in TABLES[table] if c not in frame.columns]
    return frame.assign(**dict.fromkeys(missing, math.nan)) if missing else frame


TARGET_CONFIGS = 2000  # the issue: the paper profile measures at least this many configurations


def expected_measurable(configs: list[dict]) -> int:
    """A lower bound on how many configurations will be measured (not skipped), from the
    configurations alone: it leaves out absent devices, bias=False (no b_k), MHA's is_causal
    without a mask (PyTorch refuses it) and every SDPA backend but MATH on the CPU (the fused CPU
    kernels accept only some dtypes and masks; counting none of them keeps this a lower bound)."""
    def skipped(c: dict) -> bool:
        return (c["family"] == "device" or not c["bias"]
                or (c["family"] == "mha" and c["mask"] == "is_causal_only")
                or (c["family"] == "sdpa" and c["device"] == "cpu" and c["sdpa_backend"] != "MATH"))
    return sum(not skipped(c) for c in configs)


def config_target(configs: list[dict], profile: str) -> int:
    """The bound of the configuration-count claim: the issue's TARGET_CONFIGS for the paper
    profile, else the profile's own `expected_measurable` count."""
    return TARGET_CONFIGS if profile == "paper" else expected_measurable(configs)
