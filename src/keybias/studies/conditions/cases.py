"""The cases of the conditions study: what each predicts from algebra alone, before any number
is computed, and the claim it becomes."""

from __future__ import annotations

from dataclasses import dataclass, field

REDUNDANT, NOT_REDUNDANT = "redundant", "not_redundant"


# Every case evaluates the project's own float64 attention, written out for that case, so its
# outcome is an identity of that code, not a measurement that data could contradict: a `proof`
# check (the identity is the case's statement). The PyTorch quirk below runs PyTorch's own
# module and stays a test.
# A case whose effect is a term the code itself puts there (an explicit penalty, an explicit
# decay term, weights set to zero, slots or gates that bypass b_v) cannot come out otherwise for
# any data: its claim is a `consistency` check of the measurement, not evidence.
BY_CONSTRUCTION = "consistency"


@dataclass(frozen=True)
class Case:
    condition: str  # the group the paper's table lists it under
    variant: str
    quantity: str
    predicted: str
    statement: str  # the claim, as the paper states it
    kind: str = "proof"  # BY_CONSTRUCTION where the code guarantees the outcome
    label: str = field(kw_only=True)  # what a reader sees in the figure and the table


CASES = [
    Case("loss", "output-only", "gradient", REDUNDANT,
         "A loss that sees b_k only through the attention output gives b_k a zero gradient.",
         label="loss through the output only"),
    Case("loss", "l2-on-bk", "gradient", NOT_REDUNDANT,
         "An L2 regulariser on b_k gives b_k a non-zero gradient (the zero-gradient statement needs a loss that sees b_k only through the output).",
         BY_CONSTRUCTION,
         label="squared-norm penalty on $b_k$"),
    Case("optimizer", "adam", "adam_step", REDUNDANT,
         "Plain Adam leaves b_k in place to float64 rounding after one step (its gradient is zero).",
         label="Adam"),
    Case("optimizer", "adam-coupled-wd", "adam_step", NOT_REDUNDANT,
         "Adam with coupled weight decay moves b_k by about one learning rate per step, because the decay term enters the gradient.",
         BY_CONSTRUCTION,
         label="Adam with coupled weight decay"),
    Case("tied", "bq-equals-bk", "output", NOT_REDUNDANT,
         "A bias shared by the query and key projections (shared-QK attention) changes the output.",
         label="$b_q$ tied to $b_k$"),
    Case("scores", "temperature", "output", REDUNDANT,
         "A linear rescaling of the scores before softmax (a temperature) keeps b_k redundant.",
         label="temperature on the scores"),
    Case("scores", "softcap", "output", NOT_REDUNDANT,
         "Logit soft-capping c*tanh(s/c) before softmax makes b_k change the output.",
         label="logit soft-capping"),
    Case("fold", "plain", "fold", REDUNDANT,
         "Folding b_v into the output bias (b_o + W_o b_v) leaves the output unchanged in plain softmax attention.",
         label="$b_v$ fold, plain attention"),
    Case("fold", "attention-dropout", "fold", NOT_REDUNDANT,
         "With attention dropout in training the rows of weights no longer sum to one and the b_v fold changes the output.",
         BY_CONSTRUCTION,
         label="$b_v$ fold, attention dropout"),
    Case("fold", "add-zero-attn", "fold", NOT_REDUNDANT,
         "With a value slot that carries no b_v (add_zero_attn) the b_v fold changes the output.",
         BY_CONSTRUCTION,
         label="$b_v$ fold, zero-attention slot"),
    Case("fold", "output-gate", "fold", NOT_REDUNDANT,
         "With a gate between attention and W_o the b_v fold changes the output.", BY_CONSTRUCTION,
         label="$b_v$ fold, output gate"),
    Case("fold", "fully-masked-row", "fold", NOT_REDUNDANT,
         "With a fully masked row whose weights are set to zero the b_v fold changes that row's output.",
         BY_CONSTRUCTION,
         label="$b_v$ fold, fully masked row"),
    Case("gate", "output-gate-bk", "output", REDUNDANT,
         "A gate between attention and W_o leaves b_k redundant (only the fold of b_v needs no gate).",
         label="output gate"),
    Case("relative", "relative-key", "output", REDUNDANT,
         "With relative-key position scores q_i.r_(i-j), b_k stays redundant.",
         label="relative positions, $q_i\\cdot r_{i-j}$"),
    Case("relative", "relative-key-query", "output", NOT_REDUNDANT,
         "With relative key-and-query position scores (k_j.r_(i-j) added) b_k changes the output.",
         label="relative positions, $q_i\\cdot r_{i-j} + k_j\\cdot r_{i-j}$"),
    Case("relative", "deberta-c2p", "output", REDUNDANT,
         "DeBERTa's content-to-position term alone leaves b_k redundant.",
         label="DeBERTa, content to position"),
    Case("relative", "deberta-c2p-p2c", "output", NOT_REDUNDANT,
         "DeBERTa's position-to-content term (content keys times relative-position queries) makes b_k change the output.",
         label="DeBERTa, both position terms"),
    Case("heads", "gqa", "output", REDUNDANT,
         "With grouped-query attention (key heads shared by several query heads) b_k stays redundant.",
         label="grouped-query heads"),
    Case("heads", "mqa", "output", REDUNDANT,
         "With multi-query attention (one key head for all query heads) b_k stays redundant.",
         label="multi-query heads"),
    Case("rope", "partial-unrotated", "output", REDUNDANT,
         "With partial RoPE, the part of b_k in the unrotated dimensions stays redundant.",
         label="partial RoPE, unrotated part of $b_k$"),
    Case("rope", "partial-rotated", "output", NOT_REDUNDANT,
         "With partial RoPE, the part of b_k in the rotated dimensions changes the output.",
         label="partial RoPE, rotated part of $b_k$"),
    Case("qknorm", "ln-key-bias", "output", REDUNDANT,
         "With LayerNorm QK-norm, the key norm's own bias is redundant.",
         label="QK-norm, bias of the key norm"),
    Case("qknorm", "bk-before-ln", "output", NOT_REDUNDANT,
         "With LayerNorm QK-norm, b_k before the norm changes the output.",
         label="QK-norm, $b_k$ before the norm"),
]
CASE_BY_KEY = {(c.condition, c.variant): c for c in CASES}


def claim_id(case: Case) -> str:
    return f"cond-{case.condition}-{case.variant}"


