"""SymPy derivations: the key bias is invisible to softmax attention, the others are not.

General results use a symbolic number of keys n (and head dimension d) with `Sum`; the
results that SymPy can only check for concrete sizes are checked on a grid of (n, d,
heads). Every function returns plain data: SymPy expressions, their LaTeX, and booleans
computed by simplification (never asserted by hand).
"""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import sympy as sp
from sympy.simplify.simplify import factor_sum, sum_simplify

from keybias.core.recorder import Claim
from keybias.core.reduce import finite_count, finite_sum
from keybias.studies.config import StudyConfig
from keybias.studies.params import Param

PARAMETERS = {
    "grid_n": Param(int, many=True, positive=True, maximum=12, help="numbers of keys checked on the grid"),
    "grid_d": Param(int, many=True, positive=True, maximum=6, help="head dimensions checked on the grid"),
    "grid_heads": Param(int, many=True, positive=True, maximum=3, help="numbers of heads on the grid"),
}


@dataclasses.dataclass(frozen=True)
class SymbolicConfig(StudyConfig):
    """The grid of notebook 01, validated once against `PARAMETERS`; defaults = the smoke profile."""

    PARAMETERS = PARAMETERS
    STUDY = "01_symbolic"

    grid_n: tuple[int, ...] = (1, 2)
    grid_d: tuple[int, ...] = (1, 2)
    grid_heads: tuple[int, ...] = (1, 2)


# The assumptions of the proof, in the order the paper lists them; later notebooks test each.
ASSUMPTIONS = [
    ("A1", "every key slot of a softmax row goes through the same biased key projection, so each score of query i moves by the same q_i.b_k",
     "add_bias_kv, add_zero_attn, learned sink logits or sink keys"),
    ("A2", "scores are linear in the key: no normalisation of k after the bias",
     "QK-norm, cosine attention"),
    ("A3", "no per-key transformation follows the bias",
     "rotary position embeddings (RoPE)"),
    ("A4", "the weights are a softmax over exactly those slots, which ignores a constant shift",
     "sigmoid attention, linear or ReLU attention"),
    ("A5", "masks and position biases are added to the scores and do not depend on b_k",
     "(ALiBi and additive masks satisfy it)"),
    ("A6", "each row keeps at least one unmasked key, so the softmax is defined",
     "fully masked rows"),
    ("A7", "the key projection feeds only the scores (keys are not reused as values)",
     "shared key/value projections"),
    ("A8", "exact arithmetic", "floating point: b_k then changes results by rounding only"),
]


# The attention model a check runs on. "mha" is nn.MultiheadAttention's formula; the others
# are the mutations the claim tests feed the same checks, each a plausible model that
# breaks one property the claims rely on, so that each check is seen to fail when it should.
MODELS = {
    "mha": "nn.MultiheadAttention: s_ij = (q_i + b_q).(k_j + b_k)/sqrt(d), o_i = sum_j p_ij (v_j + b_v)",
    "extra_key_slot": "one more key/value slot that bypasses the biased key projection "
                      "(add_zero_attn, add_bias_kv): breaks A1",
    "per_key_bias": "the key bias scaled by the key position, a per-key score term: breaks A1",
    "no_query_bias": "a query projection without bias",
    "no_value_bias": "a value projection without bias",
}


def _check_model(model: str, allowed=tuple(MODELS)) -> str:
    if model not in allowed:
        raise ValueError(f"model {model!r} unknown; allowed: {list(allowed)}")
    return model


def _row_symbols():
    n = sp.Symbol("n", integer=True, positive=True)
    j, i = sp.symbols("j i", integer=True, positive=True)
    s = sp.IndexedBase("s", real=True)
    c = sp.Symbol("c", real=True)
    return n, i, j, s, c


def normalised_weight(kind: str, s, i, j, n, c=0):
    """Weight of key i in a row of scores s (+ c): softmax, or elementwise sigmoid."""
    if kind == "softmax":
        return sp.exp(s[i] + c) / sp.Sum(sp.exp(s[j] + c), (j, 1, n))
    if kind == "sigmoid":
        return 1 / (1 + sp.exp(-(s[i] + c)))
    raise ValueError(f"normaliser {kind!r} unknown; allowed: ['softmax', 'sigmoid']")


def shift_invariance(kind: str = "softmax") -> dict:
    """softmax(s + c 1)_i = softmax(s)_i for symbolic n: exp(c) factors out of the sum.

    With kind="sigmoid" the same check fails, as it must: sigmoid attention is not
    shift-invariant (assumption A4).
    """
    n, i, j, s, c = _row_symbols()
    shifted = normalised_weight(kind, s, i, j, n, c)
    plain = normalised_weight(kind, s, i, j, n)
    if kind != "softmax":
        difference = sp.simplify(shifted - plain)
        return {"holds": difference == 0, "difference": difference, "latex": sp.latex(shifted)}
    expanded = sp.expand_power_exp(shifted)
    num, den = sp.fraction(expanded)
    factored = sp.expand_power_exp(num) / factor_sum(sp.Sum(sp.expand_power_exp(den.function), *den.limits))
    difference = sp.simplify(factored - plain)
    return {
        "holds": difference == 0,
        "difference": difference,
        "latex": (
            r"\operatorname{softmax}(s + c\mathbf{1})_i = "
            + sp.latex(shifted)
            + " = "
            + sp.latex(sp.simplify(factored))
            + r" = \operatorname{softmax}(s)_i"
        ),
    }


def key_bias_enters_as_shift(model: str = "mha") -> dict:
    """q.(k_j + b) / sqrt(d) = q.k_j / sqrt(d) + q.b / sqrt(d): the b term does not depend on j.

    SymPy expands the symbolic sum of the model's score itself; the terms without k form the
    shift, and the check is that they are non-zero, contain b and do not contain the key
    index j. With model="per_key_bias" (b scaled by the key position j) the check fails.
    """
    _check_model(model, ("mha", "per_key_bias"))
    d = sp.Symbol("d", integer=True, positive=True)
    t, j = sp.symbols("t j", integer=True, positive=True)
    q, k, b = sp.IndexedBase("q", real=True), sp.IndexedBase("k", real=True), sp.IndexedBase("b", real=True)
    bias = b[t] * j if model == "per_key_bias" else b[t]
    score = sp.Sum(q[t] * (k[j, t] + bias), (t, 1, d)) / sp.sqrt(d)
    terms = sp.Add.make_args(sp.expand(score.expand()))
    key_part = sp.Add(*[term for term in terms if term.has(k)])
    shift = sp.Add(*[term for term in terms if not term.has(k)])
    return {
        "holds": shift != 0 and shift.has(b) and j not in shift.free_symbols
        and sp.simplify(score - key_part - shift) == 0,
        "shift": shift,
        "latex": sp.latex(score) + " = " + sp.latex(key_part) + " + " + sp.latex(shift),
    }


def zero_gradient(kind: str = "softmax") -> dict:
    """d softmax(s + c 1)_i / dc = 0 for symbolic n, i.e. the softmax Jacobian maps 1 to 0.

    Since every score of row i contains q_i.b_k / sqrt(d), dL/db_k = sum_i q_i / sqrt(d) *
    (J_i^T dL/dp_i) . 1 = 0 for any loss L. The Jacobian form J 1 = 0 is displayed for the
    reader and checked on concrete sizes by `jacobian_ones_grid`. With kind="sigmoid" the
    derivative is not zero (assumption A4 broken).
    """
    n, i, j, s, c = _row_symbols()
    p = normalised_weight(kind, s, i, j, n, c)
    derivative = sp.simplify(sp.diff(p, c))
    pj, pk = sp.IndexedBase("p", positive=True), sp.Symbol("k", integer=True, positive=True)
    jacobian_times_ones = pj[i] - pj[i] * sp.Sum(pj[pk], (pk, 1, n))
    return {
        "holds": derivative == 0,
        "derivative": derivative,
        "latex_derivative": r"\frac{\partial}{\partial c}" + sp.latex(p) + " = " + sp.latex(derivative),
        "latex_jacobian": r"(J\mathbf{1})_i = " + sp.latex(jacobian_times_ones) + r" = 0 \quad\text{when } \textstyle\sum_k p_k = 1",
    }


def jacobian_ones_grid(ns: list[int], kind: str = "softmax") -> pd.DataFrame:
    """On concrete n: the Jacobian of softmax(s), computed by SymPy, times the ones vector is 0
    (not so for kind="sigmoid")."""
    rows = []
    for n in ns:
        s = sp.symbols(f"s0:{n}", real=True)
        if kind == "sigmoid":
            weights = sp.Matrix([1 / (1 + sp.exp(-x)) for x in s])
        else:
            weights = sp.Matrix([sp.exp(x) for x in s]) / sum(sp.exp(x) for x in s)
        product = weights.jacobian(sp.Matrix(s)) * sp.ones(n, 1)
        rows.append({"n_keys": n, "jacobian_ones_zero": all(vanishes(x) for x in product)})
    return pd.DataFrame(rows)


def attention_output(n: int, d: int, heads: int = 1, model: str = "mha"):
    """Single-query multi-head attention output with symbolic q, k_j, v_j and key bias b.

    Returns (outputs per head and value dimension, key-bias symbols, query-bias symbols,
    value-bias symbols). Head h uses the slice h*d:(h+1)*d of every vector. `model` picks
    nn.MultiheadAttention ("mha") or one of the mutations in `MODELS`; "extra_key_slot" adds
    a slot with key symbols ke_t and value symbols ve_t that b_k does not reach.
    """
    _check_model(model)
    width = d * heads
    q = sp.symbols(f"q0:{width}", real=True)
    bq = sp.symbols(f"bq0:{width}", real=True)
    bk = sp.symbols(f"bk0:{width}", real=True)
    bv = sp.symbols(f"bv0:{width}", real=True)
    K = sp.Matrix(n, width, lambda r, t: sp.Symbol(f"k{r}_{t}", real=True))
    V = sp.Matrix(n, width, lambda r, t: sp.Symbol(f"v{r}_{t}", real=True))
    query = [0] * width if model == "no_query_bias" else bq
    value = [0] * width if model == "no_value_bias" else bv
    key_scale = [r + 1 if model == "per_key_bias" else 1 for r in range(n)]
    keys = [[K[r, t] + key_scale[r] * bk[t] for t in range(width)] for r in range(n)]
    values = [[V[r, t] + value[t] for t in range(width)] for r in range(n)]
    if model == "extra_key_slot":
        keys.append([sp.Symbol(f"ke_{t}", real=True) for t in range(width)])
        values.append([sp.Symbol(f"ve_{t}", real=True) for t in range(width)])
    outputs = []
    for h in range(heads):
        cols = range(h * d, (h + 1) * d)
        scores = [sum((q[t] + query[t]) * key[t] for t in cols) / sp.sqrt(d) for key in keys]
        weights = [sp.exp(x) for x in scores]
        total = sum(weights)
        outputs += [sum(w * val[t] for w, val in zip(weights, values, strict=True)) / total for t in cols]
    return outputs, bk, bq, bv


def vanishes(expression) -> bool:
    """True if a rational function of exponentials is identically zero.

    Putting it over one denominator and expanding the numerator combines every product of
    exponentials into one exp(sum), so equal terms cancel exactly; much faster than simplify.
    """
    return expression == 0 or sp.expand(sp.numer(sp.together(expression))) == 0


def grid_check(n: int, d: int, heads: int, model: str = "mha") -> dict:
    """On concrete sizes: every output's derivative in every b_k entry is identically 0,
    while the derivative of each head's first output in its first b_q entry (the positive
    control) is not; with a single key the control is zero too, since softmax of one score is 1.
    `seconds` is the wall time of the check (machine-specific)."""
    t0 = time.perf_counter()
    outputs, bk, bq, _ = attention_output(n, d, heads, model)
    nonzero = sum(not vanishes(sp.diff(o, b)) for o in outputs for b in bk)
    control = sum(not vanishes(sp.diff(outputs[h * d], bq[h * d])) for h in range(heads))
    return {
        "n_keys": n,
        "head_dim": d,
        "num_heads": heads,
        "derivatives": len(outputs) * len(bk),
        "nonzero_derivatives": int(nonzero),
        "query_bias_controls": heads,
        "nonzero_query_bias_controls": int(control),
        "seconds": time.perf_counter() - t0,
    }


def grid(cfg: SymbolicConfig, model: str = "mha") -> pd.DataFrame:
    """`grid_check` on every (keys, head dimension, heads) of the config (already validated)."""
    rows = [grid_check(n, d, h, model) for h in cfg.grid_heads for n in cfg.grid_n for d in cfg.grid_d]
    return pd.DataFrame(rows)


def counterexamples(model: str = "mha") -> dict:
    """Explicit sizes where b_q and b_v change the output, so only b_k is redundant.

    Two keys k = (0, 1), values v = (0, 1), one dimension, q = 1 before its bias:
    the output is softmax((1 + b_q) k) . v = e^{1+b_q} / (1 + e^{1+b_q}), which is e/(1+e) at
    b_q = 0 and e^2/(1+e^2) at b_q = 1. A value bias b_v = 1 adds exactly 1 to the output.
    With model="extra_key_slot" the extra slot has key 0 and value 0 (add_zero_attn).
    """
    outputs, bk, bq, bv = attention_output(n=2, d=1, model=model)
    out = outputs[0]
    sym = lambda name: sp.Symbol(name, real=True)  # noqa: E731
    base = {sym("q0"): 1, sym("k0_0"): 0, sym("k1_0"): 1, sym("v0_0"): 0, sym("v1_0"): 1,
            sym("ke_0"): 0, sym("ve_0"): 0, bk[0]: 0, bq[0]: 0, bv[0]: 0}

    def at(symbol, value):
        return sp.simplify(out.subs({**base, symbol: value}))

    ref = at(bk[0], 0)
    with_bq, with_bv, with_bk = at(bq[0], 1), at(bv[0], 1), at(bk[0], 5)
    return {
        "reference": ref,
        "query_bias": with_bq,
        "value_bias": with_bv,
        "key_bias": with_bk,
        "query_delta": float(sp.Abs(with_bq - ref)),
        "value_delta": float(sp.Abs(with_bv - ref)),
        "key_delta": float(sp.Abs(with_bk - ref)),
        "latex": (
            r"o(b_q{=}0) = " + sp.latex(ref) + r",\quad o(b_q{=}1) = " + sp.latex(with_bq)
            + r",\quad o(b_v{=}1) = " + sp.latex(with_bv) + r",\quad o(b_k{=}5) = " + sp.latex(with_bk)
        ),
    }


def value_bias_fold(normalised: bool = True) -> dict:
    """W_o sum_j p_j (v_j + b_v) + b_o = W_o sum_j p_j v_j + (b_o + W_o b_v) when sum_j p_j = 1.

    Shown for symbolic n on one output coordinate, where W_o b_v is the scalar beta. Without
    the row-sum condition the two sides differ by exactly beta (sum_j p_j - 1). With
    normalised=False the weights need not sum to one (sigmoid attention) and the fold fails.
    """
    n = sp.Symbol("n", integer=True, positive=True)
    j = sp.Symbol("j", integer=True, positive=True)
    p, v = sp.IndexedBase("p", real=True), sp.IndexedBase("v", real=True)
    beta, b_o = sp.symbols("beta b_o", real=True)
    with_bias = sp.Sum(p[j] * (v[j] + beta), (j, 1, n)) + b_o
    folded = sp.Sum(p[j] * v[j], (j, 1, n)) + (b_o + beta)
    residual = sum_simplify(sp.expand(with_bias.expand() - folded))
    row_sum = sp.Sum(p[j], (j, 1, n))
    residual_is_row_sum_gap = sp.simplify(residual - beta * (row_sum - 1)) == 0
    vanishes_on_simplex = sp.simplify(residual.subs(row_sum, 1) if normalised else residual) == 0
    return {
        "holds": residual_is_row_sum_gap and vanishes_on_simplex,
        "residual": residual,
        "latex": (
            sp.latex(with_bias) + " = " + sp.latex(folded)
            + r" + \beta\Big(\textstyle\sum_{j=1}^{n} p_j - 1\Big)"
        ),
    }


def fold_grid(ns: list[int], normalised: bool = True) -> pd.DataFrame:
    """The fold checked with a full output projection on concrete sizes (2 outputs, 2 values);
    normalised=False drops the condition that the weights sum to one."""
    rows = []
    for n in ns:
        p = sp.symbols(f"p0:{n}", real=True)
        V = sp.Matrix(n, 2, lambda r, t: sp.Symbol(f"v{r}_{t}", real=True))
        bv = sp.Matrix(sp.symbols("bv0:2", real=True))
        Wo = sp.Matrix(2, 2, sp.symbols("w0:4", real=True))
        bo = sp.Matrix(sp.symbols("bo0:2", real=True))
        mix = sum(((V[r, :].T + bv) * p[r] for r in range(n)), sp.zeros(2, 1))
        original = Wo * mix + bo
        folded = Wo * sum((V[r, :].T * p[r] for r in range(n)), sp.zeros(2, 1)) + (bo + Wo * bv)
        on_simplex = (original - folded).subs(p[-1], 1 - sum(p[:-1])) if normalised else original - folded
        rows.append({"n_keys": n, "residual_zero": bool(sp.simplify(on_simplex) == sp.zeros(2, 1))})
    return pd.DataFrame(rows)


def assumptions_table() -> pd.DataFrame:
    return pd.DataFrame(ASSUMPTIONS, columns=["id", "assumption", "broken by"])


# ----------------------------------------------------------------------------- claims
EXACT = "exact arithmetic: the proof allows no non-zero term"
COUNTEREXAMPLE = "exact arithmetic: any change is a counterexample"


def _count(frame: pd.DataFrame, failing: pd.Series, what: str) -> float:
    """Rows of `frame` where `failing` is True; NaN for an empty frame or a missing column, so the
    claim then fails by name (`keybias.core.reduce`)."""
    return finite_count(failing if len(frame) else pd.Series(dtype=float), what)


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series(dtype=float)


def symbolic_claims(split: dict, shift: dict, grad: dict, jacobian: pd.DataFrame, grid_rows: pd.DataFrame,
                    counter: dict, fold: dict, folds: pd.DataFrame) -> list[Claim]:
    """The claims of notebook 01 from the results of the checks above (pure: a test can pass
    the results of a mutated model, see `MODELS`, and see each claim fail).

    The exact symbolic results are `proof` checks (SymPy checks an identity; nothing is
    measured), the grid re-checks of the general results are `consistency` checks."""
    multi_key = grid_rows[grid_rows["n_keys"] >= 2] if "n_keys" in grid_rows else grid_rows.iloc[0:0]
    return [
        Claim("symbolic-score-split", kind="proof", bound_origin=EXACT,
              identity="q.(k_j + b_k)/sqrt(d) = q.k_j/sqrt(d) + q.b_k/sqrt(d), whose last term does not depend on j",
              statement="For any head dimension d, SymPy splits q.(k_j + b_k)/sqrt(d) into q.k_j/sqrt(d) plus a non-zero term in b_k that does not depend on the key index j.",
              value=int(not split["holds"]), bound=0, comparison="=="),
        Claim("symbolic-softmax-shift-invariance", kind="proof", bound_origin=EXACT,
              identity="softmax(s + c 1)_i = softmax(s)_i for a symbolic number of keys n",
              statement="For any number of keys n, softmax(s + c 1) = softmax(s); SymPy simplifies the difference to 0.",
              value=int(not shift["holds"]), bound=0, comparison="=="),
        Claim("symbolic-zero-gradient", kind="proof", bound_origin=EXACT,
              identity="d softmax(s + c 1)_i / dc = 0 for a symbolic number of keys n",
              statement="For any number of keys n, the derivative of every softmax weight along the all-ones shift is identically 0, so dL/db_k = 0 for any loss.",
              value=int(not grad["holds"]), bound=0, comparison="=="),
        Claim("symbolic-jacobian-ones-grid", kind="consistency", bound_origin=EXACT,
              statement="Cross-check of the zero-gradient proof: on every grid size n, the explicit Jacobian of softmax over n symbolic scores maps the all-ones vector to zero.",
              value=_count(jacobian, ~_column(jacobian, "jacobian_ones_zero").astype(bool), "Jacobian rows not mapping 1 to 0"),
              bound=0, comparison="=="),
        Claim("symbolic-grid-zero-derivatives", kind="proof", bound_origin=EXACT,
              identity="d o / d b_k = 0 for every output coordinate and every entry of b_k, on each grid size",
              statement="On every grid size, every derivative of the multi-head attention output with respect to every entry of b_k simplifies to 0.",
              value=finite_sum(_column(grid_rows, "nonzero_derivatives"), "non-zero b_k derivatives on the grid"),
              bound=0, comparison="=="),
        Claim("symbolic-grid-query-bias-control", kind="proof",
              bound_origin="positive control: every head, every size with two or more keys",
              identity="d o_h / d b_q != 0 for every head h on each grid size with two or more keys",
              statement="The same simplification sees a non-zero derivative where there is one: on every grid size with two or more keys, each head's output depends on its query bias.",
              value=_count(multi_key, _column(multi_key, "nonzero_query_bias_controls")
                           < _column(multi_key, "query_bias_controls"), "grid sizes whose query-bias control vanished"),
              bound=0, comparison="=="),
        Claim("symbolic-query-bias-matters", kind="proof", bound_origin=COUNTEREXAMPLE,
              identity="o(b_q = 1) - o(b_q = 0) = e^2/(1 + e^2) - e/(1 + e) != 0 in the two-key example",
              statement="In the two-key example, setting b_q = 1 changes the output.", value=counter["query_delta"], bound=0, comparison=">"),
        Claim("symbolic-value-bias-matters", kind="proof", bound_origin=COUNTEREXAMPLE,
              identity="o(b_v = 1) - o(b_v = 0) = 1 in the two-key example",
              statement="In the two-key example, setting b_v = 1 changes the output.", value=counter["value_delta"], bound=0, comparison=">"),
        Claim("symbolic-key-bias-example", kind="proof", bound_origin=EXACT,
              identity="o(b_k = 5) = o(b_k = 0) in the two-key example",
              statement="In the same example, setting b_k = 5 leaves the output exactly unchanged.", value=counter["key_delta"], bound=0, comparison="=="),
        Claim("symbolic-value-bias-fold", kind="proof", bound_origin=EXACT,
              identity="W_o sum_j p_j (v_j + b_v) + b_o = W_o sum_j p_j v_j + (b_o + W_o b_v) + W_o b_v (sum_j p_j - 1)",
              statement="For any n, W_o sum_j p_j (v_j + b_v) + b_o = W_o sum_j p_j v_j + (b_o + W_o b_v) whenever sum_j p_j = 1, and the residual is W_o b_v (sum_j p_j - 1) otherwise.",
              value=int(not fold["holds"]), bound=0, comparison="=="),
        Claim("symbolic-value-bias-fold-grid", kind="consistency", bound_origin=EXACT,
              statement="Cross-check of the fold: with a full 2x2 output projection, the fold residual simplifies to zero on every grid size once the weights sum to one.",
              value=_count(folds, ~_column(folds, "residual_zero").astype(bool), "grid sizes with a fold residual"),
              bound=0, comparison="=="),
    ]
