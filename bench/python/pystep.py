"""The Python side of the embedded-Python benchmark: the training step of bench.py's 'train' case
(same TorchScript model, Adam, MSE), called per step from Fortran (torch_pymodule) or from Python."""

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
