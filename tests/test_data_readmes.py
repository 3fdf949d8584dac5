"""The READMEs beside the test data name tests that exist: a renamed or moved test must take the
README's pointer with it (one named tests/test_verify_mutations.py long after that file was gone)."""

import re

from conftest import ROOT

READMES = sorted((ROOT / "tests" / "data").rglob("README.md"))


def test_every_test_a_data_readme_names_exists():
    named = 0
    for readme in READMES:
        for path, name in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", readme.read_text()):
            named += 1
            target = ROOT / path
            assert target.is_file(), f"{readme.relative_to(ROOT)} names {path}, which does not exist"
            if name:
                assert re.search(rf"^def {name}\(", target.read_text(), re.M), (
                    f"{readme.relative_to(ROOT)} names {path}::{name}, which that file does not define")
    assert named, "no data README names a test"
