"""Classification of output produced for real here: a torch error under torchelastic's @record
(its error.json and stderr) and a real missing-module import, next to the hand-written corpus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainguard.classify import classify_paths

SCRIPT = """
import torch
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    return torch.ones(2, 3) @ torch.ones(4, 5)

main()
"""


def test_real_torchelastic_error_file_and_traceback(tmp_path: Path) -> None:
    err_json = tmp_path / "error.json"
    stderr = tmp_path / "rank0.log"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(err_json)}
    with stderr.open("w") as f:
        r = subprocess.run([sys.executable, str(script)], stderr=f, env=env, timeout=120)
    assert r.returncode != 0 and err_json.exists()
    by_file = {Path(c.source).name: c for c in classify_paths([err_json, stderr])}
    for c in by_file.values():
        assert c.category == "Software Bug", c
        assert "mat1 and mat2 shapes cannot be multiplied" in c.evidence[0].text
    log_lines = stderr.read_text().splitlines()
    key = by_file["rank0.log"].evidence[0]
    assert log_lines[key.line - 1].strip() == key.text


def test_real_missing_module(tmp_path: Path) -> None:
    log = tmp_path / "rank3.log"
    with log.open("w") as f:
        subprocess.run([sys.executable, "-c", "import trainguard_no_such_module_xyz"], stderr=f, timeout=60)
    [c] = classify_paths([log])
    assert c.category == "Dependency" and c.group == "Dependency"
    assert c.evidence[0].text.startswith("ModuleNotFoundError")
