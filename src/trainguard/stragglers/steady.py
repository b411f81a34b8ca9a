"""Stragglers slow from an attempt's first step: no onset to find, so each rank is judged against its peers over
the whole attempt (so far) instead of against its own history. Pure; docs/stragglers.md ("Slow from the start")."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from trainguard.stragglers.analysis import _MAD_TO_SIGMA, StepSample, Straggler, StragglerConfig, _median


def detect_steady(attempt: int, rows: Sequence[StepSample], lead: Sequence[Mapping[int, tuple[float, float]]],
                  hosts: Mapping[int, str], signal: str, cfg: StragglerConfig,
                  tail: Sequence[StepSample] = ()) -> list[Straggler]:
    """Ranks slower than their peers' median over all of ``rows`` (which must begin at the attempt's start).

    A rank is named when, over some prefix of at least ``steady_windows`` windows (the first such prefix gives
    ``detected_step``): its median lead is at least a ``steady_min_slowdown`` share of the step; its median share
    was late (``min_slowdown``) in the first window, in all but one of the first ``steady_windows`` windows (a
    scheduling burst on a busy host can drown one) and in ``late_fraction`` of the prefix's windows; and its median
    lead stands out of the step-to-step noise (``steady_noise_sigmas`` standard errors over the first
    ``steady_windows`` windows, ``steady_settled_sigmas`` once the prefix is longer). A rank that slows down later
    fails the first window and is left to the onset rule."""
    n = len(rows)
    w = cfg.window_steps
    if n < cfg.steady_windows * w:
        return []
    ranks = sorted(set().union(*(s.own for s in rows)))
    noise = _PrefixNoise(ranks, lead)
    out: list[Straggler] = []
    for r in ranks:
        if any(r not in lead[k] for k in range(n)):
            continue
        leads = [lead[k][r][0] for k in range(n)]
        shares = [leads[k] / rows[k].step_seconds if rows[k].step_seconds > 0 else 0.0 for k in range(n)]
        late_windows = [_median(shares[j:j + w]) > 1.0 - 1.0 / cfg.min_slowdown for j in range(0, n - w + 1, w)]
        named = _first_prefix(shares, leads, late_windows, noise, cfg)
        if named is None:
            continue
        # The stretch lasts until two windows in a row are not late (one may be noise), else to the last row.
        end = n - 1
        for j in range(cfg.steady_windows, len(late_windows) - 1):
            if not late_windows[j] and not late_windows[j + 1]:
                end = max(k for k in range((j - 1) * w, j * w) if shares[k] > 1.0 - 1.0 / cfg.min_slowdown)
                break
        out.append(_straggler(attempt, r, rows, leads, shares, named, end, w, cfg.min_slowdown, hosts, signal, tail))
    return out


class _PrefixNoise:
    """The pooled noise of the leads over the first ``m`` rows, for any ``m``: what `_pooled_sigma` gives over
    ``range(m)``, kept up incrementally (per rank a sorted list of successive differences) and only as far as asked.
    Each prefix is judged with its own noise, as the live watch judged it when it had only those rows: the whole
    run's noise would make a prefix pass that never passed live."""

    def __init__(self, ranks: Sequence[int], lead: Sequence[Mapping[int, tuple[float, float]]]) -> None:
        self._ranks = list(ranks)
        self._lead = lead
        self._diffs: dict[int, list[float]] = {r: [] for r in ranks}
        self._last: dict[int, float] = {}
        self._sigmas: list[float] = []  # [m - 1]: over the first m rows

    def sigma(self, m: int) -> float:
        while len(self._sigmas) < m:
            row = self._lead[len(self._sigmas)]
            for r in self._ranks:
                if r in row:
                    x = row[r][0]
                    if r in self._last:
                        bisect.insort(self._diffs[r], abs(x - self._last[r]))
                    self._last[r] = x
            # >= 2 differences is >= 3 values, as in _pooled_sigma
            per_rank = [_MAD_TO_SIGMA * _sorted_median(d) / math.sqrt(2) for d in self._diffs.values() if len(d) >= 2]
            self._sigmas.append(_median(per_rank))
        return self._sigmas[m - 1]


def _first_prefix(shares: Sequence[float], leads: Sequence[float], late_windows: Sequence[bool], noise: _PrefixNoise,
                  cfg: StragglerConfig) -> int | None:
    """Index of the last row of the shortest prefix (of at least ``steady_windows`` windows) over which the rule
    holds, or None. Any prefix, not only the whole: the live watch names a rank as soon as a prefix holds, and a
    loaded host's later windows must not take back afterwards what was seen while it ran. Sorted prefixes grow by
    insertion: one pass, not a median per prefix from scratch."""
    first = cfg.steady_windows * cfg.window_steps
    sorted_shares = sorted(shares[:first - 1])
    sorted_leads = sorted(leads[:first - 1])
    share_bar = 1.0 - 1.0 / cfg.steady_min_slowdown
    for i in range(first - 1, len(shares)):
        bisect.insort(sorted_shares, shares[i])
        bisect.insort(sorted_leads, leads[i])
        m = i + 1
        windows = m // cfg.window_steps
        sigmas = cfg.steady_noise_sigmas if windows <= cfg.steady_windows else cfg.steady_settled_sigmas
        if (late_windows[0] and sum(late_windows[:cfg.steady_windows]) >= cfg.steady_windows - 1
                and sum(late_windows[:windows]) >= cfg.late_fraction * windows
                and _sorted_median(sorted_shares) > share_bar
                and _sorted_median(sorted_leads) > max(sigmas * 1.2533 * noise.sigma(m) / math.sqrt(m),
                                                       cfg.min_lead_seconds)):
            return i
    return None


def _sorted_median(v: Sequence[float]) -> float:
    m = len(v)
    return v[m // 2] if m % 2 else (v[m // 2 - 1] + v[m // 2]) / 2


def _straggler(attempt: int, r: int, rows: Sequence[StepSample], leads: Sequence[float], shares: Sequence[float],
               named: int, end: int, w: int, min_slowdown: float, hosts: Mapping[int, str], signal: str,
               tail: Sequence[StepSample]) -> Straggler:
    """The finding from the first late step of the first window to row ``end``. Its what-if is against the median
    peer: each step would have taken the rank's median lead less. Without a fast history to compare with, the
    per-step maximum of the others carries all their noise, which on a busy host hid most of a steady rank's cost
    (docs/stragglers.md)."""
    onset = next((k for k in range(min(w, end + 1)) if shares[k] > 1.0 - 1.0 / min_slowdown), 0)
    stretch = range(onset, end + 1)
    lead = max(0.0, _median(leads[k] for k in stretch))
    step_seconds = _median(rows[k].step_seconds for k in stretch)
    without = max(step_seconds - lead, 1e-9)
    saved = [(attempt, rows[k].step, rows[k].end_time, min(lead, rows[k].step_seconds)) for k in stretch]
    last_step = rows[end].step
    if end == len(rows) - 1 and tail:
        saved += [(attempt, t.step, t.end_time, max(0.0, t.step_seconds - without)) for t in tail]
        last_step = tail[-1].step
    return Straggler(
        rank=r, host=hosts.get(r, ""), attempt=attempt, onset_step=rows[onset].step, detected_step=rows[named].step,
        last_step=last_step, steps=len(saved), slowdown=step_seconds / without, lead_seconds=lead,
        cost_seconds=sum(x[3] for x in saved), step_seconds=step_seconds, step_seconds_without=without,
        signal=signal, saved_by_step=tuple(saved))
