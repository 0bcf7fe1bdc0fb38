"""A real hang for the guard's watchdog and `zerodoctor diagnose`: 2 gloo ranks; rank 0 waits in a barrier that
rank 1 never joins (it stays in `stuck_elsewhere`). Each rank's guard monitor arms its faulthandler watchdog
with a 2 s first-step timeout, so both dump their stacks; the test then kills the launch, as a scheduler would.

Run under torchrun: python -m torch.distributed.run --nproc_per_node 2 hang_job.py OUT
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def stuck_elsewhere() -> None:
    while True:  # e.g. a data loader that never returns
        time.sleep(0.5)


def main() -> None:
    import torch.distributed as dist

    from zerodoctor.guard.monitor import Monitor
    from zerodoctor.guard.options import GuardOptions

    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    mon = Monitor(GuardOptions(run_dir=out, hang_first_s=2.0))
    mon.train_begin()
    if int(os.environ["RANK"]) == 1:
        stuck_elsewhere()
    dist.barrier()


if __name__ == "__main__":
    main()
