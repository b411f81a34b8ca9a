"""``trainguard run``'s flags built from the config fields (`trainguard.launch.settings`): every documented flag
is there, every default is the field's, every field is in a section, and the help shows the sections."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from trainguard.cli import build_parser
from trainguard.cli import demo as demo_cli
from trainguard.cli import run as run_cli
from trainguard.cli.run_args import FIELD_FLAGS
from trainguard.launch import SupervisorConfig, WatchdogConfig
from trainguard.launch.settings import SECTIONS, Setting, field_flags, flag_values, sections, setting_of

DOCS = Path(__file__).resolve().parents[2] / "docs"
# A flag token in prose or a code block: --word or -x (not part of a longer word).
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*|-[a-z](?![\w-]))")
# Flags docs/run.md shows that are not trainguard's: the training scripts' own, Python's, a benchmark's.
# scripts', benchmarks' and python's own flags
_NOT_OURS = {"--lr", "--save_only_model", "-u", "-c", "--reps", "--only-unmodified", "--burn", "--only",
             "--skip-real", "--unmodified-crash-step"}


def _parser(module: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


@pytest.fixture(autouse=True)
def _no_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def test_every_flag_docs_run_md_shows_is_accepted() -> None:
    known = _options(_parser(run_cli)) | _options(_parser(demo_cli)) | _options(build_parser())
    flags = set(_FLAG.findall((DOCS / "run.md").read_text()))
    assert len(flags) > 50  # the extraction itself works
    assert sorted(flags - known - _NOT_OURS) == []


def test_every_flag_docs_cli_md_shows_is_accepted_by_some_verb() -> None:
    top = build_parser()
    verbs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    known = _options(top) | {o for p in verbs.choices.values() for o in _options(p)}
    flags = set(_FLAG.findall((DOCS / "cli.md").read_text()))
    assert flags and sorted(flags - known) == []


def test_the_documented_run_flags_parse() -> None:
    # The spellings docs/run.md's examples use, torchrun's underscore forms and the short aliases included.
    args = _parser(run_cli).parse_args([
        "--nnodes", "1:2", "--nproc_per_node", "2", "--max_restarts", "5", "--monitor_interval", "0.5", "-m",
        "-r", "3", "-t", "0:1", "--role", "trainer", "--hang-floor", "7", "--hang-multiplier", "2.5",
        "--no-progress-attempts", "4", "--in-process", "--in-process-timeout", "12", "--warm-spares", "1",
        "--no-fork-server", "--node-lost-timeout", "6", "--max-log-mb", "64", "--no-auto-instrument",
        "--no-health-checks", "-q",
        "--signals_to_handle", "SIGTERM", "--local_addr", "10.0.0.2", "pkg.train", "--lr", "1"])
    values = flag_values(args, SupervisorConfig)
    assert values == {
        "max_restarts": 5, "max_no_progress_attempts": 4, "monitor_interval_seconds": 0.5, "health_checks": False,
        "auto_instrument": False, "in_process": True, "in_process_timeout_seconds": 12.0, "warm_spares": 1,
        "fork_server": False, "fresh_processes": False, "module": True, "no_python": False,
        "local_addr": "10.0.0.2", "role": "trainer",
        "redirects": "3", "tee": "0:1", "quiet": True, "max_log_mb": 64, "node_lost_timeout_seconds": 6.0,
        "signals_to_handle": "SIGTERM", "memory_checkpoint_gb": 0.0, "memory_checkpoint_placement": "ring",
        "fleet_db": None}
    assert flag_values(args, WatchdogConfig) == {"floor_seconds": 7.0, "multiplier": 2.5,
                                                 "busy_allowance_seconds": 4.0, "first_step_allowance_seconds": 120.0,
                                                 "checkpoint_allowance_seconds": 120.0}
    assert args.command == ["pkg.train", "--lr", "1"]


@pytest.mark.parametrize("module", [run_cli, demo_cli])
def test_defaults_are_the_dataclass_defaults(module: object) -> None:
    args = _parser(module).parse_args(["train.py"] if module is run_cli else [])
    for cls in (SupervisorConfig, WatchdogConfig):
        got = flag_values(args, cls)
        assert got, cls
        for f in dataclasses.fields(cls):
            if f.name in got:
                assert got[f.name] == f.default and type(got[f.name]) is type(f.default), f.name


def test_torchrun_environment_sets_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_MAX_RESTARTS", "7")
    monkeypatch.setenv("PET_MONITOR_INTERVAL", "0.25")
    monkeypatch.setenv("PET_NO_PYTHON", "1")
    got = flag_values(_parser(run_cli).parse_args(["prog"]), SupervisorConfig)
    assert (got["max_restarts"], got["monitor_interval_seconds"], got["no_python"]) == (7, 0.25, True)


def test_every_field_has_a_section_and_every_flag_a_field() -> None:
    for cls in (SupervisorConfig,):
        for f in dataclasses.fields(cls):
            s = setting_of(f)
            assert isinstance(s, Setting) and s.section in SECTIONS, f.name
    placed = sections(SupervisorConfig)
    assert sum(len(v) for v in placed.values()) == len(dataclasses.fields(SupervisorConfig))
    # The error translation knows every generated flag, and every flag it names exists.
    assert field_flags(SupervisorConfig, WatchdogConfig).items() <= FIELD_FLAGS.items()
    run_options = _options(_parser(run_cli)) | {"--steps"}  # --steps: demo's
    assert {flag.split()[0] for flag in FIELD_FLAGS.values()} <= run_options


def test_ranges_come_from_the_settings() -> None:
    base = {"command": ("t.py",), "run_dir": Path("/tmp/r"), "run_id": "r", "node_id": "n",
            "rdzv_endpoint": "127.0.0.1:1"}
    with pytest.raises(ValueError, match=r"^warm_spares must be a whole number from -1 to 64, got 65$"):
        SupervisorConfig(**base, warm_spares=65)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^node_lost_timeout_seconds must be a number from 2 to 3600"):
        SupervisorConfig(**base, node_lost_timeout_seconds=float("nan"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^max_restarts must be a whole number"):
        SupervisorConfig(**base, max_restarts=True)  # type: ignore[arg-type]


def test_help_shows_the_sections_in_order() -> None:
    text = _parser(run_cli).format_help()
    at = [text.index(f"\n{title}:\n") for title in SECTIONS.values()]
    assert at == sorted(at)
    recovery = text[text.index("\nrestarts and recovery:\n"):text.index("\nfailure detection:\n")]
    assert "--max-restarts" in recovery and "--in-process-timeout" in recovery and "(default 30)" in recovery
    assert "--hang-floor" not in recovery
