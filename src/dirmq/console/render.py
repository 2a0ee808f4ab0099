"""Pages from Jinja2 templates (autoescape on: every value is escaped unless a template says
otherwise, and none does), the console's static files, and the headers every answer carries.

Assets are served from `/ui/static/<version>/...`, where the version changes with their
content, so they can be cached for a year. No page has an inline script or style (a test
reads the templates): the Content-Security-Policy allows only this origin's files.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any
from urllib.parse import quote

import jinja2

from dirmq import __version__
from dirmq.server.contract import Response

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)
HTML = "text/html; charset=utf-8"
_STATIC_PATH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
SERVED = frozenset({"js", "css", "svg", "png"})  # what a page loads; not READMEs, licences
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def queue_url(name: str, *rest: str) -> str:
    """The console URL of queue `name` (its name one path segment: `/` encoded)."""
    return "/".join(["/ui/q", quote(name, safe=""), *rest])


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def when(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def relative(epoch_s: float | None) -> str:
    """`epoch_s` from now: "in 4 s", "12 s ago" (the page says when it was drawn)."""
    if epoch_s is None:
        return "-"
    delta = epoch_s - time.time()
    return f"in {age(delta)}" if delta >= 0 else f"{age(-delta)} ago"


def number(value: float) -> str:
    """A rate or count as people write it: 2.5, 10, not 10.0."""
    return f"{value:g}"


def size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def pretty(value: object) -> str:
    """JSON for people (the template escapes it, as any text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


class Renderer:
    """The templates and static files of the console, loaded once per worker."""

    def __init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("dirmq.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters.update(
            age=age, when=when, relative=relative, number=number, size=size, pretty=pretty
        )
        self.env.globals.update(queue_url=queue_url, version=__version__)
        self.assets = _load_assets(resources.files("dirmq.console").joinpath("static"))
        digest = hashlib.sha256()
        for name in sorted(self.assets):
            digest.update(name.encode() + b"\0" + self.assets[name].body)
        self.static_version = f"{__version__}-{digest.hexdigest()[:10]}"
        self.env.globals["static"] = f"/ui/static/{self.static_version}"
        self.env.globals["has_htmx"] = "vendor/htmx.min.js" in self.assets
        self.env.globals["has_uplot"] = "vendor/uPlot.iife.min.js" in self.assets
        self.env.globals["has_api"] = False  # the samples API, once mounted (app.py)

    def page(self, template: str, status: int = 200, /, **context: Any) -> Response:
        body = self.env.get_template(template).render(**context).encode()
        return Response(status, body, [("Content-Type", HTML), ("Cache-Control", "no-store")])

    def asset(self, version: str, path: str) -> Response:
        found = self.assets.get(path) if _STATIC_PATH.fullmatch(path) else None
        if found is None or version != self.static_version:
            return Response(404, b"no such file\n", [("Content-Type", "text/plain")])
        return Response(
            200,
            found.body,
            [
                ("Content-Type", found.content_type),
                ("Cache-Control", "public, max-age=31536000, immutable"),
            ],
        )


def _load_assets(top: Traversable, prefix: str = "") -> dict[str, Asset]:
    found: dict[str, Asset] = {}
    if not top.is_dir():
        return found
    for item in top.iterdir():
        name = f"{prefix}{item.name}"
        if item.is_dir():
            found.update(_load_assets(item, f"{name}/"))
        elif item.name.rsplit(".", 1)[-1] in SERVED:
            suffix = "." + item.name.rsplit(".", 1)[-1] if "." in item.name else ""
            kind = _TYPES.get(suffix) or mimetypes.guess_type(item.name)[0]
            found[name] = Asset(item.read_bytes(), kind or "application/octet-stream")
    return found


def now_s() -> float:
    return time.time()
