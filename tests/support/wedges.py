"""The wedge injector (wedge_shim.c, LD_PRELOAD): built from its source, and the
environment that arms it in one rank of a job.

Armed, the shim lets the rank run until `trigger` exists, then makes its ring worker
spin on a socket that never delivers: in user space (`mode` "user") or through the
kernel ("syscall"); or park it asleep in the read for ever ("park": a quiet hang; `rank`
"*" arms every rank). An Open MPI rank (its rank from OMPI_COMM_WORLD_RANK: give the
environment to mpirun, its local ranks inherit it) is wedged at its TCP sockets'
readv(), which its TCP transport reads with. Used by the wedge tests (one host, the
two-host bed, the simulated Mac's MPI wedge) and benchmarks/wedge.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import SUPPORT


def build_shim(folder: Path) -> Path:
    """The shim, compiled into `folder` now."""
    out = folder / "wedge.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out),
                    str(SUPPORT / "wedge_shim.c"), "-ldl"], check=True)
    return out


def armed(shim: Path, trigger: Path, mode: str = "user", rank: int | str = 1) -> dict[str, str]:
    """The environment that wedges `rank` of a job once `trigger` is touched."""
    return {"LD_PRELOAD": str(shim), "MLXWD_WEDGE_RANK": str(rank),
            "MLXWD_WEDGE_FILE": str(trigger), "MLXWD_WEDGE_MODE": mode}
