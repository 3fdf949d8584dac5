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
# counts as generated because its measured numbers are (keybias.pipeline.readme); its prose is no
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


# Instruction-set extensions that decide which kernels MKL, oneDNN and ATen pick (and whether
# bfloat16 has native arithmetic), read from /proc/cpuinfo where it exists.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [f for f in ISA_FLAGS if f in present]
    except OSError:
        pass
    return []


def _torch():
    """torch, imported on first use: the pipeline imports this module for git and commit facts
    without loading torch."""
    import torch

    return torch


def torch_build() -> dict:
    """The installed torch: its full version string (with +cpu or +cuXXX where the wheel has one),
    the CUDA version it was built for (None for a CPU build) and the CPU capability ATen chose."""
    torch = _torch()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def devices_present() -> dict[str, bool]:
    torch = _torch()
    mps = getattr(torch.backends, "mps", None)
    return {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": bool(mps is not None and mps.is_available()),
    }


def machine() -> dict:
    torch = _torch()
    present = devices_present()
    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "isa_flags": cpu_flags(),
        "torch_build": torch_build(),
        "devices_present": [d for d, ok in present.items() if ok],
    }
    if present["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def collect(root: Path) -> dict:
    return {**commit_info(root), "versions": versions(), "machine": machine()}
