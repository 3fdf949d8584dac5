"""The artifact bundle is deterministic and refuses a dirty tree; citation metadata is valid;
the arXiv source compiles with pdflatex alone."""

import datetime as dt
import gzip
import hashlib
import json
import shutil
import subprocess
import tarfile

import pytest
import yaml

from conftest import ROOT
from keybias.pipeline import arxiv, bundle


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "results" / "notebooks").mkdir(parents=True)
    (repo / "paper").mkdir()
    (repo / "results" / "notebooks" / "01_x.html").write_text("<html></html>\n")
    (repo / "paper" / "main.pdf").write_bytes(b"%PDF-1.5 fake\n")
    for name in ("CITATION.cff", ".zenodo.json", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x")
    return repo


def test_bundle_is_byte_identical_across_runs(tmp_path):
    repo = make_repo(tmp_path)
    first = bundle.make_bundle(repo, tmp_path / "one")
    (repo / "README.md").touch()  # a new file time must not change the bundle
    second = bundle.make_bundle(repo, tmp_path / "two")
    assert bundle.sha256_file(first) == bundle.sha256_file(second)
    raw = first.read_bytes()
    assert raw[4:8] == b"\0\0\0\0", "gzip header carries a time"
    with tarfile.open(first) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        assert all(m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
        commit_time = int(subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=repo, capture_output=True,
                                         text=True, check=True).stdout)
        assert {m.mtime for m in members} == {commit_time}
        prefix = names[0].split("/")[0]
        assert f"{prefix}/SHA256SUMS" in names and f"{prefix}/.zenodo.json" in names
        assert tar.getmember(f"{prefix}/run.sh").mode == 0o755
        sums = tar.extractfile(f"{prefix}/SHA256SUMS").read().decode()
        readme = tar.extractfile(f"{prefix}/README.md").read()
    assert f"{hashlib.sha256(readme).hexdigest()}  README.md" in sums


def test_bundle_refuses_a_dirty_tree(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "results" / "notebooks" / "01_x.html").write_text("changed\n")
    with pytest.raises(bundle.BundleError, match="results/notebooks/01_x.html"):
        bundle.make_bundle(repo, tmp_path / "out")
    git(repo, "checkout", "--", ".")
    (repo / "stray.txt").write_text("untracked\n")
    with pytest.raises(bundle.BundleError, match="stray.txt"):
        bundle.make_bundle(repo, tmp_path / "out")


def test_deterministic_tar_has_no_time_in_gzip_header():
    blob = bundle.deterministic_tar_gz({"a": (b"x", False)}, mtime=0)
    assert gzip.decompress(blob)
    assert blob == bundle.deterministic_tar_gz({"a": (b"x", False)}, mtime=0)


def _stringify_dates(value):
    if isinstance(value, dict):
        return {k: _stringify_dates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stringify_dates(v) for v in value]
    return value.isoformat() if isinstance(value, dt.date) else value


def test_citation_cff_is_valid_cff_1_2_0():
    import jsonschema

    schema = json.loads((ROOT / "tests" / "data" / "cff-schema-1.2.0.json").read_text())
    cff = _stringify_dates(yaml.safe_load((ROOT / "CITATION.cff").read_text()))
    jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).validate(cff)
    bad = dict(cff, authors=[])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(bad)


# Zenodo's deposit metadata (developers.zenodo.org, "Deposit metadata"): the allowed keys,
# the required ones, and the controlled vocabularies this file uses.
ZENODO_FIELDS = {
    "upload_type", "publication_type", "image_type", "publication_date", "title", "creators",
    "description", "access_right", "license", "embargo_date", "access_conditions", "doi",
    "prereserve_doi", "keywords", "notes", "related_identifiers", "contributors", "references",
    "communities", "grants", "journal_title", "journal_volume", "journal_issue", "journal_pages",
    "conference_title", "conference_acronym", "conference_dates", "conference_place",
    "conference_url", "conference_session", "conference_session_part", "imprint_publisher",
    "imprint_isbn", "imprint_place", "partof_title", "partof_pages", "thesis_supervisors",
    "thesis_university", "subjects", "version", "language", "locations", "dates", "method",
}
ZENODO_REQUIRED = {"upload_type", "title", "creators", "description"}
ZENODO_UPLOAD_TYPES = {"publication", "poster", "presentation", "dataset", "image", "video",
                       "software", "lesson", "physicalobject", "other"}
ZENODO_ACCESS = {"open", "embargoed", "restricted", "closed"}
ZENODO_CREATOR_KEYS = {"name", "affiliation", "orcid", "gnd"}


def zenodo_errors(meta: dict) -> list[str]:
    errors = [f"unknown field {k!r}" for k in sorted(set(meta) - ZENODO_FIELDS)]
    errors += [f"missing field {k!r}" for k in sorted(ZENODO_REQUIRED - set(meta))]
    if meta.get("upload_type") not in ZENODO_UPLOAD_TYPES:
        errors.append(f"upload_type {meta.get('upload_type')!r} not in {sorted(ZENODO_UPLOAD_TYPES)}")
    if "access_right" in meta and meta["access_right"] not in ZENODO_ACCESS:
        errors.append(f"access_right {meta['access_right']!r}")
    creators = meta.get("creators")
    if not isinstance(creators, list) or not creators:
        errors.append("creators must be a non-empty list")
    else:
        for c in creators:
            if not isinstance(c, dict) or not c.get("name") or set(c) - ZENODO_CREATOR_KEYS:
                errors.append(f"creator {c!r} needs a name and only {sorted(ZENODO_CREATOR_KEYS)}")
    for key in ("keywords", "related_identifiers", "communities", "references"):
        if key in meta and not isinstance(meta[key], list):
            errors.append(f"{key} must be a list")
    for key in ("title", "description", "version", "license", "notes"):
        if key in meta and not (isinstance(meta[key], str) and meta[key].strip()):
            errors.append(f"{key} must be a non-empty string")
    if "publication_date" in meta:
        try:
            dt.date.fromisoformat(meta["publication_date"])
        except (TypeError, ValueError):
            errors.append("publication_date must be YYYY-MM-DD")
    return errors


def test_zenodo_json_uses_deposit_metadata_fields():
    meta = json.loads((ROOT / ".zenodo.json").read_text())
    assert zenodo_errors(meta) == []
    assert zenodo_errors({**meta, "upload_type": "code", "authors": []}) == [
        "unknown field 'authors'", "upload_type 'code' not in " + str(sorted(ZENODO_UPLOAD_TYPES))
    ]


def test_citation_and_zenodo_agree():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    meta = json.loads((ROOT / ".zenodo.json").read_text())
    assert str(cff["version"]) == meta["version"]
    assert cff["license"] == meta["license"]
    assert [a["name"] for a in cff["authors"]] == [c["name"] for c in meta["creators"]]


def make_paper(tmp_path):
    paper = tmp_path / "proj" / "paper"
    (paper / "sections").mkdir(parents=True)
    (paper / "build").mkdir()
    figures = tmp_path / "proj" / "results" / "figures"
    figures.mkdir(parents=True)
    macros = tmp_path / "proj" / "results" / "macros"
    macros.mkdir()
    (macros / "all.tex").write_text("\\newcommand{\\Answer}{42}\n")
    (paper / "main.tex").write_text(
        "\\documentclass{article}\n\\usepackage{graphicx}\n\\graphicspath{{../results/figures/}}\n"
        "\\input{../results/macros/all.tex}\n\\begin{document}\n% \\input{never.tex}\n"
        "\\input{sections/body}\n\\bibliographystyle{plain}\n\\bibliography{refs}\n\\end{document}\n"
    )
    (paper / "sections" / "body.tex").write_text(
        "The answer is \\Answer{} \\cite{k}, see Figure~\\ref{f}.\\\\\n"
        "\\begin{figure}\\includegraphics[width=1cm]{dot}\\caption{A dot.}\\label{f}\\end{figure}\n"
    )
    (paper / "build" / "main.bbl").write_text(
        "\\begin{thebibliography}{1}\n\\bibitem{k} A. Author. A title. 2026.\n\\end{thebibliography}\n"
    )
    return paper, figures


def test_arxiv_source_inlines_inputs_and_rewrites_paths(tmp_path):
    paper, figures = make_paper(tmp_path)
    (figures / "dot.pdf").write_bytes(b"%PDF-1.4 placeholder\n")
    files = arxiv.source_files(paper)
    assert set(files) == {"main.tex", "main.bbl", "figures/dot.pdf"}
    text = files["main.tex"][0].decode()
    assert "\\newcommand{\\Answer}{42}" in text and "The answer is" in text
    assert "\\input{sections" not in text and "../" not in text
    assert "% \\input{never.tex}" in text, "commented-out inputs stay as they are"
    assert "\\includegraphics[width=1cm]{figures/dot.pdf}" in text
    assert "\\\\\n" in text, "TeX line breaks survive inlining"


def test_arxiv_source_carries_listings_and_drops_bundle_links(tmp_path):
    paper, figures = make_paper(tmp_path)
    (figures / "dot.pdf").write_bytes(b"%PDF-1.4 placeholder\n")
    scripts = paper.parent / "scripts"
    scripts.mkdir()
    (scripts / "repro.py").write_text("print('quirk')\n")
    body = paper / "sections" / "body.tex"
    body.write_text(body.read_text() + "\\verbatiminput{../scripts/repro.py}\n"
                    "\\href{../results/notebooks/01_a.html}{the notebook}\n")
    files = arxiv.source_files(paper)
    text = files["main.tex"][0].decode()
    assert files["listings/repro.py"][0] == b"print('quirk')\n"
    assert "\\verbatiminput{listings/repro.py}" in text
    assert "\\keybiasbundlelink{the notebook}" in text and "../" not in text


def test_arxiv_source_refuses_missing_figure_and_bbl(tmp_path):
    paper, _ = make_paper(tmp_path)
    with pytest.raises(arxiv.ArxivError, match="figure 'dot'"):
        arxiv.source_files(paper)


@pytest.mark.skipif(not shutil.which("pdflatex"), reason="pdflatex not installed (`make tex`)")
def test_arxiv_tarball_compiles_with_pdflatex_alone(tmp_path):
    paper, figures = make_paper(tmp_path)
    _dot_pdf(figures / "dot.pdf")
    out = arxiv.make_arxiv(paper, tmp_path / "arxiv.tar.gz", mtime=0)
    pdf = arxiv.check_compiles(out)
    assert pdf.stat().st_size > 0
    assert arxiv.make_arxiv(paper, tmp_path / "again.tar.gz", mtime=0).read_bytes() == out.read_bytes()


def _dot_pdf(path):
    """A minimal one-page PDF, made by matplotlib (in the lock) so the test needs no other tool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(0.3, 0.3))
    fig.savefig(path, metadata={"CreationDate": None})
    plt.close(fig)
