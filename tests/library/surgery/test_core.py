"""keybias.surgery: exact where the identity holds, refused (model untouched) where it does not."""

from __future__ import annotations

import copy
import io
import itertools
import os
import warnings

import pytest
import torch
from torch import nn

from keybias import surgery

pytestmark = pytest.mark.filterwarnings("ignore::keybias.surgery.InPlaceWriteWarning",
                                        "ignore::keybias.surgery.FullyMaskedRowWarning")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

E, H, L, S, B = 8, 2, 4, 5, 3
TOL = 1e-12  # float64; outputs are O(1)


def _randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Nonzero random values for every parameter (biases included), float64."""
    gen = torch.Generator().manual_seed(seed)
    module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def _mha(seed=0, **kw) -> nn.MultiheadAttention:
    return _randomize(nn.MultiheadAttention(E, H, **kw), seed).eval()


def _inputs(m: nn.MultiheadAttention, seed=1):
    gen = torch.Generator().manual_seed(seed)
    kd, vd = m.kdim, m.vdim
    q = torch.randn(L, B, E, generator=gen, dtype=torch.float64)
    k = torch.randn(S, B, kd, generator=gen, dtype=torch.float64)
    v = torch.randn(S, B, vd, generator=gen, dtype=torch.float64)
    if m.batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[0, -2:] = True  # key padding on one batch row
    return q, k, v, mask


def _run(m, inputs, seed=5):
    q, k, v, mask = inputs
    torch.manual_seed(seed)  # same dropout mask in train mode
    return m(q, k, v, key_padding_mask=mask)[0]


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


OPTIONS = [
    dict(zip(("kdim", "batch_first", "add_bias_kv", "add_zero_attn", "bias"), combo, strict=True))
    for combo in itertools.product((None, 5), (False, True), (False, True), (False, True), (True, False))
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("tool", ["strip", "fold"])
def test_every_mha_option_exact_or_refused(opts, tool):
    kw = dict(opts)
    if kw["kdim"] is not None:
        kw["vdim"] = 7
    m = _mha(**kw)
    x = _inputs(m)
    y0 = _run(m, x)
    before = _snapshot(m)
    fn = surgery.strip_key_bias if tool == "strip" else surgery.fold_value_bias
    if kw["bias"] and kw["add_zero_attn"]:
        with pytest.raises(ValueError, match="add_zero_attn"):
            fn(m)
        assert _same(before, _snapshot(m))  # untouched
        return
    report = fn(m)
    y1 = _run(m, x)
    assert (y1 - y0).abs().max() <= TOL
    if kw["bias"]:
        assert report["parameters_saved"] == E
        assert report["modules_changed"] == ["<root>"]
        if kw["add_bias_kv"]:
            assert any("bias_" in f for f in report["parameters_folded"])
        assert sum(p.numel() for p in m.parameters()) == sum(v.numel() for v in before.values()) - E
    else:
        assert report["parameters_saved"] == 0
        assert report["unchanged"]


@pytest.mark.parametrize("add_zero_attn", [False, True])
def test_naive_key_bias_removal_breaks_where_the_tool_refuses_or_folds(add_zero_attn):
    """Positive controls: zeroing b_k alone changes the output with add_bias_kv
    (the tool folds into bias_k instead) and with add_zero_attn (the tool refuses)."""
    m = _mha(add_bias_kv=not add_zero_attn, add_zero_attn=add_zero_attn)
    x = _inputs(m)
    y0 = _run(m, x)
    with torch.no_grad():
        m.in_proj_bias[E : 2 * E] = 0
    assert (_run(m, x) - y0).abs().max() > 1e-3


def test_strip_is_exact_with_dropout_in_train_mode_and_fold_needs_opt_in():
    m = _mha(dropout=0.5).train()
    x = _inputs(m)
    y0 = _run(m, x)
    surgery.strip_key_bias(m)
    assert (_run(m, x) - y0).abs().max() <= TOL
    before = _snapshot(m)
    with pytest.raises(ValueError, match="dropout"):
        surgery.fold_value_bias(m)
    assert _same(before, _snapshot(m))  # the refused fold left every value as it was
    surgery.fold_value_bias(m, allow_dropout=True)
    m.eval()
    m_ref = _mha(dropout=0.5).eval()
    assert (_run(m, x) - _run(m_ref, x)).abs().max() <= TOL
    # train mode: rows no longer sum to one, the fold changes the output (why it is opt-in)
    m.train()
    m_ref.train()
    assert (_run(m, x) - _run(m_ref, x)).abs().max() > 1e-3


def test_nested_transformer_with_masks_strip_then_fold():
    torch.manual_seed(0)
    model = nn.Transformer(d_model=E, nhead=H, num_encoder_layers=2, num_decoder_layers=2,
                           dim_feedforward=16, dropout=0.0, batch_first=True)
    _randomize(model).eval()
    gen = torch.Generator().manual_seed(3)
    src = torch.randn(B, S, E, generator=gen, dtype=torch.float64)
    tgt = torch.randn(B, L, E, generator=gen, dtype=torch.float64)
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -1] = True

    def run():
        return model(src, tgt, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)

    y0 = run()
    r1 = surgery.strip_key_bias(model)
    r2 = surgery.fold_value_bias(model)
    assert (run() - y0).abs().max() <= TOL
    assert len(r1["modules_changed"]) == 2 + 2 * 2  # encoder self, decoder self + cross
    assert r1["parameters_saved"] == r2["parameters_saved"] == 6 * E
    assert "decoder.layers.1.multihead_attn" in r1["modules_changed"]
    # idempotent: a second pass changes nothing
    again = surgery.strip_key_bias(model)
    assert again["parameters_saved"] == 0 and len(again["unchanged"]) == 6


def test_encoder_fast_path_float32():
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    _randomize(enc).float()
    x = torch.randn(B, S, E)
    with torch.inference_mode():
        y0 = enc(x)
    surgery.strip_key_bias(enc)
    with torch.inference_mode():
        y1 = enc(x)
    assert (y1 - y0).abs().max() <= 1e-4  # float32 rounding
    assert (y1 - y0).abs().max() < (y0 - enc.layers[0].self_attn.out_proj.bias.sum()).abs().max()


def test_refusal_is_all_or_nothing_and_names_the_module():
    model = nn.ModuleDict({"good": nn.MultiheadAttention(E, H),
                           "bad": nn.MultiheadAttention(E, H, add_zero_attn=True)})
    _randomize(model)
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"bad \(nn.MultiheadAttention\): add_zero_attn"):
        surgery.strip_key_bias(model)
    assert _same(before, _snapshot(model))
    assert not hasattr(model["good"], "parametrizations")


def test_state_dict_round_trip_after_surgery():
    def build():
        model = nn.Sequential(nn.MultiheadAttention(E, H, add_bias_kv=True, batch_first=True))
        return model

    src = _randomize(build(), seed=0)
    surgery.strip_key_bias(src)
    surgery.fold_value_bias(src)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    dst = _randomize(build(), seed=9)  # different values everywhere
    surgery.strip_key_bias(dst)
    surgery.fold_value_bias(dst)
    dst.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(B, S, E, dtype=torch.float64)
    assert torch.equal(src[0](x, x, x)[0], dst[0](x, x, x)[0])
    # only b_q is stored for the packed bias; its gradient flows
    stored = src[0].parametrizations.in_proj_bias.original
    assert stored.numel() == E
    src[0](x, x, x)[0].sum().backward()
    assert stored.grad is not None and stored.grad.abs().sum() > 0
    # back to a plain MultiheadAttention with zeros in the removed slots
    torch.nn.utils.parametrize.remove_parametrizations(src[0], "in_proj_bias")
    assert torch.count_nonzero(src[0].in_proj_bias[E:]) == 0


def test_model_without_attention_returns_empty_report_with_message():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    report = surgery.strip_key_bias(model)
    assert report["parameters_saved"] == 0 and not report["modules_changed"]
    assert "no attention modules" in report["message"]


class RotaryAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(E, E)
        self.k_proj = nn.Linear(E, E)
        self.rotary_emb = nn.Identity()


def test_unknown_attention_is_listed_not_changed():
    model = nn.Sequential(RotaryAttention(), nn.MultiheadAttention(E, H))
    before = _snapshot(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = surgery.strip_key_bias(model, storage="zeros")
    assert [n["module"] for n in report["not_handled"]] == ["0"]
    assert "rotate" in report["not_handled"][0]["reason"]
    assert torch.equal(model[0].k_proj.bias, before["0.k_proj.bias"])
    assert report["modules_changed"] == ["1"]


def test_unknown_attention_as_the_root_module_is_listed():
    report = surgery.strip_key_bias(RotaryAttention())
    assert "no attention modules that this tool handles" in report["message"]
    assert report["not_handled"][0]["module"] == "<root>"
    assert report["parameters_saved"] == 0


transformers = pytest.importorskip("transformers")


def _tiny_bert(**kw):
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=32, max_position_embeddings=32, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return _randomize(transformers.BertModel(cfg)).eval()


def test_hf_bert_strip_and_fold_exact_with_padding_mask():
    model = _tiny_bert()
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    y0 = model(input_ids=ids, attention_mask=mask).last_hidden_state
    r1 = surgery.strip_key_bias(model)
    r2 = surgery.fold_value_bias(model, allow_dropout=True)
    y1 = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (y1 - y0).abs().max() <= 1e-10
    assert r1["parameters_saved"] == r2["parameters_saved"] == 2 * 16
    assert model.encoder.layer[0].attention.self.key.bias is None
    assert "encoder.layer.0.attention.output.dense.bias" in r2["parameters_folded"][0]
    # standard save/load: a fresh model loads the stripped state_dict with strict=False,
    # keeps its own (random) b_k, and still computes the same function
    fresh = _tiny_bert()
    with torch.no_grad():
        for layer in fresh.encoder.layer:
            layer.attention.self.key.bias.normal_()
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    assert sorted(missing) == [f"encoder.layer.{i}.attention.self.{n}.bias" for i in (0, 1) for n in ("key", "value")]
    with torch.no_grad():
        for layer in fresh.encoder.layer:
            layer.attention.self.value.bias.zero_()  # the folded b_v is zero in the stripped model
    assert (fresh(input_ids=ids, attention_mask=mask).last_hidden_state - y0).abs().max() <= 1e-10


def test_hf_bert_fold_refuses_dropout_and_relative_key_query():
    model = _tiny_bert()
    with pytest.raises(ValueError, match="dropout"):
        surgery.fold_value_bias(model)
    model = _tiny_bert()
    for layer in model.encoder.layer:
        layer.attention.self.position_embedding_type = "relative_key_query"
    before = _snapshot(model)
    with pytest.raises(ValueError, match="relative_key_query"):
        surgery.strip_key_bias(model)
    assert _same(before, _snapshot(model))


def test_hf_vit_strip_and_fold_exact():
    cfg = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                 image_size=8, patch_size=4, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "eager"
    model = _randomize(transformers.ViTModel(cfg)).eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    y0 = model(pixel_values=x).last_hidden_state
    assert surgery.strip_key_bias(model)["parameters_saved"] == 16
    assert surgery.fold_value_bias(model)["parameters_saved"] == 16
    # ViT's eager attention takes the softmax in float32 even for a float64 model, so the
    # change is float32 rounding of the softmax (scores here are O(10)), not float64's
    change = (model(pixel_values=x).last_hidden_state - y0).abs().max()
    assert change <= 1e-5
    with torch.no_grad():  # positive control: a b_q change of the same kind is visible
        next(m for m in model.modules() if type(m).__name__ == "ViTAttention").q_proj.bias.add_(1.0)
    assert (model(pixel_values=x).last_hidden_state - y0).abs().max() > 1e3 * change


def test_deepcopy_of_stripped_mha_works():
    m = _mha()
    surgery.strip_key_bias(m)
    c = copy.deepcopy(m)
    x = _inputs(m)
    assert torch.equal(_run(m, x), _run(c, x))
