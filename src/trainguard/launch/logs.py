"""Where workers' output goes: always to the ``attempt-<k>/`` log files (the evidence reads them), and, as
torchrun does, to the console with a rank prefix, subject to ``--redirects``, ``--tee`` and
``--local-ranks-filter``."""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from trainguard.launch.config import SupervisorConfig
from trainguard.safefs import make_dirs


class RunDirLogs(LogsSpecs):
    """Worker logs at ``<logs>/attempt-<k>/rank-<r>.log`` (stderr) and ``rank-<r>.stdout.log``.

    Every stream is redirected to its file; the streams that should also reach the console are
    handed to torch as "tee" files, which the process context tails line by line onto the
    supervisor's stdout and stderr with the agent's line prefix (``[rank<r>]: `` by default). That is
    how torchrun's ``--tee`` works too, so the console shows what torchrun would show, and the files
    hold everything whatever the console shows.
    """

    def __init__(self, cfg: SupervisorConfig, attempt: Callable[[], int]) -> None:
        super().__init__(log_dir=str(cfg.layout.logs_base), redirects=Std.ALL,
                         local_ranks_filter=set(cfg.local_ranks_filter) or None)
        self._cfg = cfg
        self._layout = cfg.layout
        self._attempt = attempt

    @property
    def root_log_dir(self) -> str:
        return str(self._layout.logs_base)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        attempt = self._attempt()
        make_dirs(self._layout.logs_dir(attempt))
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank = int(env.get("RANK", str(local_rank)))
            dest.stdouts[local_rank] = str(self._layout.rank_stdout(attempt, rank))
            dest.stderrs[local_rank] = str(self._layout.rank_log(attempt, rank))
            dest.error_files[local_rank] = str(self._layout.rank_error_file(attempt, rank))
            env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local_rank]
            shown = self._cfg.console_streams(local_rank)
            if shown & Std.OUT:
                dest.tee_stdouts[local_rank] = dest.stdouts[local_rank]
            if shown & Std.ERR:
                dest.tee_stderrs[local_rank] = dest.stderrs[local_rank]
        return dest
