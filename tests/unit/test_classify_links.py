"""Link localization: failing pairs from multi-rank NCCL logs, and the element they all share."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.unit import linklogs as L
from trainguard.classify import LinkReport, classify_paths, classify_text, load_topology
from trainguard.classify.links import LinkCollector
from trainguard.classify.topology import parse_topology
from trainguard.errors import InputError


def _links(paths: list[Path], topo: dict[str, object] | None = None) -> LinkReport:
    t = parse_topology(topo) if topo is not None else None
    (c,) = classify_paths(paths, combine=True, topology=t)
    assert c.links is not None
    return c.links


@pytest.mark.parametrize(("n", "b", "dev"), [(2, 0, 3), (4, 2, 1), (16, 9, 3), (64, 37, 2)])
def test_one_broken_hca_is_named(tmp_path: Path, n: int, b: int, dev: int) -> None:
    rng = random.Random(n)
    paths = L.write(tmp_path, L.merge(L.broken_hca(n, b, dev), L.noise(n, rng, 3)), n)
    r = _links(paths)
    assert r.shared is not None, r.explanation
    assert (r.shared.kind, r.shared.host, r.shared.port) == ("hca", L.host(b), f"mlx5_{dev}:1")
    assert r.shared.coverage == 1.0 and 0 < r.shared.confidence <= 0.95
    # every pair it lists as failing has the broken host at one end
    assert all(L.host(b) in (p.host, p.peer_host) for p in r.pairs if p.fatal)


def test_broken_hca_with_topology_names_its_cable(tmp_path: Path) -> None:
    n, b = 16, 5
    paths = L.write(tmp_path, L.broken_hca(n, b, 3), n)
    r = _links(paths, L.topology(n, 8))
    assert r.shared is not None and r.shared.kind == "hca"
    assert r.shared.cable == "leaf-0/24" and r.shared.leaf == "leaf-0"


@pytest.mark.parametrize(("n", "r"), [(2, 1), (8, 0), (32, 17), (64, 63)])
def test_one_broken_remote_host_is_named(tmp_path: Path, n: int, r: int) -> None:
    rng = random.Random(r)
    logs = L.merge(L.broken_remote_host(n, r, rng), L.noise(n, rng, 2))
    logs.pop(r, None)  # the dead host wrote nothing after its start
    rep = _links(L.write(tmp_path, logs, n))
    assert rep.shared is not None, rep.explanation
    assert (rep.shared.kind, rep.shared.host) == ("host", L.host(r))


def test_a_dead_host_without_a_log_is_named_by_its_address(tmp_path: Path) -> None:
    n, r = 8, 3
    rep = _links(L.write(tmp_path, L.broken_remote_host(n, r, random.Random(1)), n, missing=(r,)))
    assert rep.shared is not None and rep.shared.kind == "host" and rep.shared.host == L.ip(r)
    # a topology file maps the address to the host
    rep = _links(L.write(tmp_path, L.broken_remote_host(n, r, random.Random(1)), n, missing=(r,)),
                 L.topology(n, 4))
    assert rep.shared is not None and rep.shared.host == L.host(r)


@pytest.mark.parametrize(("n", "per_leaf", "leaf"), [(16, 4, 2), (64, 8, 5), (24, 8, 0)])
def test_one_broken_leaf_switch_is_named_with_a_topology_file(tmp_path: Path, n: int, per_leaf: int,
                                                              leaf: int) -> None:
    under = list(range(leaf * per_leaf, (leaf + 1) * per_leaf))
    paths = L.write(tmp_path, L.merge(L.broken_leaf(n, under), L.noise(n, random.Random(n), 4)), n)
    rep = _links(paths, L.topology(n, per_leaf))
    assert rep.shared is not None, rep.explanation
    assert (rep.shared.kind, rep.shared.leaf) == ("leaf", f"leaf-{leaf}")
    # without the topology no single host or HCA is in nearly all of the failing pairs
    rep = _links(paths)
    assert rep.shared is None and "no common element" in rep.explanation


@pytest.mark.parametrize("n", [2, 8, 64])
def test_isolated_retries_are_no_common_element(tmp_path: Path, n: int) -> None:
    paths = L.write(tmp_path, L.noise(n, random.Random(7), max(3, n // 4)), n)
    rep = _links(paths)
    assert rep.shared is None and rep.fatal_pairs == 0 and rep.transient_lines >= 3
    assert "no failing link" in rep.explanation


def test_scattered_failures_share_nothing(tmp_path: Path) -> None:
    n = 32
    logs = {i: [L.completion(i, i % L.HCAS, (i + 11) % n)] for i in range(0, n, 4)}
    rep = _links(L.write(tmp_path, logs, n))
    assert rep.shared is None and rep.fatal_pairs == 8 and rep.candidates


def test_two_hosts_without_a_tie_breaker_are_no_single_element(tmp_path: Path) -> None:
    logs = {0: [L.completion(0, 1, 1)], 1: [L.completion(1, 1, 0)]}
    rep = _links(L.write(tmp_path, logs, 2))
    assert rep.shared is None and "no single element" in rep.explanation
    assert {name for _, name, _ in rep.candidates} == {"node-00 mlx5_1", "node-01 mlx5_1"}


def test_nvlink_xid_and_sxid_name_the_link() -> None:
    text = "\n".join([
        "Dec  1 10:00:01 gpu-node-7 kernel: NVRM: Xid (PCI:0000:07:00): 74, pid=2211, name=python, "
        "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        "Dec  1 10:00:02 gpu-node-7 kernel: NVRM: Xid (PCI:0000:07:00): 74, pid=2211, name=python, "
        "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        "Dec  1 10:00:03 gpu-node-7 kernel: NVRM: Xid (PCI:0000:07:00): 74, pid=2211, name=python, "
        "NVLink: fatal error detected on link 5(0x0, 0x0, 0x0, 0x0, 0x0, 0x20000, 0x0)",
        "Dec  1 10:00:03 gpu-node-7 kernel: nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, "
        "Link 33 egress non-posted PRIV error (First)",
    ])
    c = classify_text(text, "k.log")
    assert c.category == "Faulty GPU" and c.links is not None
    shared = c.links.shared
    assert shared is not None and (shared.kind, shared.host, shared.port, shared.link) == (
        "nvlink", "gpu-node-7", "0000:07:00", 5)
    assert c.links.transient_lines == 1  # the non-fatal SXid


def test_line_formats_parse_into_pairs() -> None:
    col = LinkCollector()
    lines = [
        "[rank3]:n1:11:12 [3] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4321> with status=12 "
        "opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGids ::ffff:10.0.0.2 hca mlx5_3",
        "n1:11:12 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.3<4321> with error 5, opcode 0, len 0, "
        "vendor err 249",
        "n1:11:12 [1] NCCL WARN NET/IB : ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_1:1, "
        "curr state INIT, next state RTR, local GID index 3, local GID ::ffff:10.0.0.1, remote GID ::ffff:10.0.0.4",
        "n1:11:12 [0] NCCL WARN Net : Call to recv from 10.0.0.5<39011> failed : Connection timed out",
        "n1:11:12 [0] NCCL WARN NET/IB : mlx5_0:1 Got async event : port error",
        "n1:11:12 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.6<4321> with status=IBV_WC_RETRY_EXC_ERR(12) "
        "opcode=1 len=0 vendor err 129 (transport retry counter exceeded) hca mlx5_2",
        "n1:11:12 [0] NCCL WARN NET/IB : mlx5_0:1 Got async event : port active",
        "n1:11:12 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
        "[E1201 10:00:01.123 2231 pair.cc:534] n1:11:12 [0] ../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Read error [10.0.0.7]:23456: Connection reset by peer",
        "../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:23456",
        "n1:11:12 [0] NCCL WARN Net : Connection closed by remote peer 127.0.0.1<39011>",
        "n1:11:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] via NET/IB/0/GDRDMA",
    ]
    for k, line in enumerate(lines, 1):
        col.feed(line, "f", k)
    got = {(k.host, k.port, k.peer): s.fatal for k, s in col.pairs.items()}
    assert got == {("n1", "mlx5_3", "10.0.0.2"): 1, ("n1", None, "10.0.0.3"): 1, ("n1", "mlx5_1:1", "10.0.0.4"): 1,
                   ("n1", None, "10.0.0.5"): 1, ("n1", "mlx5_0:1", None): 1, ("n1", "mlx5_2", "10.0.0.6"): 1,
                   ("n1", None, "10.0.0.7"): 1}
    assert col.addresses == {"10.0.0.1": "n1"}
    statuses = {k.peer: s.statuses for k, s in col.pairs.items()}
    assert statuses["10.0.0.2"] == {12} and statuses["10.0.0.3"] == {5} and statuses["10.0.0.6"] == {12}


def test_no_link_lines_means_no_link_report() -> None:
    assert classify_text("step 1 loss 2.0\nTraceback (most recent call last):\nValueError: x\n", "t").links is None


def test_json_has_pairs_and_shared_element(tmp_path: Path) -> None:
    paths = L.write(tmp_path, L.broken_hca(8, 3, 0), 8)
    (c,) = classify_paths(paths, combine=True)
    doc = json.loads(json.dumps(c.to_json()))["links"]
    assert set(doc) == {"pairs", "pairs_total", "fatal_pairs", "transient_lines", "shared", "candidates",
                        "explanation", "dropped_lines", "topology"}
    assert doc["shared"]["name"] == "node-03 mlx5_0:1" and doc["shared"]["kind"] == "hca"
    assert {"kind", "host", "port", "link", "peer", "peer_host", "lines", "fatal", "transient", "statuses",
            "evidence"} == set(doc["pairs"][0])


@pytest.mark.parametrize(("content", "suffix", "why"), [
    ("{", ".json", "bad topology file"),
    ('{"switches": {}}', ".json", '"hosts"'),
    ('{"hosts": {"a": {"leaf": 3}}}', ".json", "hosts.a.leaf"),
    ('{"hosts": {"a": {"addresses": ["1.1.1.1"]}, "b": {"addresses": ["1.1.1.1"]}}}', ".json", "both"),
    ("[hosts.a]\nrack = 'x'\n", ".toml", "unknown key 'rack'"),
    ("hosts = 3 = 4", ".toml", "bad topology file"),
])
def test_bad_topology_files_are_one_line_input_errors(tmp_path: Path, content: str, suffix: str,
                                                      why: str) -> None:
    p = tmp_path / f"t{suffix}"
    p.write_text(content)
    with pytest.raises(InputError) as err:
        load_topology(p)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_toml_topology_loads(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    p.write_text('[hosts.node-00]\nleaf = "leaf-0"\naddresses = ["10.0.0.1"]\nhcas = {"mlx5_0:1" = "leaf-0/1"}\n')
    t = load_topology(p)
    assert t.leaf_of("node-00") == "leaf-0" and t.cable_of("node-00", "mlx5_0:1") == "leaf-0/1"
    assert t.addresses == {"10.0.0.1": "node-00"}


def test_gloo_peers_of_a_dead_host_name_it(tmp_path: Path) -> None:
    n, dead = 6, 2
    paths = []
    for i in range(n):
        if i == dead:
            continue
        p = tmp_path / f"rank{i}.log"
        p.write_text(f"step 7 loss 2.1\n[E1201 10:00:0{i}.100 99 pair.cc:598] ../third_party/gloo/gloo/transport/"
                     f"tcp/pair.cc:598] Connection closed by peer [{L.ip(dead)}]:{23456 + i}\n")
        paths.append(p)
    rep = _links(paths)
    assert rep.shared is not None and (rep.shared.kind, rep.shared.host) == ("host", L.ip(dead))
    rep = _links(paths, L.topology(n, 8))
    assert rep.shared is not None and rep.shared.host == L.host(dead)
