"""The pure pieces of in-process restart: what counts as a broken collective, the worker settings, the
spare's preload list, the configuration rules and the event records."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from trainguard.core import protocol
from trainguard.core.event_decoding import from_dict
from trainguard.core.events import AttemptStarted, InProcessRecovery
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.store_auth import StoreSigner
from trainguard.worker.inprocess import InProcessGaveUp, InProcessSettings, SignedKeys, _next_attempt, peer_failure
from trainguard.worker.warm import top_level_imports


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # keep the traceback, as the wrapper sees it
        return caught


def test_broken_collectives_count_as_peer_failures_and_own_errors_do_not() -> None:
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer")
    assert peer_failure(_raised(gloo))
    assert peer_failure(_raised(dist.DistNetworkError("store went away")))
    assert not peer_failure(_raised(ValueError("bad batch")))
    assert not peer_failure(_raised(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")))
    assert not peer_failure(_raised(InProcessGaveUp("no new attempt within 30s after attempt 0 failed")))


def test_a_plain_runtime_error_counts_only_when_raised_inside_torch_distributed() -> None:
    def raised_in(filename: str) -> BaseException:
        scope: dict[str, object] = {}
        exec(compile("def boom():\n    raise RuntimeError('unexpected state 7')\n", filename, "exec"), scope)
        try:
            scope["boom"]()  # type: ignore[operator]
        except RuntimeError as exc:
            return exc
        raise AssertionError("not raised")

    inside = str(Path("site-packages") / "torch" / "distributed" / "distributed_c10d.py")
    assert peer_failure(raised_in(inside))
    assert not peer_failure(raised_in(str(Path("site-packages") / "mymodel" / "train.py")))


def test_settings_come_from_the_agent_environment_only() -> None:
    assert InProcessSettings.from_environ({}) is None
    assert InProcessSettings.from_environ({protocol.INPROCESS_STORE_ENV: "127.0.0.1:notaport"}) is None
    s = InProcessSettings.from_environ({protocol.INPROCESS_STORE_ENV: "127.0.0.1:4242",
                                        protocol.INPROCESS_TIMEOUT_ENV: "12.5", "TRAINGUARD_ATTEMPT": "3",
                                        "RANK": "1", "WORLD_SIZE": "4"})
    assert s == InProcessSettings(host="127.0.0.1", port=4242, timeout_seconds=12.5, attempt=3, rank=1, world_size=4)
    with_dir = InProcessSettings.from_environ({protocol.INPROCESS_STORE_ENV: "127.0.0.1:4242",
                                               "TRAINGUARD_RUN_DIR": "/runs/r"})
    assert with_dir is not None and with_dir.run_dir == Path("/runs/r")
    assert protocol.inprocess_key(3, "pg/") == "trainguard/inprocess/attempt-3/pg/"


def test_a_spare_preloads_the_scripts_absolute_top_level_imports(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, torch.nn as nn\nfrom torch.optim import AdamW\nfrom . import local\n"
                      "def f():\n    import inside\n")
    assert top_level_imports(script) == ["os", "torch.nn", "torch.optim"]
    (tmp_path / "broken.py").write_text("def (:\n")
    assert top_level_imports(tmp_path / "broken.py") == []
    assert top_level_imports(tmp_path / "missing.py") == []


def _cfg(**kw: object) -> SupervisorConfig:
    return SupervisorConfig(command=("train.py",), run_dir=Path("/tmp/x"), run_id="r", node_id="n",
                            rdzv_endpoint="127.0.0.1:1", **kw)  # type: ignore[arg-type]


def test_configuration_rules() -> None:
    assert _cfg(in_process=True, warm_spares=2).warm_spares == 2
    with pytest.raises(ValueError, match="in_process supports one node"):
        _cfg(in_process=True, max_nodes=2)
    assert _cfg().warm_spares == -1  # automatic sizing by default, whole-process restarts included
    assert _cfg(warm_spares=1).warm_spares == 1  # no longer tied to --in-process
    with pytest.raises(ValueError, match="warm_spares needs a Python script"):
        _cfg(warm_spares=1, no_python=True)
    with pytest.raises(ValueError, match="warm_spares"):
        _cfg(in_process=True, warm_spares=-2)
    with pytest.raises(ValueError, match="in_process_timeout_seconds"):
        _cfg(in_process=True, in_process_timeout_seconds=0.0)


def test_records_round_trip_and_older_attempt_records_still_read() -> None:
    rec = InProcessRecovery(time=1.0, host="n", attempt=2, status="fallback", ranks=(1,), failure_kind="hang",
                            seconds=30.5, warm_spares_used=1, detail="1 of 2 ranks formed the process group")
    assert from_dict(rec.to_dict()) == rec
    old = {"v": 1, "type": "attempt_started", "time": 1.0, "host": "n", "attempt": 1}
    started = from_dict(old)
    assert isinstance(started, AttemptStarted) and started.recovery == ""


def test_in_process_keys_are_named_and_signed_with_the_job_secret(caplog: pytest.LogCaptureFixture) -> None:
    keys, other = SignedKeys(StoreSigner(b"k" * 32)), SignedKeys(StoreSigner(b"x" * 32))
    # Nobody without the secret can name the key the ranks read, nor write a value they accept.
    assert keys.key(0, "next") != protocol.inprocess_key(0, "next") and keys.key(0, "next") != other.key(0, "next")
    assert keys.key(0, "next").startswith(protocol.inprocess_key(0, "next") + "/")
    assert keys.open(0, "next", keys.seal(0, "next", "1")) == "1"
    assert keys.open(0, "next", keys.seal(1, "next", "1")) is None  # another attempt's value
    assert keys.open(0, "env", keys.seal(0, "next", "1")) is None  # another key's value
    assert keys.open(0, "next", b"5") is None
    assert keys.open(0, "next", other.seal(0, "next", "5")) is None
    assert keys.pg_prefix(2).startswith(protocol.inprocess_key(2, "pg") + "/")
    assert sum("forged" in r.getMessage() for r in caplog.records) == 1  # said once, not per forged value


def test_a_forged_next_attempt_counts_as_not_yet_written() -> None:
    keys = SignedKeys(StoreSigner(b"k" * 32))
    values = {keys.key(0, "next"): [b'{"value": "5", "mac": "00"}', keys.seal(0, "next", "1")]}

    class Store:
        def wait(self, names: list[str], timeout: object) -> None:
            assert names == [keys.key(0, "next")]

        def get(self, name: str) -> bytes:
            got = values[name]
            return got.pop(0) if len(got) > 1 else got[0]

    assert _next_attempt(Store(), keys, 0, 10.0) == 1  # the forgery was skipped, the agent's value taken
    values[keys.key(0, "next")] = [b"not signed"]
    with pytest.raises(InProcessGaveUp):
        _next_attempt(Store(), keys, 0, 0.5)
