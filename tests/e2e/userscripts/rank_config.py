"""A configuration module that reads the rank from the environment when imported (see rank_at_import.py)."""

import os

RANK = int(os.environ.get("RANK", "-1"))
