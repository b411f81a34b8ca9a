"""`trainguard.launch.teardown`: a rank frozen after its training is over is ended and counted as finished;
and the hook that says a rank's training is over when the script destroys its process group."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.unit.live_procs import next_tick, started
from trainguard.core.protocol import Heartbeat
from trainguard.launch.frozen import sample
from trainguard.launch.teardown import (
    IdleWatch,
    crashed_after_done,
    end_frozen,
    note_crashed,
    stuck_in_teardown,
)
from trainguard.worker import autohooks, runtime


def beat(phase: str, t: float = 10.0) -> Heartbeat:
    return Heartbeat(step=20, steps_done=20, progress_mono=t, duration_seconds=0.1, phase=phase,
                     phase_start_mono=t, source="optimizer", alive_mono=t)


def test_only_ranks_done_with_training_whose_node_peers_all_finished_are_stuck_in_teardown() -> None:
    done, stepping = beat("done"), beat("step")
    assert stuck_in_teardown([0], {0: done, 1: None}, [0, 1], finished={1}) == (0,)
    assert stuck_in_teardown([2, 0], {0: done, 2: done}, [0, 1, 2], finished={1}) == (0, 2)
    # a peer of this node still runs: the hang is a training hang
    assert stuck_in_teardown([0], {0: done, 1: stepping}, [0, 1], finished=set()) == ()
    # the frozen rank never said its training was over (the old CI case without the destroy hook)
    assert stuck_in_teardown([0], {0: stepping}, [0, 1], finished={1}) == ()
    assert stuck_in_teardown([0], {0: None}, [0, 1], finished={1}) == ()
    assert stuck_in_teardown([], {}, [0], finished=set()) == ()


def test_only_a_crash_signal_after_done_is_a_teardown_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    done, stepping = beat("done"), beat("step")
    codes = {0: -6, 1: -11, 2: -6, 3: 1, 4: -9, 5: -15, 6: -6}
    beats = {0: done, 1: done, 2: stepping, 3: done, 4: done, 5: done, 6: None}
    # SIGABRT / SIGSEGV after done: the teardown. A crash while training, an error exit (the script's own
    # sys.exit(1) also runs the atexit that says done), a kill from outside, no heartbeat: failures as before.
    assert crashed_after_done(codes, beats) == {0: -6, 1: -11}
    with caplog.at_level(logging.WARNING, logger="trainguard.launch.teardown"):
        assert note_crashed({0: -6}, beats, 12.5, tmp_path) == {0}
    text = (tmp_path / "teardown_rank_0.txt").read_text()
    assert "rank 0 finished its training 2.5s before its process died by SIGABRT" in text
    assert "died by SIGABRT in its teardown; counted it as finished" in caplog.text


def test_a_frozen_process_is_written_down_then_killed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A real process frozen the way the deadlock leaves one: the GIL held in a C call, no Python thread runs.
    proc = subprocess.Popen([sys.executable, "-c", "import ctypes; ctypes.PyDLL(None).sleep(600)"])
    try:
        with caplog.at_level(logging.WARNING, logger="trainguard.launch.teardown"):
            ended = end_frozen([3, 5], {3: proc.pid}, {3: beat("done", time.monotonic() - 7.0)}, time.monotonic(),
                               tmp_path)
        assert ended == {3}  # rank 5 has no process here: nothing to end
        assert proc.wait(timeout=60) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "teardown_rank_3.txt").read_text()
    assert text.startswith(f"rank 3 (pid {proc.pid}) finished its training 7.")
    assert "used no CPU" not in text  # found by the allowance, not by the idle watch
    assert "thread " in text and "wchan" in text
    assert "rank 3 finished its training but its process did not end" in caplog.text
    assert str(tmp_path / "teardown_rank_3.txt") in caplog.text


def test_a_process_deadlocked_on_the_gil_is_idle_and_a_busy_one_is_not() -> None:
    # The deadlock's shape: the main thread asleep holding the GIL while another thread uses CPU without it (gloo's
    # loop polls; here a key derivation, which releases the GIL): the process uses CPU, its main thread does not.
    frozen = started("import ctypes, hashlib, threading\nsleep = ctypes.PyDLL(None).sleep\n"
                      "threading.Thread(target=hashlib.pbkdf2_hmac, args=('sha256', b'x', b'y', 10**9), daemon=True)"
                      ".start()\nprint('ready', flush=True)\nsleep(600)")
    busy = started("print('ready', flush=True)\nwhile True: pass")
    try:
        while "nanosleep" not in Path(f"/proc/{frozen.pid}/wchan").read_text():  # until it sleeps holding the GIL
            time.sleep(0.01)
        watch = IdleWatch(quiet_seconds=10.0)
        assert sample(frozen.pid) is not None
        assert watch.since({0: frozen.pid, 1: busy.pid}, 100.0) == {}  # first look: nothing known yet
        next_tick(busy.pid, main_thread=True)
        assert watch.since({0: frozen.pid, 1: busy.pid}, 105.0) == {}  # 5 s is not yet quiet enough
        next_tick(busy.pid, main_thread=True)
        assert watch.since({0: frozen.pid, 1: busy.pid}, 110.5) == {0: 10.5}
        # a rank left out (it said it was working again) starts over when it comes back
        assert watch.since({1: busy.pid}, 111.0) == {}
        assert watch.since({0: frozen.pid}, 112.0) == {}
    finally:
        for proc in (frozen, busy):
            proc.kill()
            proc.wait()
    assert sample(frozen.pid) is None  # gone


class _Phases:
    closed = False

    def __init__(self) -> None:
        self.phases: list[str] = []

    def set_phase(self, name: str) -> None:
        self.phases.append(name)


def test_destroying_the_default_group_says_done_before_torch_tears_it_down(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    rt = _Phases()

    def destroy_process_group(group: object = None) -> None:
        calls.append((group, list(rt.phases)))

    dist = types.ModuleType("fake_dist")
    dist.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]
    monkeypatch.setattr(runtime, "current", lambda: rt)
    assert autohooks.install_destroy_hook(dist)
    assert not autohooks.install_destroy_hook(dist)  # once
    dist.destroy_process_group("subgroup")  # a subgroup: training goes on
    dist.destroy_process_group()
    assert calls == [("subgroup", []), (None, ["done"])]  # "done" was written before torch's own call
    assert dist.destroy_process_group.__wrapped__ is destroy_process_group


def test_the_console_says_so_by_default() -> None:
    # trainguard.launch logs only errors on a default console; a rank the agent ended must still be said
    from trainguard.cli.run import quiet_torch_logs

    names = ("torch.distributed.elastic", "trainguard.launch", "trainguard.launch.warm", "trainguard.launch.teardown")
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        quiet_torch_logs(0)
        assert logging.getLogger("trainguard.launch.teardown").isEnabledFor(logging.WARNING)
        assert not logging.getLogger("trainguard.launch.agent").isEnabledFor(logging.WARNING)
    finally:  # the loggers are this process's: leave them as the other tests expect
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
