"""Claim statements name things in words: a code identifier with an underscore in a statement
is something a reader cannot look up, unless it is one of PyTorch's own keyword arguments."""

import re

import pytest

from keybias.studies.conditions.cases import CASES
from keybias.studies.fixtures import variants as V
from keybias.studies.invariance import measure
from keybias.studies.tables import KEYWORDS, case_words

# PyTorch's own keyword arguments, which a reader looks up by that name (declared once, in tables)
PYTORCH_KEYWORDS = KEYWORDS


def code_names(text: str) -> list[str]:
    """The identifiers with an underscore in `text`, outside backticks and $...$ math; a one-letter
    symbol with a one-letter subscript (b_k, W_k) is math written plainly, not code."""
    text = re.sub(r"`[^`]*`|\$[^$]*\$", " ", text)
    return [word for word in re.findall(r"\b[A-Za-z]\w*_\w+\b", text)
            if not re.fullmatch(r"[A-Za-z]_[A-Za-z]", word) and word not in PYTORCH_KEYWORDS]


def test_code_names_finds_identifiers_but_not_math_or_pytorch_keywords():
    assert code_names("number of not_redundant verdicts") == ["not_redundant"]
    assert code_names("b_k and W_k with need_weights, `x_y` and $a_{ij}$") == []


# every invariance case the judge names in a claim ("{case}: in float64 and float32 the verdicts ...")
INVARIANCE_CASES = ([f"MHA {o}" for o in measure.OPTIONS] + [f"realistic {o}" for o in measure.REALISTIC_OPTIONS]
                    + list(measure.LAYERS) + [f"variant {v}" for v in V.VARIANTS])


@pytest.mark.parametrize("case", INVARIANCE_CASES)
def test_invariance_claims_name_their_case_in_words(case):
    assert not code_names(case_words(case)), case_words(case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.variant)
def test_conditions_claim_statements_are_words(case):
    assert not code_names(case.statement), case.statement
