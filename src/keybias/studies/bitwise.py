"""Are results byte-identical across x86 instruction sets? A measurement, not an assumption.

Only one machine is at hand, so "another machine" is emulated: the same short numeric
workload runs in fresh processes with ATen, MKL and oneDNN capped at the instruction set a
CPU of another class would use (`MACHINES`: this AVX-512 machine, an AVX2 one, one without
AVX2). On top, each pin set (`PIN_SETS`: MKL_CBWR, ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY)
is applied on every emulated machine. Each output tensor is hashed by its bytes; a pin set
makes results bitwise stable when the emulated machines then give the same hashes. What the
emulation cannot show: differences between CPU vendors or cache sizes at the same
instruction set (MKL_CBWR is meant for those).

    python -m keybias.studies.bitwise [--threads 2] [--repeats 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from keybias.core.recorder import atomic_write_text

# Emulated machines: what each library would pick on a CPU of that class. This machine has
# AVX-512 and AMX; the AVX2 "machine" caps ATen, MKL and oneDNN at AVX2, as a laptop or an
# older server would; "default" is ATen's scalar fallback (a CPU without AVX2).
MACHINES = {
    "avx512": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# Pins set on every machine (they override the machine's own choice of the same variable).
PIN_SETS = {
    "none": {},
    "mkl_cbwr": {"MKL_CBWR": "AVX2"},
    "mkl_cbwr+onednn": {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten_avx2+mkl_cbwr+onednn": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
CAPABILITIES = tuple(MACHINES)


def workload(repeats: int = 1) -> dict[str, str]:
    """sha256 of the bytes of each output of a short numeric workload like the notebooks'.

    Inputs and weights come from numpy's PCG64 (scalar code, the same bits on every CPU), so
    a differing output is the kernel's doing. torch's own generators are hashed separately
    (`torch_randn`, `torch_mha_init`): their vectorised paths are part of the question too.
    """
    digests: dict[str, str] = {}
    rng = np.random.default_rng(0)

    def put(name: str, tensor) -> None:
        data = tensor.detach().contiguous()
        data = data.view(torch.int16) if data.dtype == torch.bfloat16 else data
        digests[name] = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]

    def normal(*shape, dtype):
        return torch.from_numpy(rng.standard_normal(shape)).to(dtype)

    def mha_from_numpy(embed_dim: int, heads: int, dtype):
        mha = torch.nn.MultiheadAttention(embed_dim, heads, batch_first=True).to(dtype)
        with torch.no_grad():
            for param in mha.parameters():
                param.copy_(normal(*param.shape, dtype=torch.float64) / embed_dim**0.5)
        return mha

    torch.manual_seed(0)
    put("torch_randn", torch.randn(257, 129))
    torch.manual_seed(0)
    put("torch_mha_init", torch.nn.MultiheadAttention(64, 4).in_proj_weight)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        mha = mha_from_numpy(64, 4, dtype)
        x = normal(4, 33, 64, dtype=dtype).requires_grad_(True)
        for _ in range(repeats):
            out, _ = mha(x, x, x, need_weights=False)
        out.float().pow(2).sum().backward()
        put(f"mha_forward_{name}", out)
        put(f"mha_grad_input_{name}", x.grad)
        put(f"mha_grad_in_proj_{name}", mha.in_proj_weight.grad)
        put(f"mha_grad_key_bias_{name}", mha.in_proj_bias.grad[64:128])
        a = normal(257, 129, dtype=dtype)
        b = normal(129, 65, dtype=dtype)
        put(f"matmul_{name}", a @ b)
        put(f"softmax_{name}", torch.softmax(a, dim=-1))
        put(f"sum_{name}", a.sum(dim=0))
        put(f"exp_{name}", torch.exp(a))
    mha = mha_from_numpy(64, 4, torch.float32)
    x = normal(4, 33, 64, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x, x, need_weights=False)
    put("mha_forward_autocast_bf16", out)
    # a tiny sweep: the key-bias shift of the invariance study at a few sizes
    for embed_dim, heads in ((8, 2), (32, 4), (96, 3)):
        mha = mha_from_numpy(embed_dim, heads, torch.float32)
        x = normal(2, 9, embed_dim, dtype=torch.float32)
        base, _ = mha(x, x, x)
        with torch.no_grad():
            mha.in_proj_bias[embed_dim : 2 * embed_dim] += 1.0
        shifted, _ = mha(x, x, x)
        put(f"sweep_delta_E{embed_dim}", shifted - base)
    return digests


def run_one(env_extra: dict[str, str], threads: int, repeats: int) -> dict:
    env = dict(os.environ, **env_extra, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    code = (
        "import json,time,torch;from keybias.studies.bitwise import workload;"
        f"torch.set_num_threads({threads});t=time.perf_counter();d=workload({repeats});"
        "print(json.dumps({'digests':d,'seconds':time.perf_counter()-t,"
        "'capability':torch.backends.cpu.get_cpu_capability()}))"
    )
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        return {"error": result.stderr.strip().splitlines()[-1:], "env": env_extra}
    record = json.loads(result.stdout.strip().splitlines()[-1])
    record["process_seconds"] = time.perf_counter() - t0
    record["env"] = env_extra
    return record


def measure(threads: int = 2, repeats: int = 1) -> dict:
    """Digests per (pin set, emulated machine), and which outputs differ between machines."""
    summary = {}
    for pin_name, pins in PIN_SETS.items():
        by_machine = {m: run_one({**env, **pins}, threads, repeats) for m, env in MACHINES.items()}
        ok = {m: r for m, r in by_machine.items() if "digests" in r}
        names = sorted(next(iter(ok.values()))["digests"]) if ok else []
        pairs = {}
        for first, second in (("avx512", "avx2"), ("avx2", "default")):
            if first in ok and second in ok:
                d1, d2 = ok[first]["digests"], ok[second]["digests"]
                pairs[f"{first}_vs_{second}"] = [n for n in names if d1[n] != d2[n]]
        summary[pin_name] = {
            "pins": pins,
            "outputs": len(names),
            "differ_by_pair": pairs,
            "capability_used": {m: r.get("capability") for m, r in ok.items()},
            "seconds": {m: round(r["seconds"], 3) for m, r in ok.items()},
            "errors": {m: r["error"] for m, r in by_machine.items() if "error" in r},
        }
    one, many = run_one({}, 1, repeats), run_one({}, threads, repeats)
    thread_differs = (
        sorted(n for n in one["digests"] if one["digests"][n] != many["digests"][n])
        if "digests" in one and "digests" in many else None
    )
    return {"threads": threads, "machines": MACHINES, "pin_sets": summary,
            "differ_between_1_and_declared_threads": thread_differs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.studies.bitwise", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", help="also write the measurement as JSON here")
    args = parser.parse_args(argv)
    result = measure(args.threads, args.repeats)
    for pin_name, s in result["pin_sets"].items():
        print(f"pins {pin_name} {s['pins']}: workload seconds per machine {s['seconds']}")
        for pair, names in s["differ_by_pair"].items():
            verdict = "bitwise identical" if not names else f"{len(names)} of {s['outputs']} differ: {', '.join(names)}"
            print(f"    {pair}: {verdict}")
        if s["errors"]:
            print(f"    errors: {s['errors']}")
    print(f"1 thread vs {args.threads}: differ in {result['differ_between_1_and_declared_threads']}")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
