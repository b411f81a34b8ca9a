"""Slurm hostlist expansion (`trainguard.health.hostlist`) on lists as Slurm prints them."""

from __future__ import annotations

import pytest

from trainguard.health.hostlist import expand


@pytest.mark.parametrize(("hostlist", "hosts"), [
    ("node[01-04,07],gpu-a1", ["node01", "node02", "node03", "node04", "node07", "gpu-a1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # no padding: widths grow
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),  # padding from the lower bound
    ("nid[00010-00012]", ["nid00010", "nid00011", "nid00012"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("login1", ["login1"]),
    ("a100-[3,5],h100-sxm-[12-13]", ["a100-3", "a100-5", "h100-sxm-12", "h100-sxm-13"]),
    ("node[1-2],node2,node[2-3]", ["node1", "node2", "node3"]),  # repeats named once
    ("", []),
])
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[a-b]", "n[3-1]", "n[[1-2]]", "a,,b", "n[]", "n[1-2] x",
                                 "n[1-99999999]"])
def test_malformed_lists_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        expand(bad)
