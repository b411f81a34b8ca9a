"""The fleet database: an index of runs, their events and per-host history, on SQLite or PostgreSQL.

It is an index, never the source of truth: everything in it can be rebuilt from run directories
(``trainguard index RUNS...``). A run is known by its content, never its folder name (`run_identity`), and
each event by (run, writer, line), so indexing the same run twice, from a copy, or from several processes
and hosts at once neither loses nor duplicates a record. SQLite (one file, WAL mode) is the embedded
default for one machine; a ``postgresql://`` URL puts it on a server that the agents of many hosts and jobs
share. One layout and one set of statements serve both. See docs/fleetdb.md.

Modules: `store` (`FleetDB`), `run_rows` (what a run contributes), `schema` (layout and migrations),
`dialect` (where the engines differ), `backend`, `sqlite_backend`, `postgres_backend` (connections and
errors), `location` (file or URL, the default, redaction), `records` (what readers get back).
"""

from trainguard.health.fleetdb.location import (
    data_dir,
    default_db_path,
    default_location,
    is_url,
    redact,
    resolve,
)
from trainguard.health.fleetdb.records import (
    DRAIN_KINDS,
    HOST_KINDS,
    LINK_KINDS,
    FleetDBError,
    HostRecord,
    IndexResult,
    RunRecord,
)
from trainguard.health.fleetdb.run_rows import run_identity
from trainguard.health.fleetdb.schema import LEGACY_PREFIX, SCHEMA_VERSION
from trainguard.health.fleetdb.store import FleetDB

__all__ = [
    "DRAIN_KINDS",
    "HOST_KINDS",
    "LEGACY_PREFIX",
    "LINK_KINDS",
    "SCHEMA_VERSION",
    "FleetDB",
    "FleetDBError",
    "HostRecord",
    "IndexResult",
    "RunRecord",
    "data_dir",
    "default_db_path",
    "default_location",
    "is_url",
    "redact",
    "resolve",
    "run_identity",
]
