"""The console's vendored front-end files: each one as its manifest says, and shipped.

`src/dirmq/console/static/vendor/manifest.json` lists every vendored file with its package,
version, licence and sha256; these tests fail on a file changed, missing or not listed, and on
package-data globs that would leave a console file out of the sdist or the wheel built from it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from .support.browser import Found, PageLog, static_site
from .support.servers import REPO

CONSOLE = REPO / "src" / "dirmq" / "console"
VENDOR = CONSOLE / "static" / "vendor"
# The licences the vendored packages carry (SPDX ids); another one is a decision to make, not a
# line to add here silently.
LICENSES = {"0BSD", "MIT"}
FIELDS = {
    "file",
    "package",
    "version",
    "license",
    "license_file",
    "source",
    "integrity",
    "path_in_tarball",
    "sha256",
}


def manifest() -> list[dict[str, Any]]:
    """The manifest's entries, read as the console reads its files: as package resources."""
    text = (resources.files("dirmq") / "console/static/vendor/manifest.json").read_text("utf-8")
    entries: list[dict[str, Any]] = json.loads(text)["files"]
    return entries


def test_every_vendored_file_matches_its_manifest_entry() -> None:
    entries = manifest()
    for entry in entries:
        assert set(entry) == FIELDS, f"{entry.get('file')}: fields {sorted(entry)}"
        data = (resources.files("dirmq") / f"console/static/vendor/{entry['file']}").read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], (
            f"vendor/{entry['file']} differs from the file the manifest records"
        )
        assert entry["source"] == f"pkg:npm/{entry['package']}@{entry['version']}"
        assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", entry["integrity"]), entry["integrity"]
        assert entry["path_in_tarball"].startswith("package/")
        assert entry["license"] in LICENSES, f"{entry['file']}: licence {entry['license']}"


def test_nothing_in_vendor_is_unlisted_or_missing() -> None:
    listed = [entry["file"] for entry in manifest()]
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"
    present = {p.name for p in VENDOR.iterdir()} - {"manifest.json"}
    assert not [p for p in VENDOR.iterdir() if p.is_dir()], "vendor/ has no subdirectories"
    assert present == set(listed), (
        f"unlisted: {sorted(present - set(listed))}, missing: {sorted(set(listed) - present)}"
    )
    assert {"htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css"} <= present


def test_each_package_ships_its_licence_and_one_version() -> None:
    by_package: dict[str, list[dict[str, Any]]] = {}
    for entry in manifest():
        by_package.setdefault(entry["package"], []).append(entry)
    assert set(by_package) == {"htmx.org", "uplot"}
    for package, entries in by_package.items():
        assert len({(e["version"], e["license"], e["license_file"]) for e in entries}) == 1, package
        licence = entries[0]["license_file"]
        assert licence in {e["file"] for e in entries}, f"{package}: {licence} is not listed"
        text = (VENDOR / licence).read_text("utf-8")
        expected = {"MIT": "Permission is hereby granted", "0BSD": "Zero-Clause BSD"}
        assert expected[entries[0]["license"]] in text, f"{licence} is not the {package} licence"
    versions = {package: entries[0]["version"] for package, entries in by_package.items()}
    assert versions["htmx.org"].startswith("2."), versions  # htmx 2, configured for a strict CSP
    assert versions["uplot"].startswith("1.6."), versions


def test_the_vendored_scripts_are_the_builds_the_console_loads() -> None:
    """The browser globals the console's module uses, and no source map a browser would fetch."""
    htmx = (VENDOR / "htmx.min.js").read_text("utf-8")
    uplot = (VENDOR / "uPlot.iife.min.js").read_text("utf-8")
    assert htmx.startswith("var htmx="), "htmx.min.js: not the browser build (global htmx)"
    assert "var uPlot=" in uplot[:200], "uPlot.iife.min.js: not the IIFE build (global uPlot)"
    for name in ("htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css"):
        assert "sourceMappingURL" not in (VENDOR / name).read_text("utf-8"), name


def console_files() -> set[str]:
    """Every file under console/static and console/templates, as named in the wheel."""
    found = set()
    for top in ("static", "templates"):
        for path in (CONSOLE / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(path.relative_to(CONSOLE.parent.parent).as_posix())
    return found


def test_sdist_and_wheel_ship_the_console_files(tmp_path: Path) -> None:
    """`python -m build` on a copy of the project (so nothing is written in the checkout): the
    sdist, then the wheel built from that sdist, each hold every console file."""
    copy = tmp_path / "project"
    copy.mkdir()
    shutil.copy(REPO / "pyproject.toml", copy)
    shutil.copy(REPO / "README.md", copy)
    shutil.copytree(
        REPO / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    out = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(copy)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert built.returncode == 0, f"python -m build failed:\n{built.stdout[-2000:]}{built.stderr}"
    expected = console_files()
    assert {"dirmq/console/static/vendor/htmx.min.js"} <= expected
    (sdist,) = out.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        in_sdist = {
            name.split("/src/", 1)[1] for name in archive.getnames() if "/src/dirmq/" in name
        }
    assert expected <= in_sdist, f"not in the sdist: {sorted(expected - in_sdist)}"
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    assert expected <= in_wheel, f"not in the wheel: {sorted(expected - in_wheel)}"
    for entry in manifest():  # byte for byte, as vendored
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"dirmq/console/static/vendor/{entry['file']}")
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]


def test_htmx_still_has_the_settings_a_strict_csp_needs() -> None:
    """static/README.md's settings keep eval and inline styles out; each must still exist."""
    text = (VENDOR / "htmx.min.js").read_text("utf-8")
    for setting in ("allowEval", "allowScriptTags", "selfRequestsOnly", "includeIndicatorStyles"):
        assert setting in text, f"htmx no longer has config.{setting}: revisit static/README.md"


def test_uplot_evaluates_no_code() -> None:
    text = (VENDOR / "uPlot.iife.min.js").read_text("utf-8")
    assert "eval(" not in text and "new Function" not in text, "uPlot now evaluates code"


# In a real browser, under the console's kind of policy: the vendored files work with the
# settings static/README.md prescribes, and htmx's defaults would not.
STRICT_CSP = "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
CSP_SETTINGS = b"""
htmx.config.allowEval = false;
htmx.config.includeIndicatorStyles = false;
htmx.config.allowScriptTags = false;
htmx.config.selfRequestsOnly = true;
htmx.config.historyCacheSize = 0;
"""


def html(head: str, body: str) -> bytes:
    return f"<!doctype html><html><head>{head}</head><body>{body}</body></html>".encode()


HTMX = '<script src="/static/vendor/htmx.min.js" defer></script>'
SITE: dict[str, tuple[str, bytes]] = {
    "/favicon.ico": ("image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg"/>'),
    "/settings.js": ("text/javascript", CSP_SETTINGS),
    "/fragment": (
        "text/html",
        b"<p id=swapped>swapped in</p><script>document.title='ran'</script>",
    ),
    "/htmx": (
        "text/html",
        html(
            f'<title>htmx</title>{HTMX}<script src="/settings.js" defer></script>',
            '<button id=go hx-get="/fragment" hx-target="#out">go</button><div id=out></div>'
            "<button id=on hx-on:click=\"document.title='evaluated'\">on</button>",
        ),
    ),
    "/htmx-defaults": ("text/html", html(f"<title>defaults</title>{HTMX}", "<div></div>")),
    "/chart.js": (
        "text/javascript",
        b"""
const xs = [...Array(60).keys()].map((i) => 1700000000 + i * 60);
const ys = xs.map((_, i) => 50 + 40 * Math.sin(i / 6));
new uPlot({width: 400, height: 200, series: [{}, {label: "ready", stroke: "#1f77b4", width: 2}]},
          [xs, ys], document.getElementById("chart"));
document.documentElement.dataset.drawn = "yes";
""",
    ),
    "/uplot": (
        "text/html",
        html(
            '<title>uplot</title><link rel="stylesheet" href="/static/vendor/uPlot.min.css">'
            '<script src="/static/vendor/uPlot.iife.min.js" defer></script>'
            '<script src="/chart.js" defer></script>',
            "<div id=chart></div>",
        ),
    ),
}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css"}


def strict_page(path: str) -> Found | None:
    """The test pages, and the vendored files from the installed package."""
    if path.startswith("/static/vendor/"):
        name = path.removeprefix("/static/vendor/")
        resource = resources.files("dirmq") / f"console/static/vendor/{name}"
        return CONTENT_TYPES.get(Path(name).suffix, "text/plain"), resource.read_bytes()
    return SITE.get(path)


@pytest.fixture(scope="module")
def strict_site() -> Iterator[str]:
    with static_site(strict_page, STRICT_CSP) as url:
        yield url


def test_htmx_with_the_readme_settings_swaps_under_a_strict_csp(
    strict_site: str, page: Page, page_log: PageLog
) -> None:
    page.goto(f"{strict_site}/htmx")
    page.wait_for_function("() => window.htmx && htmx.config.allowEval === false")
    page.click("#go")
    page.wait_for_selector("#swapped")
    assert page.text_content("#out") == "swapped in"
    assert page.title() == "htmx", "a swapped-in <script> ran"
    assert page.eval_on_selector_all("style", "styles => styles.length") == 0
    page_log.assert_clean()


def test_htmx_with_the_readme_settings_evaluates_no_attribute(
    strict_site: str, page: Page, page_log: PageLog
) -> None:
    page_log.expect_problems()  # htmx logs its refusal as an error
    page.goto(f"{strict_site}/htmx")
    # goto waits for `load`: htmx has read its settings and processed the page (DOMContentLoaded)
    page.click("#on")
    page.wait_for_function("() => true")  # one more round trip: the click's events have arrived
    assert page.title() == "htmx", "hx-on:click was evaluated"
    assert page_log.csp_violations() == []  # refused by htmx, not by the policy
    assert page_log.page_errors == []
    assert [e.split(" (")[0] for e in page_log.console_errors] == ["htmx:evalDisallowedError"]


def test_htmx_defaults_break_a_strict_csp(strict_site: str, page: Page, page_log: PageLog) -> None:
    """Why the settings are needed: by default htmx injects an inline <style>."""
    page_log.expect_problems()
    page.goto(f"{strict_site}/htmx-defaults")
    page.wait_for_function("() => window.htmx && htmx.config.includeIndicatorStyles === true")
    directives = {v["directive"] for v in page_log.csp_violations()}
    assert directives == {"style-src-elem"}, directives


def test_uplot_draws_under_a_strict_csp(strict_site: str, page: Page, page_log: PageLog) -> None:
    page.goto(f"{strict_site}/uplot")
    page.wait_for_function("() => document.documentElement.dataset.drawn === 'yes'")
    painted = page.evaluate(
        """() => {
        const canvas = document.querySelector("#chart canvas");
        const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
        let painted = 0;
        for (let i = 3; i < pixels.data.length; i += 4) if (pixels.data[i] > 0) painted++;
        return painted;
    }"""
    )
    assert painted > 500, f"the chart's canvas has {painted} painted pixels"
    page_log.assert_clean()
