"""``trainguard run``'s rendezvous choices for many nodes: etcd-v2 and the lost-node timeout."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from trainguard.cli import run as run_cli
from trainguard.errors import UsageError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    return parser.parse_args([*argv, "train.py"])


def test_etcd_v2_takes_the_etcd_endpoint_with_its_default_port() -> None:
    rdzv = run_cli.decide_rendezvous(_args("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "etcd.example"), (2, 3))
    assert (rdzv.backend, rdzv.endpoint) == ("etcd-v2", "etcd.example:2379")
    rdzv = run_cli.decide_rendezvous(_args("--rdzv-backend", "ETCD-V2", "--rdzv-endpoint", "[::1]:3000",
                                           "--rdzv-conf", "protocol=https,read_timeout=30"), (1, 1))
    assert (rdzv.backend, rdzv.endpoint, rdzv.conf) == ("etcd-v2", "[::1]:3000",
                                                        {"protocol": "https", "read_timeout": "30"})


@pytest.mark.parametrize(("argv", "message"), [
    (("--rdzv-backend", "etcd-v2"), "needs --rdzv-endpoint"),
    (("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h", "--rdzv-conf", "protocol=gopher"), "http or https"),
    (("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h", "--rdzv-conf", "is_host=1"), "c10d settings"),
    (("--rdzv-backend", "etcd", "--rdzv-endpoint", "h"), "use c10d, etcd-v2 or static"),
])
def test_bad_etcd_options_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_cli.decide_rendezvous(_args(*argv), (2, 2))


def test_etcd_v2_without_the_client_package_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name == "etcd" else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(UsageError, match="needs the python-etcd package"):
        run_cli.decide_rendezvous(_args("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h"), (2, 2))


def test_the_backend_defaults_stay_torchruns() -> None:
    assert run_cli.decide_rendezvous(_args("--rdzv-endpoint", "h"), (2, 2)).backend == "c10d"
    assert run_cli.decide_rendezvous(_args("--master-port", "1234"), (2, 2)).backend == "static"
    assert run_cli.decide_rendezvous(_args(), (1, 1)).backend == "c10d"


@pytest.mark.parametrize("value", ["1", "0", "4000"])
def test_the_node_lost_timeout_is_checked_before_anything_exists(tmp_path: Any, value: str) -> None:
    args = _args("--node-lost-timeout", value, "--run-dir", str(tmp_path / "run"))
    with pytest.raises(UsageError, match="--node-lost-timeout must be a number from 2 to 3600"):
        run_cli.build_config(args, ["train.py"], nproc=1, nnodes=(1, 1), endpoint="", node_id="n0")
    assert not (tmp_path / "run").exists()
