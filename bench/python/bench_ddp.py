"""The data-parallel step of bench_ddp.f90 in Python: torch.nn.parallel.DistributedDataParallel
on Gloo (torch's own CPU backend), launched by bench/distributed.py with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. Rank 0 prints RESULT <ms per step>."""

import os
import sys
import time

import torch
import torch.distributed as dist


def mlp(features: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, features))


def main() -> None:
    features, hidden, batch, warmup, steps = map(int, sys.argv[1:6])
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(mlp(features, hidden))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    i = torch.arange(1, batch + 1, dtype=torch.float32)[:, None]
    j = torch.arange(1, features + 1, dtype=torch.float32)[None, :]
    x = torch.sin(0.01 * i * j + rank)
    y = torch.cos(0.02 * i + 0.03 * j + rank)
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # DDP averages during backward
        opt.step()
    total = time.perf_counter() - start
    if rank == 0:
        print(f"RESULT {1e3 * total / steps:.4f}")
    # Every rank is past its last collective; then leave without Gloo's teardown, whose thread
    # shutdown at exit sometimes aborts ("terminate called without an active exception").
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
