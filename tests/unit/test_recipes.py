"""The Slurm and Kubernetes recipes in examples/ are valid: the batch script parses, every trainguard option they
use exists, and the manifests carry the fields Kubernetes requires."""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.cli import run as run_cli

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "trainguard.sbatch"
MANIFESTS = sorted((ROOT / "examples" / "kubernetes").glob("*.yaml"))
NOT_TRAINGUARD = {"--kill-on-bad-exit", "--ntasks-per-node", "--no-kill", "--nodes", "--ntasks"}
"""srun's options in the batch script."""


def _run_options() -> set[str]:
    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    return {s for action in parser._actions for s in action.option_strings}


def test_the_batch_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def test_every_option_the_batch_script_gives_trainguard_exists() -> None:
    options = _run_options()
    text = SBATCH.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    # Everything before "--" of each trainguard invocation and of the rendezvous options it is handed.
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", code)) - NOT_TRAINGUARD
    assert {"--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--node-id", "--run-dir", "--json"} <= used
    assert used <= options, used - options
    assert "--requeue" in text and "scontrol requeue" in text
    # Exit 5 (an excluded node) is kept out of the requeued job; 1 and 130 mean "restart me".
    assert re.search(r"^\s*5\) excluded\+=", text, re.M) and re.search(r"^\s*1\|130\) requeue=1", text, re.M)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_a_manifest_has_what_kubernetes_requires(path: Path) -> None:
    docs = _docs(path)
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata", "spec"} <= doc.keys(), doc
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
        kind, spec = doc["kind"], doc["spec"]
        if kind == "Service":
            assert doc["apiVersion"] == "v1" and spec["selector"] and spec["ports"]
            assert all(isinstance(p["port"], int) for p in spec["ports"])
        elif kind in ("Job", "Deployment"):
            template = spec["template"]
            assert doc["apiVersion"] == ("batch/v1" if kind == "Job" else "apps/v1")
            assert all(c["name"] and c["image"] and c["command"] for c in _containers(doc))
            if kind == "Deployment":
                assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
            else:
                _check_job(doc, docs)
        else:
            raise AssertionError(f"unexpected kind {kind} in {path.name}")


def _check_job(doc: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    spec = doc["spec"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= spec["successPolicy"]["rules"][0][
        "succeededCount"]
    # backoffLimitPerIndex is required by the FailIndex action that keeps an excluded node (exit 5) out.
    rule = spec["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [5] and "backoffLimitPerIndex" in spec
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    trainer = _containers(doc)[0]
    assert rule["onExitCodes"]["containerName"] == trainer["name"]
    command = trainer["command"]
    assert command[:2] == ["trainguard", "run"] and "--" in command
    flags = [a for a in command[2:command.index("--")] if a.startswith("-")]
    assert set(flags) <= _run_options(), set(flags) - _run_options()
    values = dict(itertools.pairwise(command))
    # The rendezvous endpoint names a Service of the same file (pod 0 behind the headless one, or etcd).
    host = values["--rdzv-endpoint"].rsplit(":", 1)[0].split(".")[-1]
    services = [d for d in docs if d["kind"] == "Service"]
    assert host in {s["metadata"]["name"] for s in services}
    if values["--rdzv-backend"] == "c10d":
        headless = next(s for s in services if s["metadata"]["name"] == host)
        assert headless["spec"]["clusterIP"] == "None" and pod["subdomain"] == host
    env = {e["name"] for e in trainer["env"]}
    assert "$(NODE_NAME)" in command and "NODE_NAME" in env
    assert shlex.join(command)  # plain strings only


def test_both_rendezvous_backends_have_a_manifest() -> None:
    backends = set()
    for path in MANIFESTS:
        for doc in _docs(path):
            if doc["kind"] == "Job":
                command = _containers(doc)[0]["command"]
                backends.add(command[command.index("--rdzv-backend") + 1])
    assert backends == {"c10d", "etcd-v2"}
