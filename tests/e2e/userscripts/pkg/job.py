"""``python -m pkg.job``: the all-reduce job run as a module (it tells which way it was started)."""

import sys

print(f"module-main argv0={sys.argv[0]}", flush=True)
sys.path.insert(0, __file__.rsplit("/", 2)[0])
import allreduce  # noqa: E402

allreduce.main()
