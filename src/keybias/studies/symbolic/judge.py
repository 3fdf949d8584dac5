"""The symbolic study's claim declarations (keybias.core.claimspec).

`keybias.studies.symbolic.derive.symbolic_claims` emits these claims; the claim contract checks
every emitted record against its spec here."""

from __future__ import annotations

from keybias.core.claimspec import ClaimSpec, register_claim

register_claim(ClaimSpec(
    'symbolic-score-split', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-softmax-shift-invariance', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-zero-gradient', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-jacobian-ones-grid', '01_symbolic', 'consistency',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-grid-zero-derivatives', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-grid-query-bias-control', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='positive control: every head, every size with two or more keys',
))
register_claim(ClaimSpec(
    'symbolic-query-bias-matters', '01_symbolic', 'proof',
    comparison='>',
    bound=0.0,
    origin='exact arithmetic: any change is a counterexample',
))
register_claim(ClaimSpec(
    'symbolic-value-bias-matters', '01_symbolic', 'proof',
    comparison='>',
    bound=0.0,
    origin='exact arithmetic: any change is a counterexample',
))
register_claim(ClaimSpec(
    'symbolic-key-bias-example', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-value-bias-fold', '01_symbolic', 'proof',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
register_claim(ClaimSpec(
    'symbolic-value-bias-fold-grid', '01_symbolic', 'consistency',
    comparison='==',
    bound=0.0,
    origin='exact arithmetic: the proof allows no non-zero term',
))
