"""Deterministic archives: the artifact bundle (`make bundle`) and the tar writer it shares
with the arXiv source (`make arxiv`).

The bundle is `git archive` of HEAD (sources, committed results, rendered notebooks, the PDF,
CITATION.cff, .zenodo.json) plus SHA256SUMS. It refuses a dirty tree, so what it packs is
exactly the commit it is named after. Every byte is fixed by the commit: entries sorted, file
times set to the commit time (SOURCE_DATE_EPOCH), owner 0/0 without names, modes 0644/0755,
and a gzip header without file name or time. Two runs give the same sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

from keybias.core.recorder import atomic_write_bytes

REQUIRED_IN_BUNDLE = ("CITATION.cff", ".zenodo.json", "paper/main.pdf", "README.md")


class BundleError(RuntimeError):
    """The bundle cannot be made; the message says why."""


def _git(root: Path, *args: str, binary: bool = False):
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)
    if result.returncode:
        raise BundleError(f"git {' '.join(args)} failed: {result.stderr.decode().strip()}")
    return result.stdout if binary else result.stdout.decode().strip()


def deterministic_tar_gz(files: dict[str, tuple[bytes, bool]], mtime: int) -> bytes:
    """A .tar.gz of {path: (content, executable)} whose bytes depend on nothing else."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data, executable = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = mtime
            info.mode = 0o755 if executable else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def commit_files(root: Path, commit: str = "HEAD") -> dict[str, tuple[bytes, bool]]:
    """Every file of `commit` as `git archive` writes it: {path: (content, executable)}."""
    archive = _git(root, "archive", "--format=tar", commit, binary=True)
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar.getmembers():
            if member.isfile():
                files[member.name] = (tar.extractfile(member).read(), bool(member.mode & 0o111))
    return files


def dirty_paths(root: Path) -> list[str]:
    """Tracked files that differ from HEAD, and untracked files that git does not ignore."""
    return [line for line in _git(root, "status", "--porcelain").splitlines() if line.strip()]


def sha256sums(files: dict[str, tuple[bytes, bool]]) -> bytes:
    return "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, (data, _) in sorted(files.items())
    ).encode()


def make_bundle(root: Path, out_dir: Path | None = None) -> Path:
    """dist/keybias-artifact-<commit>.tar.gz from HEAD; refuses a dirty tree."""
    root = Path(root)
    dirty = dirty_paths(root)
    if dirty:
        shown = "\n  ".join(dirty[:20]) + ("\n  ..." if len(dirty) > 20 else "")
        raise BundleError(
            "the working tree differs from HEAD, so a bundle named after HEAD would not be HEAD; "
            f"commit or stash first:\n  {shown}"
        )
    commit = _git(root, "rev-parse", "HEAD")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or _git(root, "log", "-1", "--format=%ct", commit))
    files = commit_files(root, commit)
    missing = [name for name in REQUIRED_IN_BUNDLE if name not in files]
    if missing:
        raise BundleError(f"HEAD lacks {missing}; the bundle must carry them (commit them first)")
    if not any(name.startswith("results/notebooks/") and name.endswith(".html") for name in files):
        raise BundleError("HEAD has no rendered notebooks (results/notebooks/*.html): run `make all` and commit")
    prefix = f"keybias-{commit[:10]}/"
    packed = {prefix + name: entry for name, entry in files.items()}
    packed[prefix + "SHA256SUMS"] = (sha256sums(files), False)
    out = Path(out_dir or root / "dist") / f"keybias-artifact-{commit[:10]}.tar.gz"
    atomic_write_bytes(out, deterministic_tar_gz(packed, epoch))
    os.chmod(out, 0o644)
    return out


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
