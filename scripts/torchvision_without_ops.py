"""Install the locked torchvision so that it imports beside a CPU-only torch.

Why: the only torchvision 0.28.0 wheels for x86_64 Linux on PyPI are CUDA builds. Their compiled
extensions (`torchvision/_C.so`, `torchvision/image.so`) link `libtorch_cuda.so` and
`libc10_cuda.so`, which the CPU wheel of torch 2.13.0 does not have, so they cannot load.
torchvision is written to run without them (`torchvision.extension._has_ops()` is then False and
every registration for a compiled op is skipped), except two: `_meta_registrations.py` registers
fake kernels for `torchvision::nms` and `torchvision::qnms` unconditionally, and that raises
`RuntimeError: operator torchvision::nms does not exist` on `import torchvision` (and so on
`import timm`, `import open_clip` and every transformers class that imports torchvision).

What this does, only when torch is a CPU build and the wheel's `_C.so` needs the CUDA libraries:
downloads the locked wheel from the package index with pip, and writes a copy of it, version
`<version>+noops`, that differs in exactly three ways: the two compiled extensions and the
libraries only they link (`torchvision.libs/`) are left out, and the two unconditional fake
registrations are guarded by `_has_ops()` like all the others. It installs that copy with
`--no-deps`. Everything written in Python (models, transforms, `torchvision.ops` written in torch)
works as released; the compiled operators (nms, roi_align, deform_conv2d, the image decoders)
raise torchvision's own "Couldn't load custom C++ ops" error when called. timm, open_clip and
transformers build and run their models without them.

Any other torch (a CUDA build), or a wheel that does not look as described (files missing, the
text to guard not found exactly once), installs the wheel as released, or stops with a message:
nothing is guessed.

Usage: python scripts/torchvision_without_ops.py [--version 0.28.0]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LOCAL = "noops"
EXTENSIONS = ("torchvision/_C.so", "torchvision/image.so")
LIBS = "torchvision.libs/"
PATCHED = "torchvision/_meta_registrations.py"
GUARD = '''

def _register_fake_if_ops(qualname):
    """Rebuilt without compiled ops: register the fake kernel only where the op exists."""

    def wrapper(fn):
        if torchvision.extension._has_ops():
            torch.library.register_fake(qualname)(fn)
        return fn

    return wrapper
'''
ANCHOR = "import torchvision.extension  # noqa: F401\n"


def locked_version() -> str:
    for line in (Path(__file__).resolve().parents[1] / "requirements.lock").read_text().splitlines():
        if line.strip().lower().startswith("torchvision=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit("error: requirements.lock pins no torchvision")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def patch_meta(text: str) -> str:
    if text.count(ANCHOR) != 1:
        raise SystemExit(f"error: {PATCHED}: the import line to anchor the guard is not found once")
    text = text.replace(ANCHOR, ANCHOR + GUARD, 1)
    for op in ("nms", "qnms"):
        old = f'@torch.library.register_fake("torchvision::{op}")\n'
        if text.count(old) != 1:
            raise SystemExit(f"error: {PATCHED}: {old.strip()!r} is not found exactly once")
        text = text.replace(old, f'@_register_fake_if_ops("torchvision::{op}")\n')
    if "@torch.library.register_fake(" in text:
        raise SystemExit(f"error: {PATCHED} has another unguarded register_fake; not rebuilt")
    return text


def rebuild(src: Path, out_dir: Path) -> Path:
    """Write the copy of wheel `src` without compiled ops into `out_dir`; return its path."""
    name, version, *tags = src.name[: -len(".whl")].split("-")
    new_version = f"{version}+{LOCAL}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    dest = out_dir / ("-".join([name, new_version, *tags]) + ".whl")
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        for needed in (*EXTENSIONS, PATCHED, old_info + "METADATA", old_info + "RECORD"):
            if needed not in names:
                raise SystemExit(f"error: {src.name} has no {needed}; not rebuilt")
        records, entries = [], []
        for info in sorted(zin.infolist(), key=lambda i: i.filename):
            fname = info.filename
            if fname.endswith("/") or fname in EXTENSIONS or fname.startswith(LIBS):
                continue
            if fname == old_info + "RECORD":
                continue
            data = zin.read(fname)
            if fname == PATCHED:
                data = patch_meta(data.decode()).encode()
            if fname.startswith(old_info):
                fname = new_info + fname[len(old_info):]
                if fname.endswith("METADATA"):
                    text = data.decode()
                    if f"\nVersion: {version}\n" not in text:
                        raise SystemExit(f"error: {src.name}: METADATA does not say Version: {version}")
                    data = text.replace(f"\nVersion: {version}\n", f"\nVersion: {new_version}\n", 1).encode()
            entries.append((fname, data, info.external_attr))
            records.append(record_line(fname, data))
    records.append(f"{new_info}RECORD,,")
    entries.append((new_info + "RECORD", ("\n".join(records) + "\n").encode(), 0o644 << 16))
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for fname, data, attr in entries:
            zi = zipfile.ZipInfo(fname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, data)
    return dest


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="torchvision version (default: the lock's)")
    args = parser.parse_args(argv)
    version = args.version or locked_version()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pip("download", "--quiet", "--no-deps", "--only-binary", ":all:", f"torchvision=={version}",
            "-d", str(tmp / "dl"))
        wheels = sorted((tmp / "dl").glob("torchvision-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"error: pip download gave {len(wheels)} torchvision wheels")
        wheel = wheels[0]
        with zipfile.ZipFile(wheel) as z:
            needs_cuda = EXTENSIONS[0] in z.namelist() and b"libtorch_cuda.so" in z.read(EXTENSIONS[0])
        if torch.version.cuda is not None or not needs_cuda:
            print(f"torchvision {version}: torch {torch.__version__} matches this wheel's build; "
                  "installed as released")
            pip("install", "--quiet", "--no-deps", "--force-reinstall", str(wheel))
        else:
            (tmp / "out").mkdir()
            rebuilt = rebuild(wheel, tmp / "out")
            print(f"torchvision {version}: its wheel is a CUDA build and torch {torch.__version__} is "
                  f"not; installing {rebuilt.name} (no compiled ops; see this script's docstring)")
            pip("install", "--quiet", "--no-deps", "--force-reinstall", str(rebuilt))
    check = ("import torchvision, torchvision.extension as e; "
             "print('torchvision', torchvision.__version__, 'compiled ops:', e._has_ops())")
    subprocess.run([sys.executable, "-c", check], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
