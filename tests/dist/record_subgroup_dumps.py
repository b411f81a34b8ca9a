"""Record real gloo dumps of ranks lost inside a tensor-parallel sub-group collective, for the unit tests.

Run ``python tests/dist/record_subgroup_dumps.py`` (torch with gloo): each case is a real 8-rank job of
`_localize_workers.py` (scenario ``tpdie-<tp>-<dead>``); the dumps the live ranks wrote (the dead rank
writes none) and the snapshot of step 2 are copied to tests/unit/recorded/subgroup-crash-tp<tp>-dead<d>/.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_localize_real_dumps import run_job

CASES = [(4, 5), (4, 0), (4, 7), (2, 5), (2, 2), (2, 4)]
"""(tensor-parallel group size, dead rank): groups of 4 (2x4) and of 2 (4x2), the dead rank at the
first, a middle and the last position of a group and of the job."""

DEST = Path(__file__).parents[1] / "unit" / "recorded"


def main() -> None:
    only = {tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]}
    for tp, dead in CASES:
        if only and (tp, dead) not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = run_job(Path(tmp) / "job", f"tpdie-{tp}-{dead}", 8, dead=(dead,), timeout=400)
            dest = DEST / f"subgroup-crash-tp{tp}-dead{dead}"
            shutil.rmtree(dest, ignore_errors=True)
            (dest / "healthy").mkdir(parents=True)
            for f in sorted(out.glob("fr_trace_rank_*.pkl")):
                shutil.copy(f, dest / f.name)
            for f in sorted((out / "healthy").glob("fr_trace_rank_*.pkl")):
                shutil.copy(f, dest / "healthy" / f.name)
            print(f"tp={tp} dead={dead}: {dest}", flush=True)


if __name__ == "__main__":
    main()
