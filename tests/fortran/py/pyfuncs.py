"""Python functions the Fortran test program test_python.f90 calls through torch_pymodule."""

import torch

calls = 0
kept = None


def add(a, b):
    return a + b


def echo(*args):
    """Every argument back, unchanged (tensors come back over the same memory)."""
    return args


def kinds(*args):
    return ",".join(type(a).__name__ for a in args)


def grad_flags(*tensors):
    return tuple(t.requires_grad for t in tensors)


def layout(t):
    """Shape, strides and whether it is a view of the caller's memory (no copy)."""
    return (*t.shape, *t.stride())


def scale_(t, factor):
    """Writes into the caller's array."""
    t.mul_(factor)


def keep(t):
    global kept
    kept = t


def kept_sum():
    return float(kept.sum())


def arange(n):
    return torch.arange(n, dtype=torch.float64)


def dtypes():
    return torch.tensor([1.0, -1.0]) > 0, torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.complex64)


def negated_view(x):
    """-x as torch's lazily negated view of a complex tensor's imaginary part (the negative bit)."""
    return torch.complex(x, x).conj().imag


def lone_surrogate():
    return "\ud800"


def count():
    global calls
    calls += 1
    return calls


def fail(message):
    raise ValueError(message)


def nothing():
    return None


def a_dict():
    return {"a": 1}


def scalar_tensor(x):
    return x.sum()


def square_sum(x):
    """A result with autograd history (it is detached when it crosses back)."""
    return (x * x).sum()


last_seen = None  # a weak reference to the tensor identity_of got last


def identity_of(x):
    """Whether x is the very tensor object the previous call of identity_of got."""
    import weakref

    global last_seen
    same = last_seen is not None and last_seen() is x
    last_seen = weakref.ref(x)
    return same


def total(x):
    return float(x.sum())


def add_one(x):
    x.add_(1)


def add_dim(x):
    """Changes its argument's sizes in place, and returns its number of dimensions after that."""
    x.unsqueeze_(0)
    return x.dim()


def input_gradient(x):
    """The gradient of sum(x**2) with respect to the argument itself (2 * sum(x))."""
    x.requires_grad_()
    (x * x).sum().backward()
    return float(x.grad.sum())


def gradient_then_off(x):
    """input_gradient, with requires_grad switched off again (the gradient stays on the tensor)."""
    x.requires_grad_()
    (x * x).sum().backward()
    x.requires_grad_(False)
    return float(x.grad.sum())
