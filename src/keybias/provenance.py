"""Where and with what a result was produced: commit, versions, machine, threads."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "numpy", "sympy", "pandas", "papermill", "matplotlib", "seaborn", "transformers")
# Files the pipeline rewrites; a change there does not make the source "dirty". README.md
# counts as generated because its measured numbers are (keybias.readme); its prose is no
# input of any result.
GENERATED = ("results", "paper/main.pdf", "README.md")


def git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def commit_info(root: Path) -> dict:
    commit = git(root, "rev-parse", "HEAD") or "unknown"
    excludes = [f":(exclude){p}" for p in GENERATED]
    status = git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes)
    return {"commit": commit, "dirty": bool(status)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def machine() -> dict:
    import torch

    from keybias.params import devices_present

    present = devices_present()
    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "devices_present": [d for d, ok in present.items() if ok],
    }
    if present["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def collect(root: Path) -> dict:
    return {**commit_info(root), "versions": versions(), "machine": machine()}
