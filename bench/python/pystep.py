"""The Python side of the embedded-Python benchmark: the training step of bench.py's 'train' case
(same TorchScript model, Adam, MSE), called per step from Fortran (torch_pymodule) or from Python."""

import torch

model = None
optim = None


def setup(path):
    global model, optim
    model = torch.jit.load(path)
    model.train()
    optim = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)


def step(x, y):
    # As every program of the benchmark runs TorchScript: without the profiling graph executor.
    with torch.jit.optimized_execution(False):
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
    return loss.item()


def noop(x, y):
    """Nothing but the call: its time is the embedding's cost (tensors in, a float out)."""
    return 0.0
