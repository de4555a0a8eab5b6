"""A pytorch-fortran training script (ftn_pytorch_forward/train/save) for ftn_pymodule.f90:
a model with dropout, SGD with momentum and a step learning-rate schedule, all in Python.
Written in pytorch-fortran's convention: the wrapped inputs arrive as one list (here
[x, scale]), train gets the target after it and returns (is_completed, loss)."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
steps = 0


def ftn_pytorch_forward(inputs):
    x, scale = inputs
    model.eval()
    with torch.no_grad():
        return model(x) * scale


def ftn_pytorch_train(inputs, target):
    global steps
    x, scale = inputs
    model.train()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x) * scale, target)
    loss.backward()
    optimizer.step()
    scheduler.step()
    steps += 1
    return steps >= 25, loss.item()


def ftn_pytorch_save(file_name):
    torch.save(model.state_dict(), file_name)
