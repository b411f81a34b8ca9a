"""The goodput report as one self-contained HTML file: the dashboard's run page with everything inlined.

plotly.js, the page script and the style sheet are inside the file, so it opens without a network and
without trainguard; evidence links point at the run directory relative to where the file is written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from urllib.parse import quote

from trainguard.accounting.goodput import GoodputReport
from trainguard.core.rundir import RunDir
from trainguard.errors import StorageError, UsageError
from trainguard.report.thermal_power import render_html as render_thermal_power
from trainguard.report.view import build_view


def render_html(run_dir: str | os.PathLike[str], report: GoodputReport | None = None, *,
                out_dir: str | os.PathLike[str] | None = None) -> str:
    """The HTML text; evidence links are relative to ``out_dir`` (default: the current folder)."""
    from trainguard.web.render import render, require

    require("jinja2", "plotly", what="report --html")
    rd = RunDir(run_dir)
    view = build_view(rd, report)
    base = os.path.relpath(rd.root.resolve(), Path(out_dir or ".").resolve())
    config = {"page": "run", "api": None, "poll_seconds": 0, "sim_url": None,
              "files_base": quote(Path(base).as_posix()) + "/"}
    title = view["report"]["run_id"] or rd.run_id
    page = render("run.html", inline=True, config=config, data=view, home_url="#", title=title, plotly=True)
    # The thermal and power findings as a static section (text the page script need not draw).
    extra = render_thermal_power(view["thermal_power"])
    at = page.rfind("</main>")
    return page[:at] + extra + page[at:] if extra and at >= 0 else page


def write_html(run_dir: str | os.PathLike[str], out_file: str | os.PathLike[str],
               report: GoodputReport | None = None) -> Path:
    """Write the report to ``out_file`` atomically (a reader never sees half a file); `StorageError` if it cannot."""
    out = Path(out_file)
    if out.is_dir():
        raise UsageError(f"--html {out}: is a directory; give a file name")
    text = render_html(run_dir, report, out_dir=out.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    except OSError as exc:
        raise StorageError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def _umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
