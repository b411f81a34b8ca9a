"""The worker↔agent protocol: heartbeat records round-trip, and anything torn, foreign or out of range reads as None."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.core.protocol import HEARTBEAT_BYTES, Heartbeat, RunLayout, WorkerEnv, read_heartbeat

BEAT = Heartbeat(step=12, steps_done=5, progress_mono=1234.5, duration_seconds=0.25, phase="comm_wait",
                 phase_start_mono=1234.6, source="optimizer", collectives_done=40, pending_since_mono=1234.7,
                 alive_mono=1235.0)

times = st.floats(min_value=0, max_value=1e7, allow_nan=False).map(lambda x: round(x, 6))


@given(step=st.integers(0, 10**9), n=st.integers(0, 10**9), t=times, dur=times, pt=times,
       src=st.sampled_from(["none", "script", "optimizer"]), c=st.integers(0, 10**12), pend=times, alive=times,
       phase=st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True))
def test_encode_decode_round_trip(step: int, n: int, t: float, dur: float, pt: float, src: str, c: int, pend: float,
                                  alive: float, phase: str) -> None:
    beat = Heartbeat(step=step, steps_done=n, progress_mono=t, duration_seconds=dur, phase=phase, phase_start_mono=pt,
                     source=src, collectives_done=c, pending_since_mono=pend, alive_mono=alive)
    data = beat.encode()
    assert len(data) == HEARTBEAT_BYTES
    assert Heartbeat.decode(data) == beat


def test_a_torn_record_is_rejected_by_its_checksum() -> None:
    old = BEAT.encode()
    new = Heartbeat(**{**BEAT.__dict__, "step": 13, "steps_done": 6, "progress_mono": 1299.125}).encode()
    for cut in range(1, HEARTBEAT_BYTES):
        mixed = new[:cut] + old[cut:]  # a reader racing the in-place rewrite
        decoded = Heartbeat.decode(mixed)
        assert decoded in (None, BEAT, Heartbeat.decode(new)), cut
    assert Heartbeat.decode(new[:60]) is None  # cut short


@pytest.mark.parametrize("data", [
    b"", b"\0" * HEARTBEAT_BYTES, b"garbage", b"v1 step=1 t=1 dur=0 phase=step pt=1 n=1\n",
    b"v2 step=x n=1 t=1 dur=0 phase=step pt=1\n", b"v2 step=-1 n=1 t=1 dur=0 phase=step pt=1\n",
    b"v2 step=1 n=1 t=nan dur=0 phase=step pt=1\n", b"v2 step=1 n=1 t=inf dur=0 phase=step pt=1\n",
    b"v2 step=1 n=1 t=-3 dur=0 phase=step pt=1\n", b"v2 step=1 n=1 t=1 dur=0 phase=step pt=1 src=agent\n",
    b"v2 step=1 n=1 t=1 dur=0 phase=st\xffep pt=1\n", b"v2 step=1 n=1 t=1 dur=0 pt=1\n",
    b"v2 step=1 n=1 t=1 dur=0 phase=step pt=1 k=00000000\n", b"v2 step=1 n=1 t=1 dur=0 phase=step pt=1 k=zz\n",
])
def test_garbage_and_out_of_range_read_as_none(data: bytes) -> None:
    assert Heartbeat.decode(data) is None


def test_encode_refuses_what_it_could_not_read_back() -> None:
    with pytest.raises(ValueError):
        Heartbeat(**{**BEAT.__dict__, "phase": "two words"}).encode()
    with pytest.raises(ValueError):
        Heartbeat(**{**BEAT.__dict__, "phase": "x" * 65}).encode()


def test_read_heartbeat_never_follows_links_nor_reads_odd_files(tmp_path: Path) -> None:
    path = tmp_path / "rank-0"
    path.write_bytes(BEAT.encode())
    assert read_heartbeat(path) == BEAT
    link = tmp_path / "rank-1"
    link.symlink_to(path)
    assert read_heartbeat(link) is None
    os.mkfifo(tmp_path / "rank-2")
    assert read_heartbeat(tmp_path / "rank-2") is None  # no blocking on a FIFO
    assert read_heartbeat(tmp_path / "missing") is None


def test_worker_env_round_trips_and_tolerates_malformed_values(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    env = WorkerEnv(run_dir=tmp_path, attempt=2, node="n1", heartbeat_dir=layout.heartbeat_dir("n1", 2),
                    evidence_dir=layout.diagnostics_dir(2), agent_pid=4242, chaos="crash@step=3",
                    pg_timeout_seconds=90.0, auto=False, fr_prewarm=False)
    assert WorkerEnv.from_environ(env.to_environ()) == env
    bad = WorkerEnv.from_environ({"TRAINGUARD_ATTEMPT": "x", "TRAINGUARD_AGENT_PID": "-5",
                                  "TRAINGUARD_PG_TIMEOUT_SECONDS": "nan"})
    assert bad.attempt == 0 and bad.agent_pid is None and bad.pg_timeout_seconds is None and bad.auto
    assert layout.heartbeat_file("n1", 2, 3) == tmp_path / "heartbeats" / "n1" / "attempt-2" / "rank-3"
