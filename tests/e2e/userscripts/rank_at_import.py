"""The plain DDP script, started through a module that reads its rank when imported (``rank_config``), as
some scripts' configuration modules do. A warm spare cannot stand in for such a script's cold start."""

import os
import sys

import rank_config  # reads RANK at import

if int(os.environ["RANK"]) != rank_config.RANK:
    print(f"rank_at_import: imported with rank {rank_config.RANK}, running as {os.environ['RANK']}", flush=True)
    sys.exit(3)
print(f"rank_at_import: rank {rank_config.RANK} as imported", flush=True)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unmodified"))
import plain_ddp  # noqa: E402

plain_ddp.main()
