"""A warm spare process: it preloads torch and the script's imports, then takes a rank's environment and log
files from its pipe and runs the script as ``__main__``; a waiting spare is stopped at the end."""

from __future__ import annotations

import time
from pathlib import Path

from trainguard.launch.warm import WarmSpares

SCRIPT = '''
import os, sys
import json
print(json.dumps({"rank": os.environ["RANK"], "argv": sys.argv[1:], "name": __name__,
                  "torch_loaded_before": "torch" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
'''


def _wait_ready(log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "waiting" in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"spare not ready: {log.read_text() if log.exists() else 'no log'}")


def test_a_spare_takes_a_rank_and_runs_the_script_in_its_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    spares = WarmSpares(2, ("-u", str(script), "-u", "--lr", "3"), tmp_path / "spares", grace_seconds=1.0)
    assert spares._command()[-5:] == ["trainguard.worker.warm", str(script), "-u", "--lr", "3"]
    spares.fill()
    _wait_ready(tmp_path / "spares" / "spare-0.log")
    out, err = tmp_path / "rank-3.stdout.log", tmp_path / "rank-3.log"
    out.write_text("earlier line\n")
    proc = spares.take({"RANK": "3", "EXIT_CODE": "5"}, str(out), str(err))
    assert proc is not None
    assert proc.wait(timeout=60) == 5
    lines = out.read_text().splitlines()
    assert lines[0] == "earlier line"  # appended, as the console tailer expects
    assert '"rank": "3"' in lines[1] and '"argv": ["-u", "--lr", "3"]' in lines[1]
    assert '"name": "__main__"' in lines[1] and '"torch_loaded_before": true' in lines[1]
    assert "to stderr" in err.read_text()
    # The other spare still waits; closing stops it.
    [waiting] = spares.spares
    assert waiting.poll() is None
    spares.close()
    assert waiting.poll() is not None and spares.spares == []


def test_an_automatic_pool_loads_one_spare_at_a_time_and_names_its_node(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "spares"
    pools = [WarmSpares(2, ("-u", str(script)), logs, grace_seconds=1.0, eager=False, name=f"spare-{node}")
             for node in ("n0", "n1")]  # two nodes of one job writing into one run folder
    try:
        pools[0].fill()
        pools[0].fill()  # the first is still importing torch: no second one yet
        assert pools[0].alive() == 1 and [p.name for p in logs.iterdir()] == ["spare-n0-0.log"]
        _wait_ready(logs / "spare-n0-0.log")
        pools[0].fill()
        assert pools[0].alive() == 2
        pools[1].fill()
        assert sorted(p.name for p in logs.iterdir()) == ["spare-n0-0.log", "spare-n0-1.log", "spare-n1-0.log"]
    finally:
        for pool in pools:
            pool.close()
