"""Where workers' output goes: always to the ``attempt-<k>/`` log files (the evidence reads them), and, as
torchrun does, to the console with a rank prefix, subject to ``--redirects``, ``--tee`` and
``--local-ranks-filter``; each file capped at ``--max-log-mb`` with one rotated file (`trainguard.launch.output`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from string import Template

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from trainguard.core.safefs import make_dirs
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.output import LogPump, PumpedFile


class RunDirLogs(LogsSpecs):
    """Worker logs at ``<logs>/attempt-<k>/rank-<r>.log`` (stderr) and ``rank-<r>.stdout.log``.

    Every stream is redirected to its file. The streams that should also reach the console are tailed onto
    the supervisor's stdout and stderr with the agent's line prefix (``[rank<r>]: `` by default), as
    torchrun's ``--tee`` does, so the console shows what torchrun would show and the files hold everything
    whatever the console shows. The tailing is trainguard's `LogPump`, not torch's tailer (which reads a line
    whole, however long): torch is handed no "tee" files. The pump of an attempt also caps its files, and
    ends (after showing what is left) in `finish`, which the agent calls once the attempt's workers are gone.
    """

    def __init__(self, cfg: SupervisorConfig, attempt: Callable[[], int]) -> None:
        super().__init__(log_dir=str(cfg.layout.logs_base), redirects=Std.ALL,
                         local_ranks_filter=set(cfg.local_ranks_filter) or None)
        self._cfg = cfg
        self._layout = cfg.layout
        self._attempt = attempt
        self.pump: LogPump | None = None
        """The current attempt's console tail and size cap."""

    @property
    def root_log_dir(self) -> str:
        return str(self._layout.logs_base)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        attempt = self._attempt()
        make_dirs(self._layout.logs_dir(attempt))
        dest = LogsDest()
        files: list[PumpedFile] = []
        for local_rank, env in envs.items():
            rank = int(env.get("RANK", str(local_rank)))
            dest.stdouts[local_rank] = str(self._layout.rank_stdout(attempt, rank))
            dest.stderrs[local_rank] = str(self._layout.rank_log(attempt, rank))
            dest.error_files[local_rank] = str(self._layout.rank_error_file(attempt, rank))
            env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local_rank]
            shown = self._cfg.console_streams(local_rank)
            prefix = Template(self._cfg.log_line_prefix).safe_substitute(
                role_name=env.get("ROLE_NAME", self._cfg.role), rank=rank, local_rank=local_rank)
            # The console streams as they are now (with --json, stdout is redirected to stderr), as torch's did.
            files.append(PumpedFile(Path(dest.stdouts[local_rank]), sys.stdout if shown & Std.OUT else None, prefix))
            files.append(PumpedFile(Path(dest.stderrs[local_rank]), sys.stderr if shown & Std.ERR else None, prefix))
        self.finish()  # the previous attempt's (its workers are gone)
        self.pump = LogPump(files, self._cfg.max_log_mb * 1024 * 1024).start()
        return dest

    def finish(self) -> None:
        """The attempt's workers are gone: show the rest of their output and stop following their files."""
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.stop()
