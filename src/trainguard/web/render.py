"""Templates and assets of the dashboard and the HTML report: one Jinja environment, plotly.js from its package.

Pages carry their data as JSON in a ``<script type="application/json">`` block and draw it with the
same script (static/trainguard.js), so the dashboard and ``report --html`` show the same plots. The HTML
report inlines plotly.js, that script and the style sheet, so it opens without a network, and carries its
own Content-Security-Policy (`report_csp`): a file opened from disk has no server to send one, and nothing
in it may reach the network even if something tried.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
from importlib import resources
from pathlib import Path
from typing import Any

from trainguard.core.eventlog import finite_json
from trainguard.errors import UsageError


def require(*modules: str, what: str) -> None:
    """`UsageError` (exit 2) naming the missing modules of the ``web`` extra, before anything else happens."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{what} needs the web extra (missing: {', '.join(missing)}): "
                         "pip install 'trainguard[web]'")


def dumps(obj: Any, **kw: Any) -> str:
    """JSON that browsers parse: NaN and infinities (not JSON) become null."""
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"), **kw)
    except ValueError:
        return json.dumps(finite_json(obj), allow_nan=False, separators=(",", ":"), **kw)


def static_dir() -> Path:
    return Path(str(resources.files("trainguard.web") / "static"))


def plotly_js_path() -> Path:
    """plotly.min.js as shipped in the plotly Python package (never fetched from a CDN)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def plotly_version() -> str:
    import plotly

    return str(plotly.__version__)


@functools.cache
def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainguard.web", "templates"),
        autoescape=jinja2.select_autoescape(["html"], default_for_string=True),
        undefined=jinja2.StrictUndefined,
    )
    # |tojson escapes <, >, & and ' so the data cannot close its <script> block.
    env.policies["json.dumps_function"] = dumps
    return env


def inline_script(text: str) -> Any:
    """Script source safe to place inside ``<script>...</script>`` (a ``</script`` in it would end the block)."""
    from markupsafe import Markup

    return Markup(text.replace("</script", "<\\/script").replace("<!--", "<\\!--"))


@functools.cache
def _asset(name: str) -> str:
    return (static_dir() / name).read_text(encoding="utf-8")


@functools.cache
def _inline_scripts() -> tuple[Any, Any, str]:
    """plotly.js and the page script as placed inside the HTML report, and the policy that lets only them run."""
    scripts = (inline_script(plotly_js_path().read_text(encoding="utf-8")), inline_script(_asset("trainguard.js")))
    return scripts[0], scripts[1], report_csp(scripts)


def _hash_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def report_csp(scripts: tuple[str, ...]) -> str:
    """The HTML report's policy: nothing from the network, of any kind; only these inline scripts run (by hash,
    so a script element that run data smuggled in would not), inline styles (plotly sets them), data: and
    blob: images (plotly's icons and image export)."""
    return ("default-src 'none'; script-src " + " ".join(_hash_source(s) for s in scripts)
            + "; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; base-uri 'none'; form-action 'none'")


def render(template: str, **context: Any) -> str:
    """A page. With ``inline=True`` the scripts and styles are inside it (the HTML report)."""
    inline = bool(context.pop("inline", False))
    assets: dict[str, Any] = {"inline": inline}
    if inline:
        from markupsafe import Markup

        plotly_script, app_script, csp = _inline_scripts()
        # The policy is ours (hashes and fixed words, no quote mark): written as is, to stay readable in the file.
        assets |= {"css_text": _asset("trainguard.css"), "plotly_script": plotly_script, "app_script": app_script,
                   "report_csp": Markup(csp)}
    else:
        assets |= {"plotly_url": f"/static/plotly-{plotly_version()}.min.js"}
    return str(environment().get_template(template).render(**assets, **context))
