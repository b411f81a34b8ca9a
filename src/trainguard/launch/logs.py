"""Where workers' output goes: the run directory's ``logs/attempt-<k>/`` files (and, later, the console)."""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from trainguard.launch.config import SupervisorConfig


class RunDirLogs(LogsSpecs):
    """Worker logs at ``logs/attempt-<k>/rank-<r>.log`` (stderr) and ``rank-<r>.stdout.log``."""

    def __init__(self, cfg: SupervisorConfig, attempt: Callable[[], int]) -> None:
        super().__init__(log_dir=str(cfg.layout.logs_base), redirects=Std.ALL)
        self._layout = cfg.layout
        self._attempt = attempt

    @property
    def root_log_dir(self) -> str:
        return str(self._layout.logs_base)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        attempt = self._attempt()
        self._layout.logs_dir(attempt).mkdir(parents=True, exist_ok=True)
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank = int(env.get("RANK", str(local_rank)))
            dest.stdouts[local_rank] = str(self._layout.rank_stdout(attempt, rank))
            dest.stderrs[local_rank] = str(self._layout.rank_log(attempt, rank))
            dest.error_files[local_rank] = str(self._layout.rank_error_file(attempt, rank))
            env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local_rank]
        return dest
