"""What the build prints: one line per step on the terminal, and hashes of its inputs."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def log(message: str) -> None:
    print(f"[keybias] {message}", file=sys.stderr, flush=True)


def status_line(message: str, *, final: bool = True) -> None:
    """A progress line: on a terminal a pending line is overwritten by the final one."""
    if sys.stderr.isatty():
        end = "\n" if final else ""
        print(f"\r\033[K[keybias] {message}", end=end, file=sys.stderr, flush=True)
    else:
        log(message)


def sha256_bytes(*chunks: bytes) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "little"))
        digest.update(chunk)
    return digest.hexdigest()


def _show(path: Path) -> str:
    """A path as the user typed it: relative to the current folder when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
