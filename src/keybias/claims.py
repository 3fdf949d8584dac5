"""The claim contract: kinds, the committed manifest, and the mutation register.

The pipeline hands every gathered claim to `contract_errors`; a non-empty answer stops the
build before the paper, naming each claim. (Filled in by issue 9.)
"""

from __future__ import annotations

from pathlib import Path


def contract_errors(claims: list[dict], profile: str, root: Path) -> list[str]:
    """Every way `claims` break the claim contract for `profile`, one message each."""
    return [f"claim {c['id']!r} has no kind" for c in claims if not c.get("kind")]
