"""`SupervisorConfig` and `WatchdogConfig` check their own values (a `ValueError` naming the field); the CLI
rewords those errors in terms of its flags; nothing global changes on import, construction, or after `supervise`."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli.run_args import FIELD_FLAGS, usage_error
from trainguard.errors import UsageError
from trainguard.launch import SupervisorConfig, WatchdogConfig
from trainguard.launch.config import parse_signals, parse_std_spec
from trainguard.launch.supervisor import torch_agent_environment


def _config(**kw: Any) -> SupervisorConfig:
    base: dict[str, Any] = {"command": ("train.py",), "run_dir": Path("/tmp/run"), "run_id": "r1", "node_id": "n1",
                            "rdzv_endpoint": "127.0.0.1:29400"}
    return SupervisorConfig(**{**base, **kw})


def test_defaults_are_valid() -> None:
    cfg = _config()
    assert cfg.max_restarts == 3 and cfg.watchdog == WatchdogConfig()
    static = _config(rdzv_backend="static", min_nodes=2, max_nodes=2, node_rank=1)
    assert static.node_rank == 1


@pytest.mark.parametrize(("field", "value"), [
    ("nproc_per_node", 0), ("nproc_per_node", 1025), ("nproc_per_node", 2.5), ("nproc_per_node", True),
    ("min_nodes", 0), ("max_nodes", 4097), ("max_restarts", -1), ("max_restarts", 10_001),
    ("max_no_progress_attempts", 0), ("monitor_interval_seconds", 0.0), ("monitor_interval_seconds", math.nan),
    ("monitor_interval_seconds", 61.0), ("last_call_seconds", 0), ("join_timeout_seconds", 0),
    ("stop_grace_seconds", -1.0), ("stop_grace_seconds", math.inf), ("node_rank", -1),
    ("rdzv_close_timeout_seconds", 0), ("sdc_check_every", -1), ("node_lost_timeout_seconds", 1.0),
    ("target_steps", 0), ("command", ()), ("command", ["train.py"]), ("run_id", "../up"), ("node_id", "a/b"),
    ("role", ""), ("rdzv_backend", "etcd"), ("rdzv_endpoint", ""), ("redirects", "7"), ("tee", "0:3,1"),
    ("local_ranks_filter", (-1,)), ("straggler_policy", "ignore"), ("straggler_probe_seconds", 0.1),
    ("telemetry_seconds", -5.0), ("signals_to_handle", "SIGNOPE"), ("signals_to_handle", " , "),
    ("watchdog", {"floor_seconds": 1.0}),
])
def test_a_bad_value_raises_value_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        _config(**{field: value})


def test_cross_field_rules_name_their_fields() -> None:
    with pytest.raises(ValueError, match=r"^min_nodes must not exceed max_nodes"):
        _config(min_nodes=3, max_nodes=2)
    with pytest.raises(ValueError, match=r"^module and no_python"):
        _config(module=True, no_python=True)
    with pytest.raises(ValueError, match=r"^min_nodes must equal max_nodes"):
        _config(rdzv_backend="static", min_nodes=1, max_nodes=2)
    with pytest.raises(ValueError, match=r"^node_rank must be below max_nodes \(2\)"):
        _config(rdzv_backend="static", min_nodes=2, max_nodes=2, node_rank=2)


def test_replace_is_validated_too() -> None:
    with pytest.raises(ValueError, match=r"^redirects"):
        dataclasses.replace(_config(), redirects="x")


@pytest.mark.parametrize(("field", "value"), [
    ("floor_seconds", 0.0), ("floor_seconds", -1.0), ("floor_seconds", math.nan), ("multiplier", math.inf),
    ("first_step_allowance_seconds", 1e6), ("checkpoint_allowance_seconds", "120"), ("alive_stale_seconds", 0),
    ("samples", 0), ("samples", 2.0), ("samples", True),
])
def test_watchdog_config_checks_its_fields(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        WatchdogConfig(**{field: value})


def test_stream_and_signal_parsers_name_the_field() -> None:
    assert parse_std_spec("0:3,1:2", "tee") == {0: 3, 1: 2}
    with pytest.raises(ValueError, match=r"^tee must be 0-3"):
        parse_std_spec("0:4", "tee")
    assert parse_signals(" SIGTERM , SIGINT ") == "SIGTERM,SIGINT"
    with pytest.raises(ValueError, match=r"^signals_to_handle: unknown signal 'TERM'"):
        parse_signals("TERM")


@pytest.mark.parametrize(("message", "expected"), [
    ("floor_seconds must be a positive number below 1e6, got 0.0",
     "--hang-floor must be a positive number below 1e6, got 0.0"),
    ("node_rank must be below max_nodes (2), got 2", "--node-rank must be below --nnodes (2), got 2"),
    ("tee must be 0-3 (1 stdout, 2 stderr, 3 both)", "--tee must be 0-3 (1 stdout, 2 stderr, 3 both)"),
    ("module and no_python cannot both be set", "--module and --no-python cannot both be set"),
    # a one-word field name inside prose is left alone
    ("signals_to_handle: the tee of a module", "--signals-to-handle: the tee of a module"),
])
def test_usage_error_speaks_in_flags(message: str, expected: str) -> None:
    err = usage_error(ValueError(message))
    assert isinstance(err, UsageError)  # the CLI's usage error: exit 2
    assert str(err) == expected


def test_every_config_field_a_flag_sets_has_a_flag_name() -> None:
    # A config error about a field the CLI sets must come out in terms of a flag the user can find.
    settable = {f.name for cls in (SupervisorConfig, WatchdogConfig) for f in dataclasses.fields(cls)}
    assert set(FIELD_FLAGS) <= settable
    for name in ("max_restarts", "nproc_per_node", "stop_grace_seconds", "floor_seconds", "signals_to_handle"):
        assert FIELD_FLAGS[name].startswith("--")


def test_torch_agent_environment_is_scoped_to_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGUSR1")
    with torch_agent_environment(_config(signals_to_handle="SIGTERM, SIGINT")):
        assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ
    assert os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGUSR1"
    with pytest.raises(RuntimeError), torch_agent_environment(_config()):
        raise RuntimeError("the agent failed")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ


def test_importing_and_constructing_change_no_environment() -> None:
    code = (
        "import os, warnings, logging\n"
        "env, filters, handlers = dict(os.environ), list(warnings.filters), list(logging.getLogger().handlers)\n"
        "import trainguard.launch.supervisor, trainguard.cli.run, trainguard.cli.demo\n"
        "from pathlib import Path\n"
        "from trainguard.launch import SupervisorConfig\n"
        "SupervisorConfig(command=('t.py',), run_dir=Path('r'), run_id='r', node_id='n',\n"
        "                 rdzv_endpoint='127.0.0.1:1', signals_to_handle='SIGTERM')\n"
        "assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())\n"
        "assert list(warnings.filters) == filters\n"
        "assert list(logging.getLogger().handlers) == handlers\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
