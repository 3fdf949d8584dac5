"""The symbolic study's claim declarations (keybias.core.claimspec).

`keybias.studies.symbolic.derive.symbolic_claims` emits these claims; the claim contract checks
every emitted record against its spec here."""

from __future__ import annotations

from keybias.core.claimspec import ClaimSpec, register_claim

SYMBOLIC_SCORE_SPLIT = register_claim(ClaimSpec(
    'symbolic-score-split', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_SOFTMAX_SHIFT_INVARIANCE = register_claim(ClaimSpec(
    'symbolic-softmax-shift-invariance', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_ZERO_GRADIENT = register_claim(ClaimSpec(
    'symbolic-zero-gradient', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_JACOBIAN_ONES_GRID = register_claim(ClaimSpec(
    'symbolic-jacobian-ones-grid', '01_symbolic', 'consistency',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_GRID_ZERO_DERIVATIVES = register_claim(ClaimSpec(
    'symbolic-grid-zero-derivatives', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_GRID_QUERY_BIAS_CONTROL = register_claim(ClaimSpec(
    'symbolic-grid-query-bias-control', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='positive control: every head, every size with two or more keys',
))
SYMBOLIC_QUERY_BIAS_MATTERS = register_claim(ClaimSpec(
    'symbolic-query-bias-matters', '01_symbolic', 'proof',
    comparison='>',
    bound=0.0,
    origin='exact arithmetic: any change is a counterexample',
))
SYMBOLIC_VALUE_BIAS_MATTERS = register_claim(ClaimSpec(
    'symbolic-value-bias-matters', '01_symbolic', 'proof',
    comparison='>',
    bound=0.0,
    origin='exact arithmetic: any change is a counterexample',
))
SYMBOLIC_KEY_BIAS_EXAMPLE = register_claim(ClaimSpec(
    'symbolic-key-bias-example', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_VALUE_BIAS_FOLD = register_claim(ClaimSpec(
    'symbolic-value-bias-fold', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
SYMBOLIC_VALUE_BIAS_FOLD_GRID = register_claim(ClaimSpec(
    'symbolic-value-bias-fold-grid', '01_symbolic', 'consistency',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
