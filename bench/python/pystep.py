"""The Python side of the embedded-Python benchmark: the training step of bench.py's 'train' case
(same TorchScript model, Adam, MSE), called per step from Fortran (torch_pymodule) or from Python."""

import gc
import time

import torch

model = None
optim = None
inner = 0.0  # seconds spent inside step/noop: the work Python does anyway


def inner_seconds():
    return inner


def reset():
    global inner
    inner = 0.0


def setup(path):
    global model, optim
    model = torch.jit.load(path)
    model.train()
    optim = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
    # The objects that exist now (torch, the model; in the Python caller also numpy and the
    # benchmark script) are left out of later garbage collections: otherwise each collection's cost
    # depends on what else the calling process imported, and lands inside or outside the timed
    # function by chance, which the Fortran and Python callers would not share.
    gc.collect()
    gc.freeze()


def step(x, y):
    global inner
    t0 = time.perf_counter()
    # As every program of the benchmark runs TorchScript: without the profiling graph executor.
    with torch.jit.optimized_execution(False):
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
    value = loss.item()
    inner += time.perf_counter() - t0
    return value


def noop(x, y):
    """Nothing but the call: its time is the embedding's cost (tensors in, a float out)."""
    global inner
    t0 = time.perf_counter()
    inner += time.perf_counter() - t0
    return 0.0
