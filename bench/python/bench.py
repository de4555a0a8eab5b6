"""Benchmark, Python side: the same work as bench_fortran with PyTorch in eager Python.
Same command line and output as bench_fortran."""

import sys
import time

import numpy as np
import torch


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def eager_copy(path):
    """The eager torch.nn.Sequential of the benchmark's TorchScript MLP (Linear and Tanh layers),
    with its weights: what a Python user trains."""
    scripted = torch.jit.load(path)
    layers = []
    for child in scripted.children():
        if child.original_name == "Linear":
            out_features, in_features = child.weight.shape
            layer = torch.nn.Linear(in_features, out_features).to(child.weight.dtype)
            layer.load_state_dict(child.state_dict())
        elif child.original_name == "Tanh":
            layer = torch.nn.Tanh()
        else:
            raise SystemExit(f"bench.py: no eager copy of a {child.original_name} layer")
        layers.append(layer)
    return torch.nn.Sequential(*layers)


def model_case(mode, path, batch, n_in, n_out, iters):
    rng = np.random.default_rng(0)
    # Column-major arrays, as the Fortran program passes them.
    x = torch.from_numpy(np.asfortranarray(rng.random((batch, n_in))))
    y = torch.from_numpy(np.asfortranarray(rng.random((batch, n_out))))
    pred = torch.from_numpy(np.asfortranarray(np.zeros((batch, n_out))))
    model = eager_copy(path)
    model.train(mode != "infer")
    optim = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
    warm = max(10, iters // 10)
    for i in range(1, warm + iters + 1):
        if i == warm + 1:
            t0 = time.perf_counter()
        if mode == "infer":
            with torch.no_grad():
                pred.copy_(model(x))
        else:
            optim.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optim.step()
            loss.item()
        if mode == "rss" and i == warm + 1000:
            print(f"rss_at_1000 {status_kib('VmRSS:')}")
    print(f"seconds {time.perf_counter() - t0:.8e}")
    if mode == "rss":
        print(f"rss_at_end {status_kib('VmRSS:')}")


def compiled_case(path, batch, n_in, n_out, iters):
    """An AOTInductor package run from Python (torch._inductor.aoti_load_package)."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy(np.asfortranarray(rng.random((batch, n_in))))
    pred = torch.from_numpy(np.asfortranarray(np.zeros((batch, n_out))))
    runner = torch._inductor.aoti_load_package(path)
    warm = max(10, iters // 10)
    with torch.no_grad():
        for i in range(1, warm + iters + 1):
            if i == warm + 1:
                t0 = time.perf_counter()
            pred.copy_(runner(x.contiguous()))
    print(f"seconds {time.perf_counter() - t0:.8e}")


def pymodule_case(mode, path, batch, n_in, n_out, iters, script):
    """The same calls as bench_fortran's pymodule/pycall cases, made from Python."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pystep", script)
    pystep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pystep)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(np.asfortranarray(rng.random((batch, n_in))))
    y = torch.from_numpy(np.asfortranarray(rng.random((batch, n_out))))
    pystep.setup(path)
    fn = pystep.step if mode == "pymodule" else pystep.noop
    warm = max(10, iters // 10)
    for i in range(1, warm + iters + 1):
        if i == warm + 1:
            pystep.reset()
            t0 = time.perf_counter()
        fn(x, y)
    print(f"seconds {time.perf_counter() - t0:.8e}")
    print(f"inner_seconds {pystep.inner_seconds():.8e}")


def ops_case(n, iters):
    a, b, c = (torch.from_numpy(np.random.default_rng(i).random(n)) for i in range(3))
    warm = max(10, iters // 10)
    for i in range(1, warm + iters + 1):
        if i == warm + 1:
            t0 = time.perf_counter()
        c.copy_(a * b + a - b / 2)
    print(f"seconds {time.perf_counter() - t0:.8e}")


def from_array_case(n, iters):
    a = np.ones(n)
    warm = max(10, iters // 10)
    for i in range(1, warm + iters + 1):
        if i == warm + 1:
            t0 = time.perf_counter()
        t = torch.from_numpy(a)
        del t
    print(f"seconds {time.perf_counter() - t0:.8e}")


class Square(torch.autograd.Function):
    """y = x*x as a custom function."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x


def autograd_case(custom, n, iters):
    x = torch.from_numpy(np.random.default_rng(0).random(n)).requires_grad_(True)
    warm = max(10, iters // 10)
    for i in range(1, warm + iters + 1):
        if i == warm + 1:
            t0 = time.perf_counter()
        y = Square.apply(x) if custom else x * x
        y.sum().backward()
        x.grad.zero_()
    print(f"seconds {time.perf_counter() - t0:.8e}")


def main(argv):
    mode = argv[1]
    if mode in ("train", "infer", "rss"):
        model_case(mode, argv[2], *map(int, argv[3:7]))
    elif mode == "compiled":
        compiled_case(argv[2], *map(int, argv[3:7]))
    elif mode in ("pymodule", "pycall"):
        pymodule_case(mode, argv[2], *map(int, argv[3:7]), argv[7])
    elif mode == "ops":
        ops_case(int(argv[2]), int(argv[3]))
    elif mode == "from_array":
        from_array_case(int(argv[2]), int(argv[3]))
    elif mode in ("custom", "builtin"):
        autograd_case(mode == "custom", int(argv[2]), int(argv[3]))
    else:
        return 2
    print(f"peak_rss_kib {status_kib('VmHWM:')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
