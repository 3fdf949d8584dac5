"""The environment every notebook kernel runs in: threads, hash seed, instruction-set pins.

The environment decides the last bits of every floating-point result, so it is declared here
once, applied to each kernel, and recorded in each step's provenance.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from keybias.pipeline.render import kernel_startup

KERNEL = "keybias"
# Intra-op threads of every notebook kernel. The count, not the machine's cores, decides how
# torch and MKL split a reduction, so a declared count gives the same bits on any core count.
# 2 is what the budgets were measured with; a notebook that times a declared thread count
# (06_cost) still sets its own with torch.set_num_threads.
KERNEL_THREADS = int(os.environ.get("KEYBIAS_THREADS", "2"))
# Instruction-set pins measured by keybias.studies.bitwise: with all three, an AVX-512 machine and an
# AVX2 one give byte-identical outputs; without, matmul, exp, softmax and MHA differ in the
# last bits. They apply on x86 CPUs with AVX2 (elsewhere they cannot hold), and not to
# notebooks that time kernels, which must run the machine's own fastest code.
ISA_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
TIMING_NOTEBOOKS = ("06_cost",)
# Notebooks exempt from the pins because of their bfloat16 cost: none. Capped at AVX2, bfloat16
# autocast loses the native bf16 kernels, so 04 and 08 size their bf16 work for it (08's long run is
# float32); both fit the make-all budget pinned, and run the code path of AVX2-only machines.
BFLOAT16_TRAINING_NOTEBOOKS: tuple[str, ...] = ()


def cpu_has_avx2() -> bool:
    try:
        return " avx2 " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "
    except OSError:
        return False


def isa_pins(name: str) -> dict[str, str]:
    """The instruction-set pins for notebook `name`; KEYBIAS_ISA_PIN=none turns them off."""
    if os.environ.get("KEYBIAS_ISA_PIN", "avx2") == "none" or name in (
        *TIMING_NOTEBOOKS, *BFLOAT16_TRAINING_NOTEBOOKS
    ):
        return {}
    return dict(ISA_PINS) if cpu_has_avx2() else {}


def kernel_environment(name: str = "") -> dict[str, str]:
    """Variables every notebook kernel runs with; recorded in each step's provenance."""
    threads = str(KERNEL_THREADS)
    env = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "PYTHONHASHSEED": "0",
        "TQDM_DISABLE": "1",  # progress bars would land in the notebook's outputs
        "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", ""),
    }

    env["PYTHONSTARTUP"] = kernel_startup()  # pandas shows whole cells; the page wraps them
    env.update(isa_pins(name))
    # A user's own setting of these wins over the pins, and is recorded like them.
    for var in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return env


@contextlib.contextmanager
def _patched_environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def _output_to(log_path: Path, append: bool = False):
    """Send this process's and its children's stdout/stderr, and papermill's log, to a file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    handle = open(log_path, "a" if append else "w")  # noqa: SIM115 (closed below, after the fds are restored)
    saved = [os.dup(1), os.dup(2)]
    # papermill logs each cell; traitlets (nbconvert, nbclient) log warnings such as missing
    # alt text: all of it belongs in the notebook's log, not on the terminal.
    loggers = [logging.getLogger(name) for name in ("papermill", "traitlets", "NbConvertApp")]
    handler = logging.StreamHandler(handle)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved_state = [(lg, lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        lg.setLevel(logging.INFO)
    try:
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        yield handle
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        for lg, propagate, level in saved_state:
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handle.close()
