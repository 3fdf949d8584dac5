"""The build: validate, run notebooks with papermill, gather claims and provenance, typeset.

What reruns is decided by content, not file times (a git clone gives every file the same
time). Each notebook's key hashes its source, its checked parameters, PROFILE, DEVICE, the
lock file, the keybias modules it imports (transitively) and the steps it depends on. The
key is kept in `<results>/.build/` (not committed), so a fresh clone reruns everything and
a rerun with nothing changed reruns nothing.

A notebook writes into `<results>/.staging/<name>/`; only after it finished are its files
moved into `<results>/`, its step record last and its key after that. An interrupted run
therefore leaves no output that could pass for finished, and the next run redoes it.

The build is quiet: one line per notebook on the terminal; papermill's cell log, the
kernel's warnings and whatever the notebook prints go to `<results>/.build/logs/<name>.log`.
The kernel runs with a declared thread count (`KERNEL_THREADS`) and a fixed PYTHONHASHSEED,
so a rerun on any machine splits its reductions the same way.

Usage: python -m keybias.pipeline.steps [--profile P] [--device D] [--results DIR]
       {check, notebooks, paper, all, verify, bundle, arxiv} [--only NB ...] [--force]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keybias.core.provenance import GENERATED, collect, cpu_flags, cpu_model, git
from keybias.core.recorder import atomic_write_text
from keybias.pipeline.arxiv import ArxivError, check_compiles, make_arxiv
from keybias.pipeline.bundle import BundleError, make_bundle, sha256_file
from keybias.pipeline.console import _show, log, sha256_bytes, status_line
from keybias.pipeline.kernel import (
    KERNEL,
    KERNEL_THREADS,
    _output_to,
    _patched_environ,
    kernel_environment,
)
from keybias.pipeline.outputs import compare_folders
from keybias.pipeline.paper import BuildError, PaperSteps
from keybias.pipeline.render import publish_assets, render_notebook_html
from keybias.studies import params as P

try:  # check_tools names it when it is missing, rather than failing on import
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
except ImportError as _missing:
    KernelSpecManager = NoSuchKernel = None
    _JUPYTER_CLIENT_MISSING: ImportError | None = _missing
else:
    _JUPYTER_CLIENT_MISSING = None

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")
def discover_notebooks(root: Path = ROOT) -> list[str]:
    names = sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
    bad = [n for n in names if not NOTEBOOK_NAME.match(n)]
    if bad:
        raise BuildError(f"notebook names must look like NN_topic: {bad}")
    return names


def read_notebook(path: Path) -> dict:
    return json.loads(path.read_text())


def _imported_keybias_modules(source: str, package: str = "keybias", importer: str | None = None) -> set[str]:
    """Dotted names of the `package` modules `source` imports.

    `importer` is the package that holds the importing file (for `from ._x import y` inside
    `keybias/surgery/`, the importer is `keybias.surgery`); it defaults to the top package.
    """
    importer = importer or package
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative to the importer's package, one level up per extra dot
                parts = importer.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)]) or package
                module = f"{base}.{module}" if module else base
            if module.split(".")[0] == package:
                found.add(module)
                found |= {f"{module}.{a.name}" for a in node.names}
    return found


def module_closure(notebook_path: Path, src: Path = ROOT / "src") -> list[Path]:
    """The keybias source files a notebook imports, directly or through other modules."""
    code = "\n".join(
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in read_notebook(notebook_path)["cells"]
        if cell["cell_type"] == "code"
    )
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    pending = _imported_keybias_modules(code) | {"keybias"}
    files: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        base = src / Path(*name.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file() and name not in files:
                files[name] = candidate
                importer = name if candidate.name == "__init__.py" else name.rpartition(".")[0]
                pending |= _imported_keybias_modules(candidate.read_text(), importer=importer) - set(files)
    # Package data counts for a notebook when one of its modules names the file.
    sources = "\n".join(p.read_text() for p in files.values())
    for extra in sorted((src / "keybias").rglob("*")):
        if extra.is_file() and extra.suffix not in (".py", ".pyc") and extra.name in sources:
            files[f"data:{extra.relative_to(src)}"] = extra
    # So do the standalone scripts a notebook runs (scripts/ beside src/).
    scripts = src.parent / "scripts"
    code_and_sources = code + "\n" + sources
    for extra in sorted(scripts.glob("*.py")) if scripts.is_dir() else []:
        if extra.name in code_and_sources:
            files[f"script:{extra.name}"] = extra
    return [files[k] for k in sorted(files)]


def notebook_dependencies(notebook_path: Path) -> list[str]:
    meta = read_notebook(notebook_path).get("metadata", {}).get("keybias", {})
    return list(meta.get("depends_on", []))


class Build(PaperSteps):
    def __init__(
        self, profile: str, device: str, results: Path, root: Path = ROOT, force: bool = False,
        only: list[str] | None = None,
    ):
        self.root = root
        self.profile = profile
        self.device_requested = device
        self.results = Path(results).resolve()
        self.force = force
        self.notebooks = discover_notebooks(root)
        unknown = sorted(set(only or []) - set(self.notebooks))
        if unknown:
            raise BuildError(f"--only {unknown}: unknown; notebooks: {self.notebooks}")
        self.selected = [n for n in self.notebooks if not only or n in only]
        self.params: dict[str, dict] = {}
        self.device = ""
        self.ran: list[str] = []

    # -- validation -------------------------------------------------------------
    def check(self) -> None:
        """Everything that can be wrong with the input, found before any work starts."""
        self.params = P.load_profile(self.profile, self.root / "params", self.selected)
        self.device = P.resolve_device(self.device_requested)
        for name in self.selected:
            self._check_parameters_cell(name)
            for dep in notebook_dependencies(self._nb_path(name)):
                if dep not in self.notebooks:
                    raise BuildError(f"{name} depends on unknown notebook {dep!r}")

    def _nb_path(self, name: str) -> Path:
        return self.root / "notebooks" / f"{name}.ipynb"

    def _check_parameters_cell(self, name: str) -> None:
        cells = read_notebook(self._nb_path(name))["cells"]
        tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        if len(tagged) != 1:
            raise BuildError(f"notebooks/{name}.ipynb needs exactly one cell tagged 'parameters'")
        source = "".join(tagged[0]["source"])
        declared = {
            t.id
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        expected = set(self.params[name]) | set(P.INJECTED)
        if declared != expected:
            raise BuildError(
                f"notebooks/{name}.ipynb parameters cell declares {sorted(declared)}, but the "
                f"spec and pipeline expect {sorted(expected)}"
            )

    def check_tools(self, paper: bool) -> None:
        if _JUPYTER_CLIENT_MISSING is not None:
            raise BuildError("jupyter_client is missing: run `make venv`") from _JUPYTER_CLIENT_MISSING
        try:
            spec = KernelSpecManager().get_kernel_spec(KERNEL)
        except NoSuchKernel as exc:
            raise BuildError(f"Jupyter kernel {KERNEL!r} is not registered in .venv: run `make venv`") from exc
        if Path(spec.argv[0]).resolve() != Path(sys.executable).resolve():
            raise BuildError(f"kernel {KERNEL!r} runs {spec.argv[0]}, not this venv's {sys.executable}")
        if paper and not (shutil.which("latexmk") and shutil.which("pdflatex")):
            log("latexmk/pdflatex missing: asking `make tex` to install them")
            if subprocess.run(["make", "--no-print-directory", "tex"], cwd=self.root).returncode:
                raise BuildError("TeX is missing (see the message above)")

    # -- notebooks --------------------------------------------------------------
    def step_key(self, name: str) -> str:
        nb_path = self._nb_path(name)
        chunks = [
            nb_path.read_bytes(),
            json.dumps(self.params[name], sort_keys=True).encode(),
            self.profile.encode(),
            self.device.encode(),
            (self.root / "requirements.lock").read_bytes(),
        ]
        for path in module_closure(nb_path, self.root / "src"):
            chunks += [str(path.relative_to(self.root)).encode(), path.read_bytes()]
        # a notebook that judges recorded measurements (notebook 09's GPU files) reruns when they change
        recorded = self.params[name].get("recorded")
        if recorded:
            for path in sorted(p for p in (self.root / recorded).rglob("*") if p.is_file()):
                chunks += [str(path.relative_to(self.root)).encode(), path.read_bytes()]
        for dep in notebook_dependencies(nb_path):
            chunks.append(self._step_file(dep).read_bytes() if self._step_file(dep).exists() else b"")
        return sha256_bytes(*chunks)

    def _step_file(self, name: str) -> Path:
        return self.results / "steps" / f"{name}.json"

    def _stamp(self, name: str) -> Path:
        return self.results / ".build" / f"{name}.key"

    def up_to_date(self, name: str, key: str) -> bool:
        stamp, step = self._stamp(name), self._step_file(name)
        if self.force or not stamp.exists() or not step.exists() or stamp.read_text() != key:
            return False
        outputs = json.loads(step.read_text()).get("outputs", [])
        return all((self.results / rel).exists() for rel in outputs)

    def run_notebooks(self) -> None:
        for name in self.selected:
            key = self.step_key(name)
            if self.up_to_date(name, key):
                status_line(f"{name}: up to date")
                continue
            self.run_one(name, key)
        # After the notebooks, so that a failed run publishes nothing; cheap when unchanged.
        publish_assets(self.results)  # the one MathJax copy every rendered notebook loads

    def run_one(self, name: str, key: str) -> None:
        import papermill

        staging = self.results / ".staging" / name
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "notebooks").mkdir(parents=True)
        self._stamp(name).unlink(missing_ok=True)
        executed = staging / "notebooks" / f"{name}.ipynb"
        cwd = self.root / "notebooks"
        parameters = dict(
            self.params[name],
            profile=self.profile,
            device=self.device,
            output_dir=os.path.relpath(staging, cwd),
            results_dir=os.path.relpath(self.results, cwd),
        )
        log_path = self.log_path(name)
        status_line(f"{name}: running (log {_show(log_path)})", final=False)
        started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        env = kernel_environment(name)
        t0 = time.perf_counter()
        try:
            with _patched_environ(env), _output_to(log_path):
                papermill.execute_notebook(
                    str(self._nb_path(name)),
                    str(executed),
                    parameters=parameters,
                    kernel_name=KERNEL,
                    cwd=str(cwd),
                    progress_bar=False,
                    log_output=True,
                )
        except Exception as exc:  # papermill re-raises the cell's error with its traceback
            status_line(f"{name}: FAILED after {time.perf_counter() - t0:.1f} s")
            raise BuildError(failure_message(name, exc, executed, log_path, self.results)) from exc
        wall = time.perf_counter() - t0
        step_path = staging / "steps" / f"{name}.json"
        if not step_path.exists():
            raise BuildError(f"notebook {name} finished without calling rec.finish()")
        step = json.loads(step_path.read_text())
        if step.get("profile") != self.profile or step.get("notebook") != name:
            raise BuildError(f"notebook {name} recorded profile/notebook {step.get('profile')}/{step.get('notebook')}")
        with _output_to(log_path, append=True):
            self._scrub_and_render(executed, step.get("figures_alt"), step.get("claims"))

        step["provenance"] = {
            **collect(self.root),
            "started_utc": started,
            "wall_seconds": round(wall, 2),
            "key": key,
            "kernel_env": env,
            "threads": KERNEL_THREADS,
        }
        step["outputs"] = sorted(
            set(step["outputs"]) | {f"notebooks/{name}.ipynb", f"notebooks/{name}.html"}
        )
        atomic_write_text(step_path, json.dumps(step, indent=2) + "\n")
        self._publish(name, staging, step)
        atomic_write_text(self._stamp(name), key)
        self.ran.append(name)
        status_line(f"{name}: done in {wall:.1f} s with {len(step['claims'])} claims")

    def log_path(self, name: str) -> Path:
        return self.results / ".build" / "logs" / f"{name}.log"

    def _scrub_and_render(self, executed: Path, figures_alt: dict | None = None, claims: list | None = None) -> None:
        """Drop this machine's absolute paths from the executed notebook, then render HTML."""
        text = executed.read_text()
        # Longest prefix first (the venv lies inside the root): a fixed order, not a set's,
        # so the scrubbed text does not depend on PYTHONHASHSEED.
        for prefix in sorted({str(self.root), str(Path(sys.prefix))}, key=lambda p: (-len(p), p)):
            text = text.replace(prefix + "/", "").replace(prefix, ".")
        atomic_write_text(executed, text)

        html = render_notebook_html(
            text, name=executed.stem, profile=self.profile, device=self.device, figures_alt=figures_alt,
            claims=claims,
        )
        atomic_write_text(executed.with_suffix(".html"), html)

    def _publish(self, name: str, staging: Path, step: dict) -> None:
        old_step = self._step_file(name)
        old_outputs = set(json.loads(old_step.read_text()).get("outputs", [])) if old_step.exists() else set()
        step_rel = f"steps/{name}.json"
        for rel in step["outputs"]:
            if not (staging / rel).exists():
                raise BuildError(f"notebook {name} listed output {rel} but did not write it")
        for rel in [*step["outputs"], step_rel]:
            target = self.results / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, target)
        for rel in sorted(old_outputs - set(step["outputs"])):
            (self.results / rel).unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)

def input_fingerprint(root: Path, profile: str, device: str) -> str:
    """A hash of every input of `make all`; read without importing torch, so a no-op is fast."""
    paths = [root / "params" / f"{profile}.yaml", root / "requirements.lock"]
    paths += sorted((root / "notebooks").glob("*.ipynb"))
    paths += sorted(p for p in (root / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    paths += sorted((root / "paper").glob("*.tex")) + sorted((root / "paper").glob("sections/*.tex"))
    paths += sorted((root / "paper").glob("*.bib"))
    paths += sorted((root / "params" / "claims" / profile).glob("*.json"))
    paths += sorted((root / "scripts").glob("*.py"))
    paths += sorted(p for p in (root / "recorded").rglob("*") if p.is_file())
    chunks = [profile.encode(), device.encode()]
    for path in paths:
        chunks += [str(path.relative_to(root)).encode(), path.read_bytes() if path.exists() else b""]
    return sha256_bytes(*chunks)


def outputs_present(results: Path) -> bool:
    steps = sorted((results / "steps").glob("*.json"))
    if not steps or not (results / "claims.json").exists():
        return False
    for step in steps:
        if not all((results / rel).exists() for rel in json.loads(step.read_text()).get("outputs", [])):
            return False
    return True


def failure_message(name: str, exc: Exception, executed: Path, log_path: Path, results: Path) -> str:
    """The failing cell, the error and where the full log is, from papermill's exception."""
    index = getattr(exc, "cell_index", None)
    source = getattr(exc, "source", None)
    if source is None and index is not None and executed.exists():
        try:
            source = "".join(read_notebook(executed)["cells"][index]["source"])
        except (ValueError, KeyError, IndexError):
            source = None
    error = (
        f"{exc.ename}: {exc.evalue}" if getattr(exc, "ename", None) else f"{type(exc).__name__}: {exc}"
    )
    lines = [f"notebook {name} failed; nothing of this run was moved into {results}."]
    if index is not None:
        lines.append(f"failing cell {index} (execution count {getattr(exc, 'exec_count', '?')}):")
        shown = (source or "").splitlines()
        lines += [f"    {line}" for line in shown[:12]] + (["    ..."] if len(shown) > 12 else [])
    lines += [f"error: {error}", f"full log: {_show(log_path)}", f"partial notebook: {_show(executed)}"]
    return "\n".join(lines)


ALLOW_DIRTY = "KEYBIAS_ALLOW_DIRTY"
CLEAN_PROFILES = ("paper",)  # the profiles whose results are committed and read


def refuse_dirty_tree(root: Path, profile: str) -> None:
    """Committed results must come from a clean commit: with the paper profile, stop before any
    work on results/ if tracked source files have uncommitted changes, unless
    KEYBIAS_ALLOW_DIRTY=1. A scratch folder (--results elsewhere) is never refused."""

    if profile not in CLEAN_PROFILES or os.environ.get(ALLOW_DIRTY) == "1":
        if profile in CLEAN_PROFILES:
            log(f"warning: {ALLOW_DIRTY}=1: building from a tree with uncommitted changes; its results "
                "name no commit that reproduces them and must not be committed")
        return
    excludes = [f":(exclude){p}" for p in GENERATED]
    changed = git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes).splitlines()
    if changed:
        shown = ", ".join(line.split(maxsplit=1)[-1] for line in changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise BuildError(
            f"the {profile} profile builds the committed results, so it needs a clean tree, and "
            f"{len(changed)} tracked file(s) have uncommitted changes ({shown}): commit them first, "
            f"or set {ALLOW_DIRTY}=1 for a development build whose results are not to be committed")


def verify(reference: Path, scratch: Path, seconds: float | None = None, record: bool = False) -> int:
    """Compare freshly regenerated results with the reference; print the failures, then the three
    tiers (findings, exact and stable data, rounding statistics), the values compared per output
    class, and the summary. Writes nothing under `reference` unless `record` (`make verify-record`)."""

    report = compare_folders(reference, scratch)
    for failure in report.failures:
        print(f"verify: DIFFERS {failure}", flush=True)
    for line in report.class_table():
        print(f"verify: {line}", flush=True)
    for line in report.tier_table():
        print(f"verify: {line}", flush=True)
    print(f"verify: {report.summary()}", flush=True)
    took = f" after regenerating for {seconds:.0f} s" if seconds is not None else ""
    print(f"verify: {'PASSED' if report.ok else 'FAILED'}{took}; fresh results in {scratch}", flush=True)
    record_verify(reference if record else scratch, scratch, report)
    return 0 if report.ok else 1


def record_verify(folder: Path, scratch: Path, report) -> None:
    """`<folder>/machine/verify.json`: where the verify ran (CPU, instruction-set flags and caps),
    what each notebook took there, and the outcome. `make verify` writes it into its scratch
    folder; `make verify-record` into results/, where the README prints it."""

    walls = {}
    for step in sorted((scratch / "steps").glob("*.json")):
        walls[step.stem] = json.loads(step.read_text())["provenance"]["wall_seconds"]
    caps = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
    record = {
        "machine_specific": True,
        "cpu": cpu_model(),
        "isa_flags": cpu_flags(),
        "isa_env": {k: os.environ[k] for k in caps if os.environ.get(k)},
        "wall_seconds": walls,
        "total_wall_seconds": round(sum(walls.values()), 1),
        "ok": report.ok,
        "failures": len(report.failures),
        "summary": report.summary(),
    }
    atomic_write_text(folder / "machine" / "verify.json", json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keybias.pipeline.steps", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--results", default=str(ROOT / "results"))
    parser.add_argument("--force", action="store_true", help="rerun even if up to date")
    parser.add_argument(
        "command", choices=["check", "notebooks", "paper", "all", "verify", "bundle", "arxiv"]
    )
    parser.add_argument("--only", nargs="+", help="run only these notebooks")
    parser.add_argument("--record", action="store_true",
                        help="verify: keep the record of this run in results/machine/verify.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("traitlets", "asyncio", "blib2to3", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    t0 = time.perf_counter()
    try:
        if args.only and args.command not in ("notebooks", "check"):
            raise BuildError("--only goes with `notebooks`; `all` and `paper` need every notebook")
        if args.command == "bundle":
            out = make_bundle(ROOT)
            log(f"wrote {_show(out)} ({out.stat().st_size / 1e6:.1f} MB, sha256 {sha256_file(out)})")
            return 0
        results = Path(args.results).resolve()
        fingerprint = input_fingerprint(ROOT, args.profile, args.device)
        done_stamp = results / ".build" / "all.key"
        if (
            args.command == "all" and not args.force and args.device == "cpu"
            and done_stamp.exists() and done_stamp.read_text() == fingerprint
            and outputs_present(results) and (ROOT / "paper" / "main.pdf").exists()
        ):
            log(f"nothing changed since the last complete build; finished in {time.perf_counter() - t0:.1f} s")
            return 0
        if args.command in ("all", "notebooks", "paper", "arxiv") and results == (ROOT / "results").resolve():
            refuse_dirty_tree(ROOT, args.profile)
        done_stamp.unlink(missing_ok=True)
        build = Build(args.profile, args.device, results, force=args.force, only=args.only)
        build.check()
        if args.command == "check":
            log(f"profile {args.profile!r} and device {build.device!r} are valid")
            return 0
        if args.command == "verify":
            scratch = Path(tempfile.mkdtemp(prefix="keybias-verify-"))
            log(f"verify: regenerating every result into {scratch}")
            fresh = Build(args.profile, args.device, scratch, force=True)
            fresh.check()
            fresh.check_tools(paper=False)
            fresh.run_notebooks()  # prints one status line per notebook as it regenerates
            # the claim check writes the claim counts and the macro index, as `make all` does;
            # a failing claim is reported by the comparison (its outcome differs), not raised here
            with contextlib.suppress(BuildError):
                fresh.check_claims(fresh.gather())
            return verify(build.results, scratch, time.perf_counter() - t0, record=args.record)
        build.check_tools(paper=args.command in ("paper", "all", "arxiv"))
        if args.command in ("notebooks", "all"):
            build.run_notebooks()
        if args.command in ("paper", "all", "arxiv") or (args.command == "notebooks" and not args.only):
            claims = build.gather()
            build.check_claims(claims)
        if args.command in ("paper", "all", "arxiv"):
            build.build_paper()
        if args.command == "all":
            atomic_write_text(done_stamp, fingerprint)
        if args.command == "arxiv":
            make_and_check_arxiv(ROOT, build._source_date())
    except (P.ParameterError, BuildError) as exc:
        log(f"error: {exc}")
        return 2
    except Exception as exc:
        if not isinstance(exc, ArxivError | BundleError):
            raise
        log(f"error: {exc}")
        return 2
    log(f"finished in {time.perf_counter() - t0:.1f} s")
    return 0


def make_and_check_arxiv(root: Path, source_date: str) -> Path:
    """dist/keybias-arxiv-<commit>.tar.gz, proven by compiling it alone with pdflatex."""

    commit = git(root, "rev-parse", "--short=10", "HEAD") or "unknown"
    out = make_arxiv(root / "paper", root / "dist" / f"keybias-arxiv-{commit}.tar.gz", int(source_date))
    t0 = time.perf_counter()
    pdf = check_compiles(out)
    log(
        f"arxiv: wrote {_show(out)} ({out.stat().st_size / 1e6:.2f} MB); pdflatex alone compiled it "
        f"in a scratch folder in {time.perf_counter() - t0:.1f} s ({pdf})"
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
