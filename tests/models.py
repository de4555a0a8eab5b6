"""Models and reference data for the Fortran tests, written by PyTorch at test time.

Each reference file holds numbers one per line in Fortran (column-major) order, preceded by a
line with their count, so Fortran reads them with list-directed input.
"""

from __future__ import annotations

from pathlib import Path

import torch


def write_values(path: Path, tensor: torch.Tensor) -> None:
    """Values of ``tensor`` in Fortran order: element (i, j, ...) <-> array(i+1, j+1, ...)."""
    t = tensor.detach().cpu()
    flat = t.permute(*reversed(range(t.dim()))).reshape(-1) if t.dim() > 1 else t.reshape(-1)
    lines = [str(flat.numel())] + [repr(v) for v in flat.double().tolist()]
    path.write_text("\n".join(lines) + "\n")


class SimpleNet(torch.nn.Module):
    def __init__(self, n: int = 5):
        super().__init__()
        self.fc = torch.nn.Linear(n, n)

    def forward(self, x):
        return torch.tanh(self.fc(x)) * 2.0


class TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return a * b + a


class TupleNet(torch.nn.Module):
    def forward(self, x):
        return 2.0 * x, x + 1.0


class UInt8Net(torch.nn.Module):
    """Unsigned bytes out (a mask, an image): 200 does not fit a signed 8-bit array."""

    def forward(self, x):
        return (x * 0 + 200).to(torch.uint8)


class ScalarArgs(torch.nn.Module):
    """A forward that takes numbers and a logical besides a tensor (pytorch-fortran's add_scalar)."""

    def forward(self, x, scale: float, n: int, flag: bool):
        y = x * scale + n
        if flag:
            y = y + 2.0
        return y


class DictNet(torch.nn.Module):
    def forward(self, x):
        return {"y": x}


class WithBuffer(torch.nn.Module):
    """Parameters and a buffer; `buffer_size` 2 and 3 give two models whose parameters match
    but whose buffers do not (checkpoint load must refuse, before changing anything)."""

    def __init__(self, buffer_size: int = 2):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.register_buffer("scale", torch.full((buffer_size,), 0.5))

    def forward(self, x):
        return self.fc(x) * self.scale.sum()


class WithoutBuffer(torch.nn.Module):
    """WithBuffer's parameters and no buffer: a checkpoint of WithBuffer holds a buffer this model
    has not (checkpoint load must refuse it)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Batched(torch.nn.Module):
    """Acts on [batch, features] inputs: a Linear layer then a per-row sum appended as a column."""

    def __init__(self, features: int = 4, out: int = 3):
        super().__init__()
        self.lin = torch.nn.Linear(features, out)

    def forward(self, x):
        y = self.lin(x)
        return torch.cat([y, x.sum(dim=1, keepdim=True)], dim=1)


def build(directory: Path) -> Path:
    """Write every model and reference file into ``directory`` and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1234)

    for dtype, tag in ((torch.float32, "f32"), (torch.float64, "f64")):
        net = SimpleNet().to(dtype).eval()
        scripted = torch.jit.script(net)
        scripted.save(str(directory / f"simplenet_{tag}.pt"))
        x = torch.linspace(-1.0, 1.0, 5, dtype=dtype)
        write_values(directory / f"simplenet_{tag}_in.txt", x)
        with torch.no_grad():
            write_values(directory / f"simplenet_{tag}_out.txt", net(x))

    torch.jit.script(TwoInputs()).save(str(directory / "two_inputs.pt"))
    torch.jit.script(TupleNet()).save(str(directory / "tuple_net.pt"))
    torch.jit.script(DictNet()).save(str(directory / "dict_net.pt"))
    torch.jit.script(UInt8Net()).save(str(directory / "uint8_net.pt"))
    torch.jit.script(ScalarArgs()).save(str(directory / "scalar_args.pt"))
    (directory / "py_raises.py").write_text("def fail(message):\n    raise ValueError(message)\n")

    batched = Batched().double().eval()
    torch.jit.script(batched).save(str(directory / "batched.pt"))
    xb = torch.arange(1, 6 * 4 + 1, dtype=torch.float64).reshape(6, 4) / 10.0
    write_values(directory / "batched_in.txt", xb)
    with torch.no_grad():
        write_values(directory / "batched_out.txt", batched(xb))

    write_math_inputs(directory)
    build_training(directory)

    # A model file that exists but is not TorchScript.
    (directory / "corrupt.pt").write_bytes(b"PK\x03\x04 this is not a TorchScript archive" * 10)
    return directory


if __name__ == "__main__":
    import sys

    build(Path(sys.argv[1]))


# ----------------------------------------------------------------------------- tensor math
# Inputs of tests/fortran/test_math.f90 (written to math_inputs.txt) and the PyTorch reference
# for every case it records (compared by tests/test_math.py).

def math_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "a": torch.rand(2, 3, generator=g, dtype=torch.float64) + 0.5,
        "b": torch.rand(2, 3, generator=g, dtype=torch.float64) + 0.5,
        "c": torch.rand(3, generator=g, dtype=torch.float64) + 0.5,
        "a32": (torch.rand(2, 3, generator=g, dtype=torch.float64) + 0.5).float(),
        "i32": torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32),
    }


def write_math_inputs(directory: Path) -> None:
    for name, t in math_inputs().items():
        write_values(directory / f"math_{name}.txt", t)


# ----------------------------------------------------------------------------- training
# Model, data and cases of tests/fortran/test_train.f90; tests/test_train.py replays each case
# with torch.optim in Python and compares the trajectories.

def train_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


def train_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.rand(16, 4, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.stack([torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2], torch.cos(x[:, 3]) - x[:, 0]], dim=1)
    return x, y


def loss_data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "pred": torch.randn(6, 4, generator=g, dtype=torch.float64),
        "target": torch.randn(6, 4, generator=g, dtype=torch.float64),
        "classes": torch.tensor([0, 3, 1, 2, 3, 0], dtype=torch.int64),
        "probs": torch.softmax(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1),
        "binary": (torch.rand(6, 4, generator=g, dtype=torch.float64) > 0.5).double(),
        "class_weight": torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=torch.float64),
        "pos_weight": torch.tensor([1.0, 3.0, 0.5, 2.0], dtype=torch.float64),
    }


def build_training(directory: Path) -> None:
    torch.jit.script(train_model()).save(str(directory / "train_mlp.pt"))
    x, y = train_data()
    write_values(directory / "train_x.txt", x)
    write_values(directory / "train_y.txt", y)
    for name, t in loss_data().items():
        write_values(directory / f"loss_{name}.txt", t)
    torch.manual_seed(4)
    big = torch.nn.Linear(2000, 2000).double()
    torch.jit.script(big).save(str(directory / "big_linear.pt"))
    torch.jit.script(torch.nn.Linear(3, 3).double()).save(str(directory / "other_model.pt"))
    # a parameter whose name is 300 characters long ("www...w.weight")
    from collections import OrderedDict
    torch.jit.script(torch.nn.Sequential(OrderedDict([("w" * 300, torch.nn.Linear(2, 2))]))).save(
        str(directory / "long_names.pt"))
    torch.manual_seed(6)
    torch.jit.script(WithBuffer(2).double()).save(str(directory / "buffer2.pt"))
    torch.manual_seed(7)
    torch.jit.script(WithBuffer(3).double()).save(str(directory / "buffer3.pt"))
    torch.jit.script(WithoutBuffer().double()).save(str(directory / "no_buffer.pt"))


class MultiIO(torch.nn.Module):
    """Two inputs, two outputs, elementwise (the compiled code computes them exactly as eager)."""

    def forward(self, a, b):
        return a * b + a, 2.0 * b - a


class MLP(torch.nn.Module):
    def __init__(self, n_in: int = 5, n_hidden: int = 16, n_out: int = 3):
        super().__init__()
        self.l1 = torch.nn.Linear(n_in, n_hidden)
        self.l2 = torch.nn.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


def compile_pt2(model: torch.nn.Module, inputs: tuple, path: Path, dynamic_batch: bool = False) -> Path:
    """torch.export + AOTInductor: the package a Fortran program loads (dim 0 dynamic if asked)."""
    shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=4096)
        shapes = tuple({0: batch} for _ in inputs)
    program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    # torch.export traces a dynamic size as >= 2 (its 0/1 specialisation), so the package's input
    # checks would refuse batch 1; these models do not depend on it (the test runs batch 1).
    configs = {"aot_inductor.check_lowerbound": False} if dynamic_batch else {}
    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
    return path


def build_compiled(directory: Path) -> Path:
    """AOTInductor packages and the reference outputs of their eager models (tests/test_compiled.py)."""
    torch.manual_seed(4321)
    # Multi-input, multi-output, static shapes (2, 3), float64.
    a = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).reshape(3, 2).t()  # Fortran-order values
    b = torch.linspace(0.5, 3.0, 6, dtype=torch.float64).reshape(3, 2).t()
    multi = MultiIO().eval()
    compile_pt2(multi, (a.contiguous(), b.contiguous()), directory / "multi_io.pt2")
    write_values(directory / "multi_a.txt", a)
    write_values(directory / "multi_b.txt", b)
    for i, out in enumerate(multi(a, b)):
        write_values(directory / f"multi_out{i + 1}.txt", out)
    # An MLP over [batch, 5] float32 inputs, batch exported as dynamic.
    mlp = MLP().eval()
    compile_pt2(mlp, (torch.randn(8, 5),), directory / "mlp_dynamic.pt2", dynamic_batch=True)
    torch.jit.script(mlp).save(str(directory / "mlp_script.pt"))
    with torch.no_grad():
        for batch in (1, 4, 7):
            x = torch.randn(batch, 5)
            write_values(directory / f"mlp_x{batch}.txt", x)
            write_values(directory / f"mlp_y{batch}.txt", mlp(x))
    # The same package under a name that says nothing, and a TorchScript file named .pt2: the
    # content decides.
    (directory / "compiled_model.bin").write_bytes((directory / "mlp_dynamic.pt2").read_bytes())
    (directory / "script_named.pt2").write_bytes((directory / "mlp_script.pt").read_bytes())
    # A .pt2 archive without compiled code (torch.export.save of the exported program).
    torch.export.save(torch.export.export(mlp, (torch.randn(8, 5),)), str(directory / "exported_only.pt2"))
    build_helper_compiled(directory / "ftorch_pt2", multi, (a, b), mlp)
    return directory


def build_helper_compiled(directory: Path, multi: torch.nn.Module, multi_inputs: tuple, mlp: torch.nn.Module) -> None:
    """The same packages written by the helper (ftorch.export), whose metadata records the inputs
    the package takes: FTorch's C++ layer checks calls against them itself instead of running the
    package's generated checks. Plus a two-input package with a shared dynamic batch, and one whose
    recorded inputs do not parse (the generated checks are used then)."""
    import json
    import zipfile

    import ftorch

    directory.mkdir(parents=True, exist_ok=True)
    ftorch.export(multi, multi_inputs, pt2=directory / "multi_io.pt2", check=False)
    ftorch.export(mlp, [((8, 5), torch.float32)], pt2=directory / "mlp_dynamic.pt2", dynamic_batch=True,
                  min_batch=1, max_batch=4096, check=False)
    ftorch.export(multi, multi_inputs, pt2=directory / "multi_io_dynamic.pt2", dynamic_batch=True, min_batch=1,
                  max_batch=4096, check=False)
    with zipfile.ZipFile(directory / "mlp_dynamic.pt2") as src, \
            zipfile.ZipFile(directory / "mlp_rules_unreadable.pt2", "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                assert meta["ftorch_inputs"].startswith("v1;"), meta
                meta["ftorch_inputs"] = "v99;" + meta["ftorch_inputs"][3:]
                data = json.dumps(meta).encode()
            dst.writestr(item, data)
