"""The words a table shows for the identifiers its data keep."""

import pandas as pd

from keybias.studies.tables import MISSING, in_words


def test_in_words_writes_each_identifier_as_a_reader_says_it():
    frame = pd.DataFrame({"category": ["encoder_layer", "unknown_case"], "status": ["rejected", "measured"],
                          "joint": ["redundant,invalid", "--"], "matches_theory": ["3/4", "0/0"],
                          "other_column": ["a_b", "c_d"]})
    words = in_words(frame)
    assert "_" not in " ".join(words["category"]) and words["category"][1] == "unknown case"
    assert list(words["status"]) == ["rejected by PyTorch", "measured"]
    assert list(words["joint"]) == ["redundant, no power", "\u2014"]
    assert list(words["matches_theory"]) == ["3 of 4", MISSING]
    # a column it has no words for is left as the data write it, and the input is not changed
    assert list(words["other_column"]) == ["a_b", "c_d"] and frame["status"][0] == "rejected"
