"""Node liveness (`trainguard.launch.nodes`): agent beats, the peers' watch, lost-node evidence, node chaos."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trainguard.chaos import faults as chaos
from trainguard.chaos import node_faults
from trainguard.core.protocol import Heartbeat, RunLayout
from trainguard.errors import UsageError
from trainguard.launch import nodes


def test_a_beat_round_trips_and_garbage_is_no_beat() -> None:
    beat = nodes.AgentBeat(seq=7, pid=123, state="running", attempt=2, wall=1700000000.5)
    assert nodes.AgentBeat.decode(beat.encode()) == beat
    for junk in (b"", b"seq=x", b"\xff\xfe", b"seq=1 pid=2"):
        assert nodes.AgentBeat.decode(junk) is None


def test_the_writer_beats_until_stopped_and_leaves_its_final_state(tmp_path: Path) -> None:
    writer = nodes.BeatWriter(tmp_path, "n0", interval_seconds=0.05)
    writer.set_attempt(3)
    writer.start()
    first = nodes.read_beat(tmp_path, "n0")
    time.sleep(0.3)
    later = nodes.read_beat(tmp_path, "n0")
    writer.stop("completed")
    final = nodes.read_beat(tmp_path, "n0")
    assert first is not None and later is not None and final is not None
    assert later.seq > first.seq and later.state == "running" and later.pid == os.getpid()
    assert (final.state, final.attempt) == ("completed", 3)


def test_a_peer_is_lost_only_after_its_beat_stood_still_for_the_timeout(tmp_path: Path) -> None:
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=5.0)
    writer = nodes.BeatWriter(tmp_path, "n1")
    writer._write("running")
    assert watch.observe(["n0", "n1"], 100.0) == []
    assert not watch.changed_since("n1", 99.0)  # a first sighting is no sign of life after a failure
    assert watch.observe(["n1"], 104.9) == []
    lost = watch.observe(["n1"], 105.1)
    assert [(n.node, round(n.silent_seconds, 1)) for n in lost] == [("n1", 5.1)]
    writer._write("running")  # it beats again: the silence starts over, on the watcher's clock
    assert watch.observe(["n1"], 106.0) == []
    assert watch.observe(["n1"], 110.9) == []
    # The read at 106.0 saw a new beat written after the read at 105.1: alive after 105.1, not provably after 105.5.
    assert watch.changed_since("n1", 105.1) and not watch.changed_since("n1", 105.5)


def test_a_peer_last_read_before_an_earlier_failure_is_not_alive_for_a_new_beat_seen_now(tmp_path: Path) -> None:
    # A 4-host scale run: host0 read host3's beat (outside its ring) during an earlier failure's settle, then not
    # for 30 s; host3 died; at the next failure host0's first read saw a beat newer than 30 s ago and took it for a
    # sign of life after the failure, so the host's death was recorded as rank 0's error exit.
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=5.0)
    writer = nodes.BeatWriter(tmp_path, "n3")
    writer._write("running")
    watch.observe(["n3"], 25.0)
    writer._write("running")  # beats on, unread, then dies
    watch.observe(["n3"], 55.2)  # the failure was seen at 55.0
    assert not watch.changed_since("n3", 55.0)
    assert watch.observe(["n3"], 60.0) == []
    assert [n.node for n in watch.observe(["n3"], 60.3)] == ["n3"]  # silent since it was first seen so


def test_an_agent_watches_its_next_two_nodes_in_id_order() -> None:
    assert nodes.ring_successors(["b", "c", "d", "e"], "a") == ["b", "c"]
    assert nodes.ring_successors(["a", "b", "c", "d"], "d") == ["a", "b"]
    assert nodes.ring_successors(["a", "b"], "b") == ["a"]
    assert nodes.ring_successors([], "a") == []
    every = {n: nodes.ring_successors("abcdefg", n) for n in "abcdefg"}
    assert all(sum(n in w for w in every.values()) == 2 for n in "abcdefg")  # each node has two watchers


def test_an_ended_or_unknown_peer_is_never_lost(tmp_path: Path) -> None:
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=1.0)
    nodes.BeatWriter(tmp_path, "n1")._write("completed")
    watch.observe(["n1", "n2"], 0.0)
    assert watch.observe(["n1", "n2"], 100.0) == []  # n1 ended, n2 never wrote a beat


def test_settle_returns_at_once_when_every_peer_beat_since_the_failure(tmp_path: Path) -> None:
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=30.0)
    writer = nodes.BeatWriter(tmp_path, "n1", interval_seconds=0.05)
    writer.start()
    try:
        t0 = time.monotonic()
        assert watch.settle(["n1"], t0) == []
        assert time.monotonic() - t0 < 5
    finally:
        writer.stop("completed")


def test_settle_names_a_silent_peer_within_the_timeout_and_a_beat(tmp_path: Path) -> None:
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=1.0)
    nodes.BeatWriter(tmp_path, "n1")._write("running")
    t0 = time.monotonic()
    watch.observe(["n1"], t0)
    lost = watch.settle(["n1"], t0)
    took = time.monotonic() - t0
    assert [n.node for n in lost] == ["n1"]
    assert 1.0 <= took <= 1.0 + nodes.BEAT_INTERVAL_SECONDS + 0.5


def test_settle_names_a_dead_peer_whose_last_beat_it_first_reads_long_after_the_failure(tmp_path: Path) -> None:
    # A 3-node demo at load 12: a node died; the peer's workers exited with errors, and gathering their evidence took
    # seconds, so the agent read the dead node's last beat for the first time past the bound counted from the
    # failure. Its silence had been judged from that first read and could not reach the timeout by then: settle
    # returned nobody lost and the node's death was recorded as the peer's own error exit.
    watch = nodes.PeerWatch(tmp_path, "n0", lost_after_seconds=1.0)
    nodes.BeatWriter(tmp_path, "n1")._write("running")  # its last beat, never read before the failure
    failed_at = time.monotonic() - 3.0  # the failure was seen 3 s ago
    lost = watch.settle(["n1"], failed_at)
    assert [n.node for n in lost] == ["n1"]
    assert lost[0].silent_seconds > 1.0


def test_the_evidence_of_a_lost_node_holds_its_beat_heartbeats_and_log_tails(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    nodes.BeatWriter(tmp_path, "n1")._write("running")
    hb = layout.heartbeat_file("n1", 0, 2)
    hb.parent.mkdir(parents=True)
    hb.write_bytes(Heartbeat(step=5, steps_done=5, progress_mono=1.0, duration_seconds=0.1, phase="step",
                             phase_start_mono=1.0, source="optimizer").encode())
    layout.rank_log(0, 2).parent.mkdir(parents=True, exist_ok=True)
    layout.rank_log(0, 2).write_text("".join(f"line {i}\n" for i in range(500)))
    files = sorted(nodes.keep_evidence(layout, "n1", 0))
    assert files == ["diagnostics/attempt-0/node-n1/agent.beat", "diagnostics/attempt-0/node-n1/heartbeats.txt",
                             "diagnostics/attempt-0/node-n1/log_tail_rank_2.txt"]
    assert "rank 2: step=5 " in (tmp_path / files[1]).read_text()
    tail = (tmp_path / files[2]).read_text().splitlines()
    assert tail[0] == "line 300" and tail[-1] == "line 499"
    assert nodes.attempt_nodes(layout, 0) == {"n1": [2]}


def test_a_node_recorded_lost_is_told_so_when_it_comes_back(tmp_path: Path) -> None:
    assert nodes.lost_reasons(tmp_path, "n1") == []
    assert nodes.mark_lost(tmp_path, "n1", "silent for 10s")
    assert not nodes.mark_lost(tmp_path, "n1", "again")  # recorded once
    assert nodes.lost_reasons(tmp_path, "n1") == ["node lost: silent for 10s"]


def test_node_faults_parse_and_fall_due_when_the_node_completed_the_step_before() -> None:
    faults = chaos.parse_spec("node-crash@step=4,node=n2;agent-kill@step=2,node=n1,attempt=1;crash@step=3")
    assert [f.kind for f in faults] == ["node-crash", "agent-kill", "crash"]
    assert chaos.format_spec(faults) == "node-crash@step=4,node=n2;agent-kill@step=2,node=n1,attempt=1;crash@step=3"
    assert node_faults.due_node_faults(faults, "n2", 0, 2) == []
    assert [f.kind for f in node_faults.due_node_faults(faults, "n2", 0, 3)] == ["node-crash"]
    assert node_faults.due_node_faults(faults, "n2", 0, None) == []
    assert node_faults.due_node_faults(faults, "n1", 0, 5) == []  # attempt 1 only
    assert [f.kind for f in node_faults.due_node_faults(faults, "n1", 1, 1)] == ["agent-kill"]
    for bad in ("node-crash@step=4", "agent-kill@node=n1", "node-crash@step=1,node=n1,rank=2"):
        with pytest.raises(UsageError):
            chaos.parse_spec(bad)
