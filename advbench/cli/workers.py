"""Jobs in worker processes end with the `advbench` process that launched them.

A killed sweep (SIGKILL, SIGTERM: no chance to stop its workers) would otherwise leave joblib's
loky workers computing, writing parts after it is gone, and idling for minutes.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from pathlib import Path

PARENT_POLL_S = 0.5
"""How often a job in a worker process looks whether its parent is still there."""
SCHEDULED = ("SUBMITIT_EXECUTOR", "SLURM_JOB_ID")
"""Set in the jobs of schedulers that run them past the end of the session that submitted them."""


@functools.cache
def watch_parent(launcher: tuple[str, int]) -> None:
    """In a worker process of the `advbench` process `launcher` (host, pid), such as joblib's loky
    workers: end this process within `PARENT_POLL_S` of its parent's death.

    A killed sweep (SIGKILL, SIGTERM: no chance to stop its workers) would otherwise leave its
    workers computing, writing parts after it is gone, and idling for minutes. The parent is
    gone when this process is handed to another (the init process or a subreaper); a worker
    that starts its first job after the launcher died (importing torch takes seconds) ends at
    once, unless a scheduler runs it (`SCHEDULED`). Ending at once (`os._exit`) keeps the records whole: a part or chunk appears only by
    an atomic rename of a complete temporary file, and a leftover temporary file is removed by
    the next run. A job run in the launching process itself (the basic launcher) is not
    watched: `nohup advbench run ... &` outlives its shell. A job under another parent that still
    runs (submitit's controller, which outlives the session by design; Slurm's on another host)
    ends with that parent. Once per process: a worker runs many jobs, and the watch goes on between them.
    """
    host, pid = launcher
    if os.getpid() == pid and socket.gethostname() == host:
        return
    parent = os.getppid()
    if parent != pid and socket.gethostname() == host and not _running(pid) and not any(map(os.getenv, SCHEDULED)):
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="advbench-parent-watch", daemon=True).start()


def _running(pid: int) -> bool:
    """Whether process `pid` of this host runs (a killed one not yet reaped by its parent does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # no /proc (macOS): it exists
        return True
