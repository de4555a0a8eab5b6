"""Example 11's Python side: a model, its optimizer and learning-rate schedule, built and trained
in plain PyTorch; the Fortran simulation (python_training.f90) calls these functions."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Dropout(0.05), torch.nn.Linear(32, 1)
).double()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.995)
received = []  # what the simulation sent, kept so that a test can replay the run in Python


def train_step(state, tendency):
    """One optimizer step on this time step's data. `state` and `tendency` are the Fortran arrays
    (no copy): a column of n values each."""
    received.append((state.clone(), tendency.clone()))
    model.train()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(state.reshape(-1, 1)), tendency.reshape(-1, 1))
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def predict(state, out):
    """The learned tendency, written straight into the Fortran array `out`."""
    model.eval()
    with torch.no_grad():
        out.copy_(model(state.reshape(-1, 1)).reshape(out.shape))


def save(path):
    torch.save({"model": model.state_dict(), "received": received}, path)
