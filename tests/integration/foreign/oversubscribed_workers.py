"""Two worker processes, each with a torch intra-op pool as wide as the machine thinks it is.

The classic oversubscription: every worker process assumes it owns all cores
(torch.set_num_threads(8) here, OMP defaults in the wild), so workers × threads ≫ cores.
usage: python oversubscribed_workers.py
"""

import multiprocessing as mp
import time

import torch


def work() -> None:
    torch.set_num_threads(8)
    a = torch.randn(512, 512)
    while True:
        a = torch.tanh(a @ a)


if __name__ == "__main__":
    procs = [mp.Process(target=work, name=f"worker-{i}") for i in range(2)]
    for p in procs:
        p.start()
    time.sleep(300)
