"""Are results byte-identical across x86 instruction sets? A measurement, not an assumption.

Only one machine is at hand, so "another machine" is emulated: the same short numeric
workload runs in fresh processes under each instruction-set level that PyTorch's CPU
dispatch can be told to use (ATEN_CPU_CAPABILITY=default|avx2|avx512), with and without
the pins for MKL (MKL_CBWR) and oneDNN (ONEDNN_MAX_CPU_ISA). Each output tensor is hashed
by its bytes; a setting is bitwise stable when every capability gives the same hashes.
A capability level that differs here will differ between machines that pick it by default
(for example an AVX2 laptop and an AVX-512 server).

    python -m keybias.bitwise [--threads 2] [--repeats 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

CAPABILITIES = ("default", "avx2", "avx512")
# Pins tried on top of ATEN_CPU_CAPABILITY: none; MKL's conditional numerical
# reproducibility mode; oneDNN capped at AVX2 (no AVX-512/AMX kernels); both.
PIN_SETS = {
    "none": {},
    "mkl_cbwr": {"MKL_CBWR": "COMPATIBLE"},
    "onednn_avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "mkl_cbwr+onednn_avx2": {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}


def workload(repeats: int = 1) -> dict[str, str]:
    """sha256 of the bytes of each output of a short numeric workload like the notebooks'."""
    import torch

    torch.manual_seed(0)
    digests: dict[str, str] = {}

    def put(name: str, tensor) -> None:
        data = tensor.detach().contiguous().view(torch.uint8) if tensor.dtype != torch.bool else tensor.to(torch.uint8)
        digests[name] = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]

    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        torch.manual_seed(1)
        mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(dtype)
        x = torch.randn(4, 33, 64, dtype=dtype, requires_grad=True)
        for _ in range(repeats):
            out, _ = mha(x, x, x, need_weights=False)
        out.float().pow(2).sum().backward()
        put(f"mha_forward_{name}", out)
        put(f"mha_grad_input_{name}", x.grad)
        put(f"mha_grad_in_proj_{name}", mha.in_proj_weight.grad)
        put(f"mha_grad_key_bias_{name}", mha.in_proj_bias.grad[64:128])
        a = torch.randn(257, 129, dtype=dtype)
        b = torch.randn(129, 65, dtype=dtype)
        put(f"matmul_{name}", a @ b)
        put(f"softmax_{name}", torch.softmax(a, dim=-1))
        put(f"sum_{name}", a.sum(dim=0))
        put(f"exp_{name}", torch.exp(a))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(2)
        mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        x = torch.randn(4, 33, 64)
        out, _ = mha(x, x, x, need_weights=False)
    put("mha_forward_autocast_bf16", out)
    # a tiny sweep: the key-bias shift of the invariance study at a few sizes
    for embed_dim, heads in ((8, 2), (32, 4), (96, 3)):
        torch.manual_seed(embed_dim)
        mha = torch.nn.MultiheadAttention(embed_dim, heads, batch_first=True)
        x = torch.randn(2, 9, embed_dim)
        base, _ = mha(x, x, x)
        with torch.no_grad():
            mha.in_proj_bias[embed_dim : 2 * embed_dim] += 1.0
        shifted, _ = mha(x, x, x)
        put(f"sweep_delta_E{embed_dim}", shifted - base)
    return digests


def run_one(env_extra: dict[str, str], threads: int, repeats: int) -> dict:
    env = dict(os.environ, **env_extra, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    code = (
        "import json,time,torch;from keybias.bitwise import workload;"
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
    """Digests per (pin set, capability), and which outputs differ across capabilities."""
    runs: dict[str, dict[str, dict]] = {}
    for pin_name, pins in PIN_SETS.items():
        runs[pin_name] = {cap: run_one({**pins, "ATEN_CPU_CAPABILITY": cap}, threads, repeats) for cap in CAPABILITIES}
    summary = {}
    for pin_name, by_cap in runs.items():
        ok = {cap: r for cap, r in by_cap.items() if "digests" in r}
        names = sorted(next(iter(ok.values()))["digests"]) if ok else []
        differing = [n for n in names if len({r["digests"][n] for r in ok.values()}) > 1]
        summary[pin_name] = {
            "capabilities_used": {cap: r.get("capability") for cap, r in ok.items()},
            "outputs": len(names),
            "differ_across_capabilities": differing,
            "bitwise_stable": bool(ok) and not differing and len(ok) == len(CAPABILITIES),
            "seconds": {cap: round(r["seconds"], 3) for cap, r in ok.items()},
            "errors": {cap: r["error"] for cap, r in by_cap.items() if "error" in r},
        }
    one, many = run_one({}, 1, repeats), run_one({}, threads, repeats)
    thread_differs = (
        sorted(n for n in one["digests"] if one["digests"][n] != many["digests"][n])
        if "digests" in one and "digests" in many else None
    )
    return {"threads": threads, "pin_sets": summary, "differ_between_1_and_declared_threads": thread_differs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.bitwise", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", help="also write the measurement as JSON here")
    args = parser.parse_args(argv)
    result = measure(args.threads, args.repeats)
    for pin_name, s in result["pin_sets"].items():
        verdict = "bitwise stable" if s["bitwise_stable"] else f"{len(s['differ_across_capabilities'])} of {s['outputs']} outputs differ"
        print(f"{pin_name:>22}: {verdict}; capability used {s['capabilities_used']}; seconds {s['seconds']}")
        if s["differ_across_capabilities"]:
            print(f"{'':>24}differ: {', '.join(s['differ_across_capabilities'])}")
        if s["errors"]:
            print(f"{'':>24}errors: {s['errors']}")
    print(f"1 thread vs {args.threads}: differ in {result['differ_between_1_and_declared_threads']}")
    if args.out:
        from pathlib import Path

        from keybias.export import atomic_write_text

        atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
