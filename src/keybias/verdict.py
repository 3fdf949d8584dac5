"""The verdict rule: is a measured change rounding noise, or a real change of the function?

Two computations that are equal in exact arithmetic (attention with b_k and with
b_k + delta) differ in floating point by rounding alone. We bound that difference with
the probabilistic rounding-error model of Higham & Mary (2019): an inner product of n
terms computed with unit roundoff u has error at most

    lambda * sqrt(n) * u * sum_t |a_t b_t|

with probability at least 1 - 2 exp(-lambda^2 / 2) per result. We take the failure
probability p = 1e-6, so lambda = sqrt(2 ln(2/p)) ~= 5.4; no constant is tuned by hand.

Attention output. One row of scores is s_j = q . k_j / sqrt(d) (d = head dimension).
Its rounding error is at most e_s = lambda sqrt(d) u S, with S = max_ij sum_t |q_it k_jt|
/ sqrt(d) (the absolute score magnitude, with whichever b_k was used). A score error e_s
changes each softmax weight by at most 2 e_s relative, so the output row
y = sum_j p_j v_j moves by at most 2 e_s V, plus lambda sqrt(n) u V for the weighted sum
over n keys (V = max |v|). The two runs each carry this error, hence

    tolerance_out = 2 * lambda * u * V * (2 sqrt(d) S + sqrt(n)).

Output projection (optional keywords). When the measured output is the module output
y = W_o a + b_o rather than the attention row a itself, take V as the output-space
value bound V_o = max_i sum_t |W_o[i, t]| max_j |v_jt| (so |W_o da| <= V_o * the relative
bound above), and add the rounding of the E-term product W_o a in each run, lambda sqrt(E)
u V_o, plus one rounding of the stored result (2 u |y|_max over the two runs):

    tolerance_out = 2 * lambda * u * V_o * (2 sqrt(d) S + sqrt(n) + sqrt(E)) + 2 u |y|_max.

With out_dim = 0 and output_abs_max = 0 (the defaults) this is the formula above.

Gradient of b_k. In exact arithmetic g_bk = sum_i q_i r_i / sqrt(d) with
r_i = sum_j ds_ij = 0, because the softmax Jacobian annihilates the all-ones vector. In
floating point r_i is the rounding error of an n-term sum of ds_ij = p_ij (g_ij - <p, g>_i)
with g_ij = dy_i . v_j, so |ds_ij| summed over j is at most 2 d G V (G = max |dy|), and

    tolerance_grad = 2 * lambda * u * sqrt(n) * m * sqrt(d) * Q * V * G

for m query rows (Q = max |q|).

Measured rounding (below float64). The bounds above are worst cases; in bfloat16 and
float16 the output bound can exceed the output itself, and then no test has power. We also
run every configuration in float64 and measure the rounding error the low-precision run
actually commits on these very inputs: e_0 = |y_u(b_k) - y_64(b_k)| and
e_1 = |y_u(b_k + delta) - y_64(b_k + delta)|. By the triangle inequality

    |y_u(b_k + delta) - y_u(b_k)| <= e_0 + e_1 + |y_64(b_k + delta) - y_64(b_k)|,

so a low-precision change above e_0 + e_1 + tolerance_out(float64) cannot be rounding: the
exact function changed. `measured_tolerance` takes the smaller of this and the analytic bound
(both bound the rounding part). No constant enters; the threshold moves with u, with the
magnitudes of q, k, v, W_o and with the data.

Because of that triangle inequality, a low-precision verdict judged with `measured_tolerance`
follows from the float64 one wherever the float64 change is within rounding: it is implied, not
tested. `null_tolerance` is the independent alternative the invariance sweep uses: the rounding
null is measured in the low-precision dtype itself, from transformations that are exact in real
arithmetic, times a factor calibrated on held-out data; no float64 number enters.

`classify` then compares the measured change with the tolerance, after checking that the
test has power: the positive control (perturbing b_q or b_v the same way) must exceed the
tolerance, and the tolerance must not exceed MAX_TOLERANCE_FRACTION of the output (a
tolerance of a fifth of the output would call a break of 15% rounding). Otherwise the
test has no power at this precision and the verdict is `invalid`.
"""

from __future__ import annotations

import math

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
}
FAILURE_PROBABILITY = 1e-6
LAMBDA = math.sqrt(2.0 * math.log(2.0 / FAILURE_PROBABILITY))

REDUNDANT = "redundant"
NOT_REDUNDANT = "not_redundant"
INVALID = "invalid"
SKIPPED = "skipped"
# Largest tolerance, as a fraction of max |output|, at which a verdict still has power. Fixed before
# the data: a change of 5% of the output is the smallest break the invariance study must see.
MAX_TOLERANCE_FRACTION = 0.05


def unit_roundoff(dtype) -> float:
    """Unit roundoff u = 2^-p of a dtype given as a name or a torch.dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype {dtype!r} unknown; allowed: {sorted(UNIT_ROUNDOFF)}")
    return UNIT_ROUNDOFF[name]


def output_tolerance(
    dtype,
    *,
    head_dim: int,
    n_keys: int,
    score_abs_max: float,
    value_abs_max: float,
    out_dim: int = 0,
    output_abs_max: float = 0.0,
) -> float:
    """Largest change of the attention output that rounding alone explains (see module doc).

    `out_dim` (E, the inner size of an output projection) and `output_abs_max` (max |y|)
    are optional; with their defaults this is the bare attention-row bound."""
    u = unit_roundoff(dtype)
    inner = 2 * math.sqrt(head_dim) * score_abs_max + math.sqrt(n_keys) + math.sqrt(out_dim)
    return 2 * LAMBDA * u * value_abs_max * inner + 2 * u * output_abs_max


def gradient_tolerance(
    dtype,
    *,
    head_dim: int,
    n_queries: int,
    n_keys: int,
    query_abs_max: float,
    value_abs_max: float,
    upstream_abs_max: float,
) -> float:
    """Largest b_k gradient entry that rounding alone explains (see module doc)."""
    u = unit_roundoff(dtype)
    return (
        2 * LAMBDA * u * math.sqrt(n_keys) * n_queries * math.sqrt(head_dim)
        * query_abs_max * value_abs_max * upstream_abs_max
    )


def measured_tolerance(
    analytic: float, *, error_base: float, error_perturbed: float, reference_tolerance: float = 0.0
) -> float:
    """min(analytic bound, e_0 + e_1 + float64 tolerance): the rounding part of a low-precision
    change, bounded by the errors measured against a float64 reference (see module doc)."""
    measured = error_base + error_perturbed + reference_tolerance
    if not math.isfinite(measured):
        return analytic
    return min(analytic, measured)


def classify(delta: float, tolerance: float, *, control_delta: float, output_abs: float | None = None) -> str:
    """`redundant` if delta is within rounding, `not_redundant` if not; `invalid` if the
    positive control is itself within rounding, or (when `output_abs`, max |output|, is given) the
    tolerance exceeds MAX_TOLERANCE_FRACTION of it: either way the test could not have seen a break."""
    if not (math.isfinite(delta) and math.isfinite(control_delta)):
        return INVALID
    if control_delta <= tolerance:
        return INVALID
    if output_abs is not None and not tolerance <= MAX_TOLERANCE_FRACTION * output_abs:
        return INVALID
    return REDUNDANT if delta <= tolerance else NOT_REDUNDANT


def null_tolerance(analytic: float, *, null_base: float, null_perturbed: float, factor: float) -> float:
    """min(analytic bound, factor * (null_base + null_perturbed)): the rounding part of a change,
    judged in the change's own dtype.

    null_base and null_perturbed are the largest output changes that transformations exact in
    real arithmetic cause at the two states compared (the rounding null, measured in the same
    dtype); `factor` is calibrated on held-out configurations. Unlike `measured_tolerance`, no
    float64 number enters, so a low-precision verdict does not follow from the float64 one. When
    the null is not available (not finite) or carries no information at either state (zero: the
    transformations changed no bit there), the analytic bound alone is the tolerance."""
    null = factor * (null_base + null_perturbed)
    if not (math.isfinite(null) and null_base > 0 and null_perturbed > 0):
        return analytic
    return min(analytic, null)
