"""The report's thermal and power sections: throughput against temperature and hour of day, throttled slow
hosts, and the job power curve's largest swings next to the simulator's model; as JSON, text and HTML."""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from typing import Any

from trainguard.core.events import Event
from trainguard.telemetry.power import power_report
from trainguard.telemetry.thermal import slow_spans, thermal_report

log = logging.getLogger(__name__)


def sections(records: Sequence[Event], root: Any = None) -> dict[str, Any]:
    """``{"thermal": ..., "power": ...}`` of a run's records (docs/goodput.md); ``root``: the run directory, for
    flight-recorder probes when the steps have no phases."""
    found: Sequence[Any] = ()
    try:
        from trainguard.stragglers import analyze, read_arrivals

        found = analyze(records, read_arrivals(root) if root is not None else None).stragglers
    except Exception as exc:  # the sections must never cost the rest of the report
        log.warning("straggler analysis for the thermal section skipped: %s", exc)
    return {"thermal": thermal_report(records, slow_spans(found)).to_json(), "power": power_report(records).to_json()}


def run_sections(run_dir: Any) -> dict[str, Any]:
    """`sections` of a run directory (or of a run already read by `trainguard.accounting.stepfold.fold_run`),
    over the same plausible records the goodput report accounts."""
    from trainguard.accounting.goodput import judge_records
    from trainguard.accounting.stepfold import FoldedRun, fold_run

    folded = run_dir if isinstance(run_dir, FoldedRun) else fold_run(run_dir)
    kept, _ = judge_records(folded.items)
    return sections([item.record for item in kept], folded.root)


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def _w(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1e6:.2f} MW" if abs(x) >= 1e6 else f"{x / 1e3:.1f} kW" if abs(x) >= 1e4 else f"{x:.0f} W"


def render_text(doc: dict[str, Any]) -> list[str]:
    """Lines for the terminal report (empty when the run has no telemetry and no power model)."""
    th, pw = doc["thermal"], doc["power"]
    lines: list[str] = []
    if th["samples"]:
        lines += ["", f"thermal ({th['samples']} telemetry samples from {len(th['hosts'])} host(s))",
                  f"  throughput vs temperature r={_r(th['throughput_vs_temperature'])}, "
                  f"vs clock r={_r(th['throughput_vs_clock'])} ({len(th['bins'])} bins of {th['bin_seconds']:.0f} s)"]
        hours = th["by_hour_utc"]
        if hours:
            cells = [f"{h}h {v['steps_per_second']:.3g}/s" + (f" {v['temperature_c']:.0f}°C"
                                                                if v["temperature_c"] is not None else "")
                     for h, v in hours.items()]
            swing = th["diurnal_swing"]
            lines.append("  by hour (UTC): " + ", ".join(cells[:24])
                         + (f"; swing {swing:.1%}" if swing is not None else ""))
        for s in th["slow_hosts"]:
            lines.append(f"  slow host {s['host']} (ranks {','.join(map(str, s['ranks']))}): {s['cause']}")
        slow = {s["host"] for s in th["slow_hosts"]}
        for f in th["throttled_hosts"]:
            if f["host"] not in slow:
                lines.append(f"  host {f['host']}: clock throttling ({', '.join(f['reasons'])}) over the run")
    if pw["series"]:  # without a single device reading (a CPU-only job) the model alone is no finding
        lines += ["", f"power ({pw['devices']} device(s) with readings)"]
        if pw["series"]:
            lines.append(f"  job draw mean {_w(pw['mean_watts'])}, peak {_w(pw['peak_watts'])}")
        for sw in pw["largest_swings"]:
            lines.append(f"  swing {_w(sw['delta_watts'])} ({_w(sw['before_watts'])} -> {_w(sw['after_watts'])}): "
                         f"{sw['cause']} ({sw['detail']})")
        m = pw["model"]
        if m:
            sw = m["swings_watts"]
            lines.append(f"  simulator model for {m['gpus']} GPUs ({m['basis']}): computing {_w(m['computing_watts'])},"
                         f" idle {_w(m['idle_watts'])}; swings: failure {_w(sw['failure_or_stop'])}, checkpoint "
                         f"{_w(sw['checkpoint_stall'])}")
    return lines


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained ``<section>`` with the same content as `render_text` (every value escaped)."""
    lines = render_text(doc)
    if not lines:
        return ""
    body = html.escape("\n".join(line for line in lines if line is not None).strip("\n"))
    return ('<section id="thermal-power-section"><h2>Thermal and power</h2>'
            f'<pre class="thermal-power">{body}</pre></section>')
