"""Open rendered notebooks in headless Chromium with the network cut off, and see what it did.

The folder is served by a local HTTP server that logs every request and its status. Chromium
gets that same server as its proxy, so no request for another host (a CDN script, a web font,
a stylesheet) leaves the machine: it arrives as a proxy request (`GET http://...` or
`CONNECT host:443`) and is refused with 403. Chromium also talks to its own services
(updates, accounts) at start-up, so what the *page* asked for is read from Chromium's NetLog:
every request whose initiator is the page's origin, plus the page itself. Those must all be
files inside the page's folder, and must exist. `--virtual-time-budget` lets MathJax finish
before the DOM is dumped. Beyond loading, `reader_problems` checks what a reader meets
(recording-only code, raw scalar outputs, cut cells, figures without captions) and
`check_entry_page` that every link of results/index.html into a notebook lands on an anchor.
`layout_problems` measures every page of the site inside an iframe of a given width (1280 and
390 px: headless windows are at least 500 px wide): sideways scroll, cut cells, "#" in place of
a number, config reprs, "uncommitted"; `local_link_problems` resolves every local link.
Used by tests/integration/test_browser.py; `python -m keybias.pipeline.browser DIR` checks a folder by hand.
"""

from __future__ import annotations

import functools
import html as _html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.parse import unquote as _unquote

from bs4 import BeautifulSoup

from keybias.pipeline import render

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
VIRTUAL_TIME_MS = 20000
# Raw TeX left in prose after typesetting: $...$ or $$...$$ with no space just inside, the
# pattern MathJax itself would have typeset had it run.
_RAW_MATH = re.compile(r"\$\$?(?=\S)[^$\n]{1,400}?(?<=\S)\$\$?")


def find_chromium() -> str | None:
    explicit = os.environ.get("KEYBIAS_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) or Path(explicit).is_file() else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class RequestLog:
    root: Path
    local: list[tuple[str, int]] = field(default_factory=list)  # (path, status)
    external: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; refuses and records anything meant for another host."""

    request_log: RequestLog

    def _external(self) -> bool:
        target = self.path
        if self.command == "CONNECT" or target.startswith(("http://", "https://", "ws://", "wss://")):
            with self.request_log.lock:
                self.request_log.external.append(f"{self.command} {target}")
            self.send_error(403, "network access blocked by the keybias browser test")
            return True
        return False

    def do_CONNECT(self):  # noqa: N802 (http.server's naming)
        self._external()

    def do_GET(self):  # noqa: N802
        if not self._external():
            super().do_GET()

    def do_HEAD(self):  # noqa: N802
        if not self._external():
            super().do_HEAD()

    def do_POST(self):  # noqa: N802
        if not self._external():
            self.send_error(405)

    def send_response(self, code, message=None):
        if not self.path.startswith(("http://", "https://")) and self.command != "CONNECT":
            path = unquote(urlsplit(self.path).path)
            with self.request_log.lock:
                self.request_log.local.append((path, code))
        super().send_response(code, message)

    def log_message(self, format, *args):  # quiet: the RequestLog is the record
        pass


class LoggingServer:
    """An HTTP server for one folder on 127.0.0.1, in a thread, recording every request."""

    def __init__(self, root: Path):
        self.log = RequestLog(Path(root))
        handler = type("Handler", (_Handler,), {"request_log": self.log})
        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
        )
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LoggingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, rel: str) -> str:
        return f"http://127.0.0.1:{self.port}/{rel}"


def chromium_command(chromium: str, port: int, profile_dir: Path, *, budget_ms: int = VIRTUAL_TIME_MS) -> list[str]:
    proxy = f"http://127.0.0.1:{port}"
    return [
        chromium,
        "--headless",
        "--no-sandbox",  # root in containers; the page is our own file
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-domain-reliability",
        "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
        "--metrics-recording-only",
        # Every host but the local server goes to the logging server as a proxy request
        # (Chromium never proxies loopback; naming 127.0.0.1 in the bypass list says so).
        f"--proxy-server={proxy}",
        "--proxy-bypass-list=127.0.0.1",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile_dir}",
        f"--virtual-time-budget={budget_ms}",
        "--window-size=1280,1600",  # the reader's window: 1280 px wide at 100% zoom
        "--hide-scrollbars",
    ]


@dataclass
class PageReport:
    name: str
    dom: str
    screenshot: Path | None
    seconds: float
    local_requests: list[tuple[str, int]]  # (path, HTTP status) served from the folder
    external_requests: list[str]  # URLs on other hosts that the page asked for (all blocked)
    background_requests: list[str]  # Chromium's own service traffic, blocked, not the page's
    stderr: str


def page_requests(netlog: Path, origin: str, page_url: str) -> tuple[list[str], list[str]]:
    """(URLs the page requested, URLs Chromium requested for itself) from a NetLog file."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    page, background = [], []
    for event in log["events"]:
        if event.get("type") != start or event.get("phase") != 1:  # phase 1: begin
            continue
        params = event.get("params", {})
        url = params.get("url", "")
        if params.get("initiator") == origin or url == page_url:
            page.append(url)
        else:
            background.append(url)
    return list(dict.fromkeys(page)), list(dict.fromkeys(background))


def load_page(chromium: str, server: LoggingServer, rel: str, screenshot: Path | None,
              *, budget_ms: int = VIRTUAL_TIME_MS, timeout: float = 120) -> PageReport:
    """Dump the DOM of `rel` after its scripts ran, and optionally screenshot it."""
    start_local = len(server.log.local)
    origin, url = f"http://127.0.0.1:{server.port}", server.url(rel)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="keybias-chromium-") as scratch:
        base = chromium_command(chromium, server.port, Path(scratch) / "profile", budget_ms=budget_ms)
        netlog = Path(scratch) / "netlog.json"
        extra = [f"--log-net-log={netlog}", "--dump-dom"]
        if screenshot is not None:  # one load gives both the DOM and the picture
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            extra.append(f"--screenshot={screenshot}")
        done = subprocess.run([*base, *extra, url], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"chromium failed on {rel} ({done.returncode}):\n{done.stderr[-2000:]}")
        requested, background = page_requests(netlog, origin, url)
        stderr = done.stderr
    seconds = time.perf_counter() - t0
    with server.log.lock:
        local = list(server.log.local[start_local:])
    # data: and blob: URLs never leave the page; everything else must be on the local server
    external = [u for u in requested if not u.startswith((origin + "/", "data:", "blob:"))]
    return PageReport(rel, done.stdout, screenshot, seconds, local, external, background, stderr)


@dataclass
class DomFindings:
    math_elements: int
    math_errors: int
    raw_math: list[str]
    images_without_alt: int
    has_header: bool
    toc_entries: int
    index_link: bool


def inspect_dom(dom: str) -> DomFindings:
    """What the reader sees: typeset math, raw TeX left in prose, alt text, navigation."""

    soup = BeautifulSoup(dom, features="html.parser")
    containers = soup.find_all("mjx-container")
    errors = soup.select("mjx-merror, [data-mjx-error]")
    raw = []
    for prose in soup.select(".jp-MarkdownCell .jp-RenderedMarkdown, .kb-header, .jp-RenderedLatex"):
        for node in prose.find_all(string=True):
            if node.find_parent(["code", "pre", "mjx-container", "script", "style"]):
                continue
            raw += _RAW_MATH.findall(str(node))
    header = soup.find("header", class_="kb-header")
    toc = header.find("nav", class_="kb-toc") if header else None
    return DomFindings(
        math_elements=len(containers),
        math_errors=len(errors),
        raw_math=raw,
        images_without_alt=sum(1 for img in soup.find_all("img") if not (img.get("alt") or "").strip()),
        has_header=header is not None,
        toc_entries=len(toc.find_all("a")) if toc else 0,
        index_link=bool(header and header.find("a", href="../index.html")),
    )


_RAW_SCALAR = re.compile(r"""^(?:'[^'\n]*'|"[^"\n]*"|[-+]?\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?)$""")


def reader_problems(dom: str) -> list[str]:
    """What a reader should not meet: a visible code cell that only records, a raw scalar
    output (`'1.00'`, `2900`), a table cell or text output cut with "..." or "…", a pandas
    table that did not go through `keybias.studies.tables.show_table`, a figure without a
    visible caption."""


    soup = BeautifulSoup(dom, features="html.parser")
    problems = []
    for editor in soup.select(".jp-CodeCell .jp-InputArea-editor"):
        code = editor.get_text()
        plan = render.reader_cells({"cells": [{"cell_type": "code", "source": code, "metadata": {}, "outputs": []}]})
        if plan[0] and plan[0]["hide"]:
            problems.append(f"visible code cell that only records: {' '.join(code.split())[:80]!r}")
    for output in soup.select(".jp-OutputArea-executeResult"):
        if output.find(["table", "img", "mjx-container"]):
            continue
        text = output.get_text().strip()
        if _RAW_SCALAR.match(text):
            problems.append(f"raw output {text[:40]!r}")
    for node in soup.select(".jp-OutputArea-output td, .jp-OutputArea-output th, .jp-OutputArea-output pre"):
        text = node.get_text().strip()
        if len(text) > 3 and text.endswith(("...", "\u2026")):
            problems.append(f"truncated cell {text[-60:]!r}")
    for table in soup.select(".jp-OutputArea-output table"):
        if "dataframe" in (table.get("class") or []):
            problems.append("a pandas table not shown through keybias.studies.tables: "
                            f"{' '.join(table.get_text(' ').split())[:60]!r}")
    for img in soup.select(".jp-OutputArea img"):
        figure = img.find_parent("figure")
        caption = figure.find("figcaption") if figure else None
        if caption is None or not caption.get_text().strip():
            problems.append(f"figure without a caption: {(img.get('alt') or '')[:60]!r}")
    return problems


def claim_link_problems(index_html: str, folder: Path) -> list[str]:
    """Each `notebooks/NN.html#claim-...` (or any #fragment) link of the entry page that does
    not land on an element with that id in the page it names."""

    soup = BeautifulSoup(index_html, features="html.parser")
    ids: dict[str, set[str]] = {}
    problems = []
    for link in soup.find_all("a", href=True):
        target, _, fragment = link["href"].partition("#")
        if not fragment or not target.startswith("notebooks/"):
            continue
        page = Path(folder) / target
        if target not in ids:
            ids[target] = ({t["id"] for t in BeautifulSoup(page.read_text(), features="html.parser").find_all(id=True)}
                           if page.is_file() else set())
        if fragment not in ids[target]:
            problems.append(f"{link['href']} does not resolve")
    return problems


def check_entry_page(results: Path, shot: Path | None, chromium: str | None = None,
                     *, budget_ms: int = 5000) -> list[str]:
    """Load `<results>/index.html` offline (screenshot it), and check every link into a
    notebook lands on an existing anchor."""
    results = Path(results).resolve()
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (apt-get install chromium, or set KEYBIAS_CHROMIUM)")
    with LoggingServer(results) as server:
        report = load_page(chromium, server, "index.html", shot, budget_ms=budget_ms)
    problems = []
    if report.external_requests:
        problems.append(f"requested other hosts: {report.external_requests}")
    failed = [f"{p} (HTTP {s})" for p, s in report.local_requests if s >= 400]
    if failed:
        problems.append(f"missing files: {failed}")
    problems += claim_link_problems(report.dom, results)
    if shot is not None and not (shot.is_file() and shot.stat().st_size > 1000):
        problems.append("no screenshot written")
    return problems


def outside_folder(requests: list[tuple[str, int]], folder_prefix: str) -> list[str]:
    """Local requests that left the page's folder or failed (a missing font is a failure)."""
    bad = []
    for path, status in requests:
        if not path.startswith(folder_prefix) or ".." in path.split("/"):
            bad.append(f"{path} (outside {folder_prefix})")
        elif status >= 400:
            bad.append(f"{path} (HTTP {status})")
    return bad


def page_problems(report: PageReport, page_text: str, folder_prefix: str) -> list[str]:
    """Everything wrong with one loaded page; empty when a reader offline sees it whole."""
    found = inspect_dom(report.dom)
    problems = []
    if report.external_requests:
        problems.append(f"requested other hosts: {report.external_requests}")
    bad_local = outside_folder(report.local_requests, folder_prefix)
    if bad_local:
        problems.append(f"requests outside its folder or failing: {bad_local}")
    if "$" in page_text or "\\(" in page_text:
        if not any(path.endswith("/tex-chtml-full.js") and path.startswith(folder_prefix)
                   for path, _ in report.local_requests):
            problems.append("never loaded the shared local MathJax")
        if found.math_elements == 0:
            problems.append("no typeset math (mjx-container) although the page has TeX")
    if found.math_errors:
        problems.append(f"{found.math_errors} MathJax errors")
    if found.raw_math:
        problems.append(f"raw TeX left in prose: {found.raw_math[:5]}")
    if found.images_without_alt:
        problems.append(f"{found.images_without_alt} images without alt text")
    if not found.has_header or not found.index_link:
        problems.append("no navigation header with a link to ../index.html")
    if not found.toc_entries:
        problems.append("no table of contents")
    if report.screenshot is not None and not (
        report.screenshot.is_file() and report.screenshot.stat().st_size > 1000
    ):
        problems.append("no screenshot written")
    problems += reader_problems(report.dom)
    return problems


def check_folder(folder: Path, shots: Path | None, chromium: str | None = None,
                 *, budget_ms: int = VIRTUAL_TIME_MS) -> dict[str, list[str]]:
    """`page_problems` of every *.html in `folder`, served with its parent as the web root
    (so a reference to ../anything is a request outside the folder, and is reported)."""
    folder = Path(folder).resolve()
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (apt-get install chromium, or set KEYBIAS_CHROMIUM)")
    prefix = f"/{folder.name}/"
    results = {}
    with LoggingServer(folder.parent) as server:
        for page in sorted(folder.glob("*.html")):
            shot = shots / f"{page.stem}.png" if shots is not None else None
            report = load_page(chromium, server, f"{folder.name}/{page.name}", shot, budget_ms=budget_ms)
            results[page.name] = page_problems(report, page.read_text(), prefix)
    return results


# -- the site as a reader meets it: widths, links, cells, plumbing -------------------------------
LAYOUT_WIDTHS = (1280, 390)
MAX_LINE_CHARS = 85  # prose is set at about 75 characters a line; a paragraph over this average fails
# Measured inside an iframe of the given width: headless windows are at least 500 px wide.
# For each page: does it scroll sideways, cells cut off (content wider than the cell, or a table
# wider than its box at desktop width), "#" standing in for a number, config reprs, "uncommitted",
# a title count other than one, more than one commit named (hex strings of 7 to 40 characters that
# are not prefixes of one another), a sha256 digest.
_LAYOUT_SCRIPT = r"""
var pages = %(pages)s, width = %(width)d, MAX_LINE = %(max_line)d, out = [], i = 0, frame = document.getElementById('f');
function measure(doc) {
  var r = {page: pages[i], problems: []}, root = doc.documentElement;
  if (root.scrollWidth > frame.clientWidth + 1)
    r.problems.push('scrolls sideways: ' + root.scrollWidth + ' px wide in a ' + frame.clientWidth + '-px frame');
  // nothing wider than the viewport, nor clipped inside its box, except inside a block made to
  // scroll sideways (a code block, display math, a table's box), which must itself fit
  var vw = root.clientWidth, SCROLLS = 'pre, mjx-container[display="true"], mjx-container.kb-wide-math, .jp-RenderedLatex, ' +
    '.kb-table, .kb-equation, .jp-InputArea-editor';
  var scrolls = function (el) { var s = getComputedStyle(el); return el.matches(SCROLLS) && /auto|scroll/.test(s.overflowX); };
  var seenWide = 0;
  doc.querySelectorAll('body *').forEach(function (el) {
    if (seenWide >= 5 || !el.getClientRects().length || (el.checkVisibility && !el.checkVisibility()) ||
        el.closest('script, style, svg') ||
        (el.parentElement && el.parentElement.closest('mjx-container'))) return;
    for (var a = el.parentElement; a && a !== doc.body; a = a.parentElement) if (scrolls(a)) return;
    var box = el.getBoundingClientRect(), s = getComputedStyle(el), what = el.tagName.toLowerCase() +
      (el.className && typeof el.className === 'string' ? '.' + el.className.split(/\s+/)[0] : '');
    var t = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 50);
    if (box.width > 0 && (box.right > vw + 1 || box.left < -1)) {
      seenWide++; r.problems.push('wider than the ' + vw + '-px viewport (' + Math.round(box.left) + ' to ' +
        Math.round(box.right) + ' px): ' + what + ' ' + t);
    } else if (!scrolls(el) && s.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1 &&
               !el.matches('td, th') && el.clientWidth > 0) {
      seenWide++; r.problems.push('clipped inside its box (' + el.scrollWidth + ' px in ' + el.clientWidth + '): ' + what + ' ' + t);
    }
  });
  doc.querySelectorAll('td, th').forEach(function (c) {
    var s = getComputedStyle(c), t = c.textContent.trim();
    if (c.scrollWidth > c.clientWidth + 1 && s.overflowX !== 'visible')
      r.problems.push('cell cut off: ' + t.slice(0, 60));
    if (/(^|[\s(])#($|[\s;,.)])/.test(t)) r.problems.push('"#" in place of a number: ' + t.slice(0, 80));
  });
  if (width >= 1000) doc.querySelectorAll('.kb-table').forEach(function (b) {
    if (b.scrollWidth > b.clientWidth + 1) r.problems.push('table wider than its box at ' + width + ' px: ' +
      b.textContent.trim().slice(0, 60));
  });
  if (width >= 1000) {
    // prose: characters per line of each long paragraph, from its height and its line height
    doc.querySelectorAll('p, li, figcaption').forEach(function (p) {
      var t = p.textContent.replace(/\s+/g, ' ').trim(), s = getComputedStyle(p);
      if (t.length < 200 || p.closest('pre, code, table, nav') || !p.getClientRects().length) return;
      var lh = parseFloat(s.lineHeight) || 1.5 * parseFloat(s.fontSize), lines = Math.round(p.clientHeight / lh);
      if (lines >= 2 && t.length / lines > MAX_LINE)
        r.problems.push('lines of ' + Math.round(t.length / lines) + ' characters: ' + t.slice(0, 50));
    });
    // figures: drawn at twice their shown width (or vector), and alt text that is not the caption
    doc.querySelectorAll('img').forEach(function (img) {
      if (!img.getClientRects().length || img.clientWidth < 120) return;
      var vector = /\.svg($|[?#])|^data:image\/svg/.test(img.getAttribute('src') || '');
      if (!vector && img.naturalWidth < 1.9 * img.clientWidth)
        r.problems.push('figure at ' + (img.naturalWidth / img.clientWidth).toFixed(1) + 'x: ' +
                        (img.getAttribute('src') || '').slice(0, 40));
      var fig = img.closest('figure'), cap = fig && fig.querySelector('figcaption');
      var words = function (x) { return (x || '').toLowerCase().replace(/[^a-z0-9 ]/g, ' ').split(/\s+/).filter(Boolean); };
      // the alt text's first ten words, in order, inside the caption: the caption says it again
      var a = words(img.alt).slice(0, 10).join(' ');
      if (cap && a.split(' ').length >= 6 && (' ' + words(cap.textContent).join(' ') + ' ').indexOf(' ' + a + ' ') >= 0)
        r.problems.push('alt text repeats the caption: ' + img.alt.slice(0, 50));
    });
    // contrast (WCAG AA): every element that holds text, code unfolded, against its background
    doc.querySelectorAll('details').forEach(function (d) { d.open = true; });
    var parse = function (c) { var m = c.match(/[\d.]+/g) || [0, 0, 0, 0]; return [+m[0], +m[1], +m[2], m.length > 3 ? +m[3] : 1]; };
    var lum = function (c) { return c.slice(0, 3).map(function (v) { v /= 255; return v <= 0.03928 ? v / 12.92 :
      Math.pow((v + 0.055) / 1.055, 2.4); }).reduce(function (s, v, k) { return s + v * [0.2126, 0.7152, 0.0722][k]; }, 0); };
    var seenBad = {};
    doc.querySelectorAll('body *').forEach(function (el) {
      if (el.closest('svg, mjx-container, script, style') || !el.getClientRects().length) return;
      var own = Array.prototype.some.call(el.childNodes, function (n) { return n.nodeType === 3 && n.textContent.trim(); });
      if (!own) return;
      var s = getComputedStyle(el), fg = parse(s.color), bg = null, e = el;
      if (s.visibility === 'hidden' || +s.opacity === 0) return;
      while (e && e.nodeType === 1) { var b = parse(getComputedStyle(e).backgroundColor); if (b[3] > 0.5) { bg = b; break; } e = e.parentElement; }
      bg = bg || [255, 255, 255, 1];
      var l1 = lum(fg), l2 = lum(bg), ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
      var size = parseFloat(s.fontSize), large = size >= 24 || (size >= 18.66 && +s.fontWeight >= 700);
      var key = s.color + '/' + bg.join(',');
      if (ratio < (large ? 3 : 4.5) && !seenBad[key]) {
        seenBad[key] = 1;
        r.problems.push('contrast ' + ratio.toFixed(2) + ':1 (' + s.color + ' on rgb(' + bg.slice(0, 3).join(', ') +
                        ')): ' + el.textContent.trim().slice(0, 40));
      }
    });
  }
  doc.querySelectorAll('.jp-OutputArea-output').forEach(function (o) {
    var t = o.textContent;
    if (/(^|\n)\s*[A-Z]\w*(Config|Settings)\(\w+=/.test(t)) r.problems.push('config repr: ' + t.trim().slice(0, 60));
  });
  var text = doc.body ? doc.body.innerText : '';
  if (/uncommitted/i.test(text)) r.problems.push('says "uncommitted"');
  var titles = doc.querySelectorAll('h1').length;
  if (titles !== 1) r.problems.push(titles + ' titles (h1) instead of one');
  var hashes = (text.match(/\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b/g) || []).sort(
    function (a, b) { return a.length - b.length; }), commits = [];
  hashes.forEach(function (h) {
    if (!commits.some(function (c) { return h.indexOf(c) === 0 || c.indexOf(h) === 0; })) commits.push(h);
  });
  if (commits.length > 1) r.problems.push('names ' + commits.length + ' commits: ' + commits.slice(0, 4).join(', '));
  if (/\b[0-9a-f]{64}\b/.test(text)) r.problems.push('a sha256 digest in view');
  return r;
}
function next() {
  if (i >= pages.length) { document.getElementById('out').textContent = JSON.stringify(out); return; }
  frame.onload = function () {
    var w = frame.contentWindow, done = function () {
      setTimeout(function () {
        try { out.push(measure(frame.contentDocument)); }
        catch (e) { out.push({page: pages[i], problems: ['could not be measured: ' + e]}); }
        i++; next();
      }, 300);
    };
    if (w.MathJax && w.MathJax.startup && w.MathJax.startup.promise) w.MathJax.startup.promise.then(done, done);
    else done();
  };
  frame.src = pages[i];
}
next();
"""


def layout_problems(results: Path, width: int, chromium: str | None = None, *,
                    pages: list[str] | None = None, budget_ms: int = 90000, timeout: float = 300) -> dict[str, list[str]]:
    """Load every page of the site (index.html, files.html, notebooks/*.html) in an iframe
    `width` px wide, in one headless Chromium started with --allow-file-access-from-files, and
    report per page what `_LAYOUT_SCRIPT` finds. An entry starting "note:" (a table at desktop
    width that scrolls inside its own box: nothing is cut, the page does not scroll) is reported,
    not a fault; `layout_faults` leaves the notes out."""
    results = Path(results).resolve()
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (apt-get install chromium, or set KEYBIAS_CHROMIUM)")
    pages = pages or site_pages(results)
    urls = [(results / p).as_uri() for p in pages]
    with tempfile.TemporaryDirectory(prefix="keybias-layout-") as scratch:
        wrapper = Path(scratch) / "layout.html"
        wrapper.write_text(
            '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
            f'<iframe id="f" style="width:{width}px;height:900px;border:0"></iframe><pre id="out"></pre>'
            f"<script>{_LAYOUT_SCRIPT % {'pages': json.dumps(urls), 'width': width, 'max_line': MAX_LINE_CHARS}}"
            "</script></body></html>")
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   "--allow-file-access-from-files", f"--user-data-dir={Path(scratch) / 'profile'}",
                   f"--virtual-time-budget={budget_ms}", f"--window-size={max(width + 40, 600)},1000",
                   "--hide-scrollbars", "--dump-dom", wrapper.as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    match = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.DOTALL)
    if done.returncode != 0 or not match or not match.group(1).strip():
        raise RuntimeError(f"the layout check did not finish ({done.returncode}): {done.stderr[-1500:]}")

    found = json.loads(_html.unescape(match.group(1)))
    by_url = dict(zip(urls, pages, strict=True))
    out = {by_url.get(r["page"], r["page"]): r["problems"] for r in found}
    for page in pages:
        out.setdefault(page, ["never measured"])
    return out


def layout_faults(found: dict[str, list[str]]) -> dict[str, list[str]]:
    """`layout_problems` without its notes."""
    return {page: [p for p in problems if not p.startswith("note:")] for page, problems in found.items()}


def site_pages(results: Path) -> list[str]:
    results = Path(results)
    pages = [p for p in ("index.html", "files.html") if (results / p).is_file()]
    return pages + [f"notebooks/{p.name}" for p in sorted((results / "notebooks").glob("*.html"))]


def local_link_problems(results: Path, root: Path | None = None) -> list[str]:
    """Every local `href`/`src` of every page of the site that does not resolve: a file that does
    not exist, or a `#fragment` with no element of that id in its page. Links out of the results
    folder (`../paper/main.pdf`, `../../src/...`) are checked in `root` (the repository holding
    results/), and skipped when there is none. A `#page=N` fragment of a PDF is not an id."""


    results = Path(results).resolve()
    ids: dict[Path, set[str]] = {}

    def ids_of(path: Path) -> set[str]:
        if path not in ids:
            soup = BeautifulSoup(path.read_text(errors="replace"), features="html.parser")
            ids[path] = {t["id"] for t in soup.find_all(id=True)} | {t["name"] for t in soup.find_all("a", attrs={"name": True})}
        return ids[path]

    problems = []
    for rel in site_pages(results):
        page = results / rel
        soup = BeautifulSoup(page.read_text(errors="replace"), features="html.parser")
        for node in soup.find_all(["a", "img", "link", "script", "iframe", "source"]):
            value = node.get("href") or node.get("src")
            if not value or re.match(r"^(?:[a-z][a-z0-9+.-]*:|//)", value, re.IGNORECASE):
                continue  # another host, data:, mailto:, javascript:
            target, _, fragment = value.partition("#")
            path = (page.parent / _unquote(target)).resolve() if target else page
            try:
                path.relative_to(results)
            except ValueError:
                if root is None:
                    continue
                try:
                    path = Path(root).resolve() / path.relative_to(results.parent)
                except ValueError:
                    problems.append(f"{rel}: {value} leaves the repository")
                    continue
            if not path.exists():
                problems.append(f"{rel}: {value} (no such file)")
            elif fragment and path.suffix == ".html" and not fragment.startswith(":~:") and fragment not in ids_of(path):
                problems.append(f"{rel}: {value} (no element #{fragment})")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0] if argv else "results/notebooks")
    shots = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="keybias-shots-"))
    if find_chromium() is None:
        print("no Chromium found (apt-get install chromium); nothing checked", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = check_folder(folder, shots)
    if (folder.parent / "index.html").is_file():
        results["../index.html"] = check_entry_page(folder.parent, shots / "index.png")
    if (folder.parent / "index.html").is_file():
        for width in LAYOUT_WIDTHS:
            for page, problems in layout_faults(layout_problems(folder.parent, width)).items():
                if problems:
                    results.setdefault(f"{page} at {width} px", []).extend(problems)
        links = local_link_problems(folder.parent, folder.parent.parent)
        if links:
            results["local links"] = links
    for name, problems in results.items():
        print(f"{name}: " + ("ok" if not problems else "FAIL: " + "; ".join(problems)))
    print(f"{len(results)} pages in {time.perf_counter() - t0:.1f} s; screenshots in {shots}")
    return 1 if not results or any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
