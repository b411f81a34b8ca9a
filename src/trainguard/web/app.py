"""The dashboard's ASGI application (Starlette): pages, the JSON API and evidence files, all read-only.

Every route is a GET. The token is required on every request (header, cookie or ``?token=``;
``trainguard serve`` always sets one, on loopback too); a loopback-only dashboard also refuses Host
headers other than loopback names (DNS rebinding).
Pages carry security headers that keep run data (log lines, host names) from ever running as code.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import logging
import mimetypes
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, quote, urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.accounting.goodput import GoodputReport, compute_goodput
from trainguard.report.drains import drain_section
from trainguard.report.thermal_power import run_sections
from trainguard.report.view import build_view, open_evidence
from trainguard.web import render as pages
from trainguard.web.catalog import CACHED_SUMMARIES, Cache, Catalog, RunEntry, etag
from trainguard.web.simview import simulation_view

log = logging.getLogger(__name__)

COOKIE = "trainguard_token"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
            "connect-src 'self'; font-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
FILE_CSP = "default-src 'none'; sandbox"
_TEXT_SUFFIXES = {".log", ".txt", ".json", ".jsonl", ".out", ".err", ".py", ".toml", ".csv", ".md"}


class JSON(Response):
    """JSON with NaN written as null (a browser's JSON.parse refuses NaN)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return pages.dumps(content).encode("utf-8")


def _cookie_value(token: str) -> str:
    """What the cookie holds: derived from the token, so a copied cookie does not reveal it."""
    return hmac.new(token.encode(), b"trainguard dashboard session", hashlib.sha256).hexdigest()


class Guard:
    """Token check (401 without it) and security headers on every response."""

    def __init__(self, app: ASGIApp, token: str | None, cookie_name: str = COOKIE) -> None:
        self.app = app
        self.token = token
        self.cookie = _cookie_value(token) if token else ""
        self.cookie_name = cookie_name

    def _authorized(self, request: Request) -> tuple[bool, bool]:
        """(allowed, came with ?token=)."""
        assert self.token is not None
        given = request.headers.get("authorization", "")
        if given.lower().startswith("bearer ") and hmac.compare_digest(given[7:].strip().encode(), self.token.encode()):
            return True, False
        cookie = request.cookies.get(self.cookie_name, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.cookie.encode()):
            return True, False
        query = request.query_params.get("token", "")
        if query and hmac.compare_digest(query.encode(), self.token.encode()):
            return True, True
        return False, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                extra = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                         (b"x-frame-options", b"DENY"), (b"content-security-policy", PAGE_CSP.encode())]
                headers += [(k, v) for k, v in extra if k not in names]
                message = {**message, "headers": headers}
            await send(message)

        if self.token:
            request = Request(scope)
            ok, via_query = self._authorized(request)
            if not ok:
                response: Response = PlainTextResponse(
                    "401 Unauthorized: this dashboard needs its token: open it with ?token=TOKEN once, "
                    "or send 'Authorization: Bearer TOKEN'\n", status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="trainguard"'})
                await response(scope, receive, send_with_headers)
                return
            if via_query and not request.url.path.startswith("/api/"):
                # Trade the token in the address bar for a cookie, so it does not stay in history or get bookmarked.
                rest = [(k, v) for k, v in parse_qsl(request.url.query, keep_blank_values=True) if k != "token"]
                target = request.url.path + ("?" + urlencode(rest) if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(self.cookie_name, self.cookie, httponly=True, samesite="strict", path="/")
                await response(scope, receive, send_with_headers)
                return
        await self.app(scope, receive, send_with_headers)


class Dashboard:
    """The routes, over a `Catalog` of runs and a `Cache` of their reports and views."""

    def __init__(self, catalog: Catalog, poll_seconds: float = 5.0) -> None:
        self.catalog = catalog
        self.cache = Cache()
        self.summaries = Cache(size=CACHED_SUMMARIES)
        """The run list's rows, kept apart from the reports so that listing many runs evicts nothing."""
        self.poll_seconds = poll_seconds

    # --- data ---------------------------------------------------------------------------------------

    def _report(self, entry: RunEntry) -> tuple[GoodputReport | Exception, tuple[Any, ...]]:
        return self.cache.get("report", entry.path, compute_goodput)

    def _view(self, entry: RunEntry) -> tuple[dict[str, Any] | Exception, tuple[Any, ...]]:
        def compute(path: Path) -> dict[str, Any]:
            report, _ = self._report(entry)
            if isinstance(report, Exception):
                raise report
            return build_view(path, report)

        return self.cache.get("view", entry.path, compute)

    def _document(self, entry: RunEntry) -> tuple[dict[str, Any] | Exception, tuple[Any, ...]]:
        """The ``trainguard report --json`` document: the goodput report plus the thermal and power sections and
        the drains, composed as ``cli.report`` composes it."""
        def compute(path: Path) -> dict[str, Any]:
            report, _ = self._report(entry)
            if isinstance(report, Exception):
                raise report
            return {**report.to_json(), **run_sections(path), **drain_section(path)}

        return self.cache.get("document", entry.path, compute)

    def _summary(self, entry: RunEntry) -> dict[str, Any]:
        def compute(path: Path) -> dict[str, Any]:
            return self._summary_row(entry)

        row, _ = self.summaries.get("summary", entry.path, compute)
        if isinstance(row, Exception):  # the run itself could not be summarized (too large, unreadable)
            return self._summary_row(entry, row)
        return dict(row)

    def _summary_row(self, entry: RunEntry, failed: Exception | None = None) -> dict[str, Any]:
        report = failed if failed is not None else self._report(entry)[0]
        row: dict[str, Any] = {"id": entry.id, "name": entry.path.name, "path": str(entry.path),
                               "source": entry.source}
        if isinstance(report, Exception):
            return row | {"run_id": None, "status": None, "synthetic": False, "ettr": None, "wall_seconds": None,
                          "productive_seconds": None, "interruptions": None, "attempts": None,
                          "completed_steps": None, "target_steps": None, "error": str(report)}
        return row | {"run_id": report.run_id, "status": report.status, "synthetic": report.synthetic,
                      "ettr": report.ettr, "wall_seconds": report.wall_seconds,
                      "productive_seconds": report.productive_seconds, "interruptions": len(report.interruptions),
                      "attempts": report.attempts, "completed_steps": report.completed_steps,
                      "target_steps": report.target_steps, "error": None}

    def runs_json(self) -> dict[str, Any]:
        return {"runs": [self._summary(e) for e in self.catalog.entries()]}

    def _entry(self, request: Request) -> RunEntry | None:
        return self.catalog.get(request.path_params["run_id"])

    # --- routes -------------------------------------------------------------------------------------

    def home(self, request: Request) -> Response:
        config = {"page": "runs", "api": "/api/runs", "poll_seconds": self.poll_seconds, "run_url_base": "/runs/"}
        return HTMLResponse(pages.render("runs.html", config=config, data=self.runs_json(), plotly=False,
                                         home_url="/"))

    def api_runs(self, request: Request) -> Response:
        return JSON(self.runs_json())

    def run_page(self, request: Request) -> Response:
        entry = self._entry(request)
        if entry is None:
            return _not_found("run")
        view, sig = self._view(entry)
        rid = quote(entry.id)
        config = {"page": "run", "api": f"/api/runs/{rid}/view", "poll_seconds": self.poll_seconds,
                  "files_base": f"/runs/{rid}/files/", "sim_url": f"/runs/{rid}/simulation",
                  "etag": etag(sig, "view")}
        data = {"error": f"{entry.path}: {view}"} if isinstance(view, Exception) else view
        return HTMLResponse(pages.render("run.html", config=config, data=data, plotly=True, home_url="/",
                                         title=entry.id))

    def api_run(self, request: Request) -> Response:
        """Exactly the ``trainguard report --json`` document."""
        return self._json(request, "report", lambda document: document)

    def api_view(self, request: Request) -> Response:
        return self._json(request, "view", lambda v: v)

    def _json(self, request: Request, kind: str, shape: Any) -> Response:
        entry = self._entry(request)
        if entry is None:
            return JSON({"error": "no such run"}, status_code=404)
        value, sig = self._document(entry) if kind == "report" else self._view(entry)
        if isinstance(value, Exception):
            return JSON({"error": f"{entry.path}: {value}"}, status_code=422)
        tag = etag(sig, kind)
        if request.headers.get("if-none-match") == tag:
            return Response(status_code=304, headers={"ETag": tag})
        return JSON(shape(value), headers={"ETag": tag, "Cache-Control": "no-cache"})

    def _simulation(self, entry: RunEntry) -> dict[str, Any]:
        report, _ = self._report(entry)
        ettr = None if isinstance(report, Exception) else report.ettr
        value, _ = self.cache.get("simulation", entry.path, lambda p: simulation_view(p, ettr))
        return {"available": False, "reason": str(value)} if isinstance(value, Exception) else value

    def simulation_page(self, request: Request) -> Response:
        entry = self._entry(request)
        if entry is None:
            return _not_found("run")
        rid = quote(entry.id)
        config = {"page": "simulation", "api": None, "poll_seconds": 0}
        return HTMLResponse(pages.render("simulation.html", config=config, data=self._simulation(entry),
                                         plotly=True, home_url="/", run_url=f"/runs/{rid}", title=entry.id))

    def api_simulation(self, request: Request) -> Response:
        entry = self._entry(request)
        if entry is None:
            return JSON({"error": "no such run"}, status_code=404)
        return JSON(self._simulation(entry))

    def files(self, request: Request) -> Response:
        """Evidence under the run's diagnostics/ and logs/, as plain text or a download; never as a page.

        The path is opened component by component below the run directory without following a symlink
        anywhere (`open_evidence`): a linked ``logs/`` or a linked file deeper down is 404, and what is
        served is the very file that was checked.
        """
        entry = self._entry(request)
        if entry is None:
            return _not_found("run")
        rel_text = request.path_params["path"]
        try:
            fd = open_evidence(entry.path, rel_text)
        except (OSError, ValueError):
            return _not_found("file")
        rel = PurePosixPath(rel_text)
        rid = quote(entry.id)
        try:
            info = os.fstat(fd)
            is_dir = stat.S_ISDIR(info.st_mode)
            children = _servable_children(fd) if is_dir else []
            text = not is_dir and _looks_like_text(rel.name, fd)
        except OSError:
            os.close(fd)
            return _not_found("file")
        if is_dir:
            os.close(fd)
            listing = [(name, f"/runs/{rid}/files/{quote((rel / name).as_posix())}", sub) for name, sub in children]
            return HTMLResponse(pages.render("files.html", config={"page": "files"}, data={}, plotly=False,
                                             home_url="/", run_url=f"/runs/{rid}", run_title=entry.id,
                                             title=rel.as_posix(), listing=listing))
        headers = {"Content-Security-Policy": FILE_CSP, "Content-Length": str(info.st_size),
                   "Content-Disposition": "inline" if text else f"attachment; filename=\"{quote(rel.name)}\""}
        # A file object now (not the bare descriptor): if the response is dropped unsent, collecting it closes the file.
        body = _chunks(os.fdopen(fd, "rb"), info.st_size)
        return StreamingResponse(body, headers=headers,
                                 media_type="text/plain; charset=utf-8" if text else "application/octet-stream")


def _servable_children(dir_fd: int) -> list[tuple[str, bool]]:
    """(name, is a folder) of the entries of a folder that the file route would serve: no symlinks, no FIFOs."""
    out = []
    for name in sorted(os.listdir(dir_fd)):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            out.append((name, stat.S_ISDIR(mode)))
    return out


def _chunks(fh: BinaryIO, length: int, size: int = 1 << 16) -> Iterator[bytes]:
    """The first ``length`` bytes of ``fh``, then it is closed. A log that grows while it is sent is cut at the
    size it had when opened, the ``Content-Length`` already promised."""
    with fh:
        while length > 0 and (chunk := fh.read(min(size, length))):
            length -= len(chunk)
            yield chunk


def _looks_like_text(name: str, fd: int) -> bool:
    suffix = PurePosixPath(name).suffix
    if suffix in _TEXT_SUFFIXES:
        return True
    guess, _ = mimetypes.guess_type(name)
    if guess and not guess.startswith("text/"):
        return False
    return b"\0" not in os.pread(fd, 4096, 0)


def _not_found(what: str) -> Response:
    return PlainTextResponse(f"404: no such {what}\n", status_code=404)


def create_app(catalog: Catalog, *, token: str | None = None, loopback_only: bool = True,
               poll_seconds: float = 5.0, extra_hosts: Sequence[str] = (), cookie_name: str = COOKIE) -> Starlette:
    """The dashboard over ``catalog``. ``token``: required on every request (None only for tests and embedding:
    the CLI always sets one). ``loopback_only``: refuse Host headers other than loopback names. ``cookie_name``:
    per dashboard (the CLI adds the port), since browsers share cookies between the ports of one host."""
    d = Dashboard(catalog, poll_seconds)
    plotly_path = pages.plotly_js_path()
    plotly_gz: list[bytes] = []
    plotly_lock = threading.Lock()

    def plotly_js(request: Request) -> Response:
        """plotly.js (4-5 MB), compressed once rather than on every request; browsers keep it for a year."""
        headers = {"Cache-Control": "public, max-age=31536000, immutable", "Vary": "Accept-Encoding"}
        if "gzip" not in request.headers.get("accept-encoding", ""):
            return FileResponse(plotly_path, media_type="text/javascript", headers=headers)
        with plotly_lock:
            if not plotly_gz:
                plotly_gz.append(gzip.compress(plotly_path.read_bytes(), compresslevel=6))
        return Response(plotly_gz[0], media_type="text/javascript", headers=headers | {"Content-Encoding": "gzip"})

    routes = [
        Route("/", d.home),
        Route("/api/runs", d.api_runs),
        Route("/api/runs/{run_id}", d.api_run),
        Route("/api/runs/{run_id}/view", d.api_view),
        Route("/api/runs/{run_id}/simulation", d.api_simulation),
        Route("/runs/{run_id}", d.run_page),
        Route("/runs/{run_id}/simulation", d.simulation_page),
        Route("/runs/{run_id}/files/{path:path}", d.files),
        Route(f"/static/plotly-{pages.plotly_version()}.min.js", plotly_js),
        Mount("/static", StaticFiles(directory=pages.static_dir()), name="static"),
    ]
    middleware = [Middleware(Guard, token=token, cookie_name=cookie_name),
                  Middleware(GZipMiddleware, minimum_size=2048, compresslevel=5)]
    if loopback_only:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=[*LOOPBACK_HOSTS, *extra_hosts]))
    return Starlette(routes=routes, middleware=middleware)
