"""The export helper and inspect command: ``python -m ftorch export`` / ``ftorch.export`` write
TorchScript and AOTInductor packages and check them on inputs laid out as Fortran passes them;
``python -m ftorch inspect`` describes a model for the Fortran programmer.

AOTInductor compiles take a while: the two .pt2 packages (one with a dynamic batch, one static)
are written once, by a module fixture, and shared.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")

MODEL_FILE = REPO / "examples" / "13_export" / "model.py"
SPEC = f"{MODEL_FILE}:MLP"

BAD_MODELS = '''
import torch


class Unscriptable(torch.nn.Module):
    def forward(self, x):
        try:
            return x * 2
        except Exception:
            return x


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class Threshold(torch.nn.Module):
    def forward(self, x):
        if bool((x > 5).all()):
            return x * 2
        return -x


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 5)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


class ReturnsDict(torch.nn.Module):
    def forward(self, x):
        return {"y": x}


class Flatten(torch.nn.Module):
    def forward(self, x):
        return x.view(-1) * 2


class TwoInOut(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.lin = torch.nn.Linear(n, 2)

    def forward(self, x, y):
        return self.lin(x), y.sum(dim=1)
'''


@pytest.fixture(scope="module", autouse=True)
def _installed(wheel):
    """These tests run the installed package (built by the session fixture, or as installed with
    FTORCH_TEST_USE_INSTALLED=1)."""


def cli(*args, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftorch", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def mlp_class():
    spec = importlib.util.spec_from_file_location("example13_model", MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MLP


def fortran_tensor(*shape, dtype=torch.float32):
    """A tensor as torch_tensor_from_array wraps a Fortran array of this shape (column-major)."""
    dims = list(reversed(range(len(shape))))
    t = torch.randn(*reversed(shape), dtype=dtype).permute(dims)
    assert t.stride()[0] == 1 or len(shape) < 2
    return t


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An MLP with known weights, saved as a state_dict, and its eager version."""
    d = tmp_path_factory.mktemp("weights")
    torch.manual_seed(123)
    model = mlp_class()().eval()
    torch.save(model.state_dict(), d / "mlp_weights.pt")
    return model, d / "mlp_weights.pt"


@pytest.fixture(scope="module")
def packages(tmp_path_factory, trained):
    """Two AOTInductor compiles shared by the tests: a TorchScript file plus a dynamic-batch .pt2,
    and a static .pt2."""
    _, weights = trained
    d = tmp_path_factory.mktemp("pt2")
    dyn = cli("export", SPEC, "--input", "8,5", "--weights", weights, "-o", d / "mlp.pt",
              "--pt2", d / "mlp_dynamic.pt2", "--dynamic-batch")
    static = cli("export", SPEC, "--input", "8,5", "--weights", weights, "--pt2", d / "mlp_static.pt2")
    return {"dir": d, "dynamic": dyn, "static": static}


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "bad_models.py"
    path.write_text(BAD_MODELS)
    return path


# ---------------------------------------------------------------------------------------------
# TorchScript


def test_script_writes_a_model_that_matches_on_fortran_layout(tmp_path, trained):
    model, weights = trained
    proc = cli("export", SPEC, "--input", "8,5", "--weights", weights, "-o", tmp_path / "mlp.pt")
    assert proc.returncode == 0, proc.stderr
    assert "torch.jit.script" in proc.stdout and "check passed" in proc.stdout
    assert "example inputs" in proc.stdout and "second draw" in proc.stdout
    loaded = torch.jit.load(str(tmp_path / "mlp.pt"))
    assert not loaded.training
    x = fortran_tensor(8, 5)
    torch.testing.assert_close(loaded(x), model(x.contiguous()))


def test_trace_with_init_kwargs(tmp_path):
    proc = cli("export", f"{MODEL_FILE}:MLP", "--init-kwargs", '{"n_in": 4, "n_hidden": 7, "n_out": 2}',
               "--input", "6,4", "--trace", "-o", tmp_path / "sub" / "traced.pt", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["torchscript_method"] == "trace"
    assert report["outputs"] == [{"shape": [6, 2], "dtype": "float32"}]
    loaded = torch.jit.load(str(tmp_path / "sub" / "traced.pt"))
    assert loaded(fortran_tensor(6, 4)).shape == (6, 2)
    assert dict(loaded.named_parameters())["net.0.weight"].shape == (7, 4)


def test_python_api_with_a_module_and_several_inputs(tmp_path, bad_models):
    import ftorch

    report = ftorch.export(f"{bad_models}:TwoInOut", [((3, 4), torch.float32), "3,2:float64"],
                           torchscript=tmp_path / "two.pt", init_kwargs={"n": 4})
    assert report.ok
    assert [i.name for i in report.inputs] == ["x", "y"]
    assert report.outputs == [{"shape": [3, 2], "dtype": "float32"}, {"shape": [3], "dtype": "float64"}]
    d = report.to_dict()
    assert d["ok"] and d["checks"][0]["runs"][0]["outputs"][1]["dtype"] == "float64"
    # An nn.Module instance and tensors as inputs; the model's own mode is left as it was.
    model = mlp_class()(n_in=3)
    model.train()
    report = ftorch.export(model, [torch.randn(2, 3)], tmp_path / "inst.pt", trace=True)
    assert report.ok and model.training
    assert "check passed" in str(report)


def test_weights_from_a_checkpoint_dict(tmp_path, trained):
    """A training checkpoint holding a DDP model's state_dict ('module.' prefixes) loads too."""
    import ftorch

    model, _ = trained
    state = {"module." + k: v for k, v in model.state_dict().items()}
    torch.save({"epoch": 3, "model_state_dict": state}, tmp_path / "ckpt.pt")
    ftorch.export(SPEC, ["5,5"], tmp_path / "m.pt", weights=tmp_path / "ckpt.pt")
    x = fortran_tensor(5, 5)
    torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.pt"))(x), model(x))


def test_training_mode_is_kept_with_train(tmp_path):
    proc = cli("export", SPEC, "--input", "4,5", "--train", "-o", tmp_path / "train.pt")
    assert proc.returncode == 0, proc.stderr
    assert torch.jit.load(str(tmp_path / "train.pt")).training


class _NormedNet(torch.nn.Module):
    """BatchNorm between two layers: a forward in training mode updates its running statistics."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)))


@pytest.mark.parametrize("trace", [False, True], ids=["script", "trace"])
def test_export_in_training_mode_keeps_the_running_statistics(tmp_path, trace):
    """The reference runs (and a trace) run the forward in training mode, which updates
    BatchNorm's buffers even without gradients: the file holds the model's own statistics, and
    the caller's model, its per-module modes included, is left as it was."""
    import ftorch

    model = _NormedNet()
    with torch.no_grad():
        model.bn.running_mean.fill_(5.0)
    model.train()
    model.bn.eval()  # (a frozen BatchNorm, as in fine-tuning)
    ftorch.export(model, ["8,4"], tmp_path / "bn.pt", training=True, trace=trace)
    saved = dict(torch.jit.load(str(tmp_path / "bn.pt")).named_buffers())
    assert torch.equal(saved["bn.running_mean"], torch.full((3,), 5.0))
    assert int(saved["bn.num_batches_tracked"]) == 0
    assert torch.equal(model.bn.running_mean, torch.full((3,), 5.0)) and int(model.bn.num_batches_tracked) == 0
    assert model.training and not model.bn.training


def test_float64_weights_are_not_rounded_through_float32(tmp_path):
    """--weights with --dtype float64: the weights are loaded after the model became float64."""
    import ftorch

    torch.manual_seed(0)
    state = {k: v.double() / 3 for k, v in _NormedNet().state_dict().items() if v.is_floating_point()}
    state["bn.num_batches_tracked"] = torch.tensor(0)
    torch.save(state, tmp_path / "w64.pt")
    ftorch.export(_NormedNet(), ["8,4"], tmp_path / "m64.pt", weights=tmp_path / "w64.pt", dtype="float64")
    saved = torch.jit.load(str(tmp_path / "m64.pt")).state_dict()
    for k, v in state.items():
        assert saved[k].dtype == v.dtype and torch.equal(saved[k], v), k


def test_the_check_compares_infinities_complex_and_integers_exactly():
    """An infinite reference allows only itself; complex outputs compare both parts; integer
    outputs compare exactly whatever tolerance was given."""
    from ftorch._export_report import _compare

    inf = float("inf")

    def ok(ref, got, rtol=None, atol=None):
        return _compare([torch.tensor(ref)], [torch.tensor(got)], rtol, atol)[0].ok

    assert ok([inf, -inf, 1.0], [inf, -inf, 1.0])
    assert not ok([inf], [0.0]) and not ok([inf], [float("nan")]) and not ok([-inf], [inf])
    assert not ok([1.0], [inf])
    assert not ok([1 + 1j], [1 - 5j]) and ok([1 + 1j], [1 + 1j])
    assert not ok([3], [4], rtol=0.5, atol=2.0) and ok([3], [3], rtol=0.5, atol=2.0)


def test_package_input_rules_leave_out_lifted_constants():
    """A tensor made in forward is a constant that torch.export lifts to an input of its program;
    the compiled model does not take it, so the rules FTorch checks each call against list only
    the arguments (a rule too many would refuse every call)."""
    from ftorch._train_package import _rules

    class Scaled(torch.nn.Module):
        def forward(self, x):
            return x * torch.tensor([1.0, 2.0, 3.0])

    program = torch.export.export(Scaled(), (torch.randn(4, 3),), strict=False)
    assert any(n.op == "placeholder" and n.name not in program.graph_signature.user_inputs
               for n in program.graph.nodes), "the constant is a placeholder of the program"
    assert _rules(program, None, 1, None) == "v1;float32[4,3]"


# ---------------------------------------------------------------------------------------------
# AOTInductor packages


def test_dtype_converts_the_model_and_the_inputs(tmp_path):
    proc = cli("export", SPEC, "--input", "8,5", "--dtype", "float64", "-o", tmp_path / "mlp64.pt")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    net = torch.jit.load(str(tmp_path / "mlp64.pt"))
    assert {p.dtype for p in net.parameters()} == {torch.float64}
    assert "real(real64)" in cli("inspect", tmp_path / "mlp64.pt").stdout
    proc = cli("export", SPEC, "--input", "8,5", "--dtype", "int32", "-o", tmp_path / "bad.pt")
    assert proc.returncode == 2 and "float32 or float64" in proc.stderr
    # From Python, the caller's module keeps its dtype: a copy of it is converted.
    import ftorch

    model = torch.nn.Linear(5, 3)
    weight = model.weight.detach().clone()
    assert ftorch.export(model, ["8,5"], tmp_path / "lin64.pt", dtype="float64").ok
    assert model.weight.dtype == torch.float32 and torch.equal(model.weight.detach(), weight)
    assert {p.dtype for p in torch.jit.load(str(tmp_path / "lin64.pt")).parameters()} == {torch.float64}


def test_dynamic_batch_package_runs_other_batch_sizes(packages, trained):
    proc = packages["dynamic"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dynamic batch 1..any" in proc.stdout and "check passed" in proc.stdout
    assert "batch 1 " in proc.stdout and "batch 17 " in proc.stdout
    model, _ = trained
    package = torch._inductor.aoti_load_package(str(packages["dir"] / "mlp_dynamic.pt2"))
    for batch in (3, 8, 40):
        x = fortran_tensor(batch, 5)
        # As the C++ layer does, inputs are made contiguous before running the package.
        torch.testing.assert_close(package(x.contiguous()), model(x.contiguous()))


def test_static_package_rejects_another_batch_size(packages, trained, monkeypatch, capfd):
    proc = packages["static"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dynamic batch" not in proc.stdout and "check passed" in proc.stdout
    # AOTInductor packages check their inputs' sizes only with this variable (read at first run).
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")
    package = torch._inductor.aoti_load_package(str(packages["dir"] / "mlp_static.pt2"))
    model, _ = trained
    x = fortran_tensor(8, 5).contiguous()
    torch.testing.assert_close(package(x), model(x))
    # The wording of AOTInductor's message differs between torch releases, and before 2.13 the
    # detail went to standard error only (the exception said "run_func_(...) API call failed"):
    # the sizes are looked for in both.
    capfd.readouterr()
    with pytest.raises(RuntimeError) as err:
        package(torch.randn(4, 5))
    text = str(err.value) + capfd.readouterr().err
    assert "8" in text and "4" in text, text


def test_packages_record_the_inputs_they_take(packages):
    """The helper records each input's dtype and sizes (the dynamic batch as a named range) in the
    package's metadata: FTorch's C++ layer checks calls against them instead of running the
    package's generated checks (tests/test_compiled.py runs both kinds of package)."""
    package = torch._inductor.aoti_load_package(str(packages["dir"] / "mlp_dynamic.pt2"))
    assert package.get_metadata()["ftorch_inputs"] == "v1;float32[batch:1:-1,5]"
    package = torch._inductor.aoti_load_package(str(packages["dir"] / "mlp_static.pt2"))
    assert package.get_metadata()["ftorch_inputs"] == "v1;float32[8,5]"


def test_a_crash_while_checking_a_package_is_reported(packages, monkeypatch):
    """The package is loaded and run in a child process: if that crashes (a signal inside
    AOTInductor's loader, seen with some torch builds), the check fails saying so, and the caller
    (the export) goes on. The crash is injected through the child's environment."""
    from ftorch._export_pt2 import _run_pt2_in_child

    x = fortran_tensor(8, 5).contiguous()
    load_error, results = _run_pt2_in_child(packages["dir"] / "mlp_static.pt2", [[x]])
    assert load_error is None and "outputs" in results[0]
    monkeypatch.setenv("_FTORCH_TEST_CRASH_PT2_CHECK", "1")
    load_error, results = _run_pt2_in_child(packages["dir"] / "mlp_static.pt2", [[x]])
    assert load_error is not None and "crashed (killed by signal SIGABRT)" in load_error, load_error


def test_inspect_shows_the_package_shapes(packages):
    path = packages["dir"] / "mlp_dynamic.pt2"
    proc = cli("inspect", path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "AOTInductor package, class MLP" in out
    assert "x: Tensor [batch, 5] float32" in out and "1: [batch, 3] float32" in out
    assert "net.0.weight" in out and "[16, 5]" in out and "419 values" in out
    assert "real(real32), target :: x(nbatch, 5)" in out
    assert 'call torch_model_load(model, "mlp_dynamic.pt2", torch_kCPU)' in out
    info = json.loads(cli("inspect", packages["dir"] / "mlp_static.pt2", "--input", "8,5", "--json").stdout)
    assert info["format"] == "pt2" and info["dynamic_batch"] is None
    assert info["outputs"] == [{"shape": [8, 3], "dtype": "float32"}] and info["outputs_from_run"]


def test_data_dependent_control_flow_cannot_be_exported(tmp_path, bad_models):
    proc = cli("export", f"{bad_models}:DataDependent", "--input", "4,5", "--pt2", tmp_path / "dd.pt2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "depends on tensor values" in proc.stderr and "torch.cond" in proc.stderr
    assert "bad_models.py:15: `if x.sum() > 0:`" in proc.stderr
    assert not (tmp_path / "dd.pt2").exists()


# ---------------------------------------------------------------------------------------------
# Errors


def test_unscriptable_model_names_the_construct_and_suggests_trace(tmp_path, bad_models):
    proc = cli("export", f"{bad_models}:Unscriptable", "--input", "4,5", "-o", tmp_path / "u.pt")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "try blocks aren't supported" in proc.stderr and "bad_models.py:7" in proc.stderr
    assert "--trace" in proc.stderr
    # ... and tracing it works.
    proc = cli("export", f"{bad_models}:Unscriptable", "--input", "4,5", "-o", tmp_path / "u.pt", "--trace")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["nothere.py:MLP", "--input", "8,5", "-o", "m.pt"], "no such file: nothere.py"),
        ([f"{MODEL_FILE}:Nope", "--input", "8,5", "-o", "m.pt"], "has no 'Nope'; it defines: MLP"),
        (["no_such_pkg.sub:MLP", "--input", "8,5", "-o", "m.pt"], "no module named 'no_such_pkg.sub'"),
        ([SPEC, "--input", "8;5", "-o", "m.pt"], "bad --input '8;5'"),
        ([SPEC, "--input", "8,0", "-o", "m.pt"], "extents must be at least 1"),
        ([SPEC, "--input", "8,5:complex64", "-o", "m.pt"], "unknown dtype 'complex64'"),
        ([SPEC, "--input", "8,5", "--input", "8,5", "-o", "m.pt"], "takes 1 tensor(s), but 2 input(s)"),
        ([SPEC, "--input", "8,5"], "nothing to write"),
        ([SPEC, "--input", "8,5", "--pt2", "m.zip"], "must end with .pt2"),
        ([SPEC, "--init-kwargs", "{n: 5}", "--input", "8,5", "-o", "m.pt"], "--init-kwargs is not JSON"),
        ([SPEC, "--init-kwargs", '{"n": 5}', "--input", "8,5", "-o", "m.pt"], "unexpected keyword argument 'n'"),
        ([SPEC, "--weights", "nothere.pt", "--input", "8,5", "-o", "m.pt"], "no such weights file"),
        ([SPEC, "--freeze", "--train", "--input", "8,5", "-o", "m.pt"], "--freeze is for inference"),
        ([SPEC, "--input", "8,5", "-o", "m.pt", "--min-batch", "2"], "--min-batch and --max-batch bound the batch of"),
        ([SPEC, "--input", "8,5", "--pt2", "m.pt2", "--trace"], "--trace applies to the TorchScript file"),
        ([SPEC, "--input", "8,5", "--pt2", "m.pt2", "--train"], "--train without a file applies to the TorchScript"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    proc = cli("export", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.pt").exists()


def test_model_errors_exit_1(tmp_path, bad_models):
    proc = cli("export", f"{bad_models}:ReturnsDict", "--input", "3,5", "-o", tmp_path / "d.pt")
    assert proc.returncode == 1 and "returns a dict (keys 'y')" in proc.stderr
    assert "tuple of tensors" in proc.stderr
    proc = cli("export", SPEC, "--input", "8,4", "-o", tmp_path / "m.pt")
    assert proc.returncode == 1 and "forward fails on the example inputs" in proc.stderr
    assert "model.py:" in proc.stderr and "Traceback" not in proc.stderr


def test_check_fails_for_a_random_model(tmp_path, bad_models):
    """Dropout in training mode: the eager model does not even agree with itself."""
    proc = cli("export", f"{bad_models}:Noisy", "--input", "3,5", "--train", "-o", tmp_path / "n.pt")
    assert proc.returncode == 1
    assert "check FAILED" in proc.stdout
    assert "different results on each run" in proc.stderr and "Traceback" not in proc.stderr
    # In eval mode dropout is off and the check passes.
    assert cli("export", f"{bad_models}:Noisy", "--input", "3,5", "-o", tmp_path / "n.pt").returncode == 0


def test_check_catches_a_trace_that_fixed_a_branch(tmp_path, bad_models):
    """Traced on inputs that all exceed 5, the trace keeps that branch; the check's second draw of
    inputs takes the other one in the eager model."""
    import ftorch

    with pytest.raises(ftorch.ExportError) as info:
        ftorch.export(f"{bad_models}:Threshold", [torch.full((4, 5), 10.0)], tmp_path / "t.pt", trace=True)
    report = info.value.report
    assert info.value.exit_code == 1 and not report.ok
    runs = report.checks[0].runs
    assert runs[0].ok and not runs[1].ok and runs[1].outputs[0].max_abs > 1
    assert any("trace warning at" in n and "bad_models.py:22" in n for n in report.notes)
    assert "script the model instead" in report.checks[0].note


def test_check_reports_a_model_that_fails_on_column_major_inputs(tmp_path, bad_models):
    proc = cli("export", f"{bad_models}:Flatten", "--input", "3,5", "-o", tmp_path / "f.pt")
    assert proc.returncode == 1
    assert "view size is not compatible" in proc.stdout
    assert "use reshape instead of view" in proc.stdout


# ---------------------------------------------------------------------------------------------
# inspect


def test_inspect_torchscript(tmp_path, bad_models):
    assert cli("export", SPEC, "--input", "8,5", "--train", "-o", tmp_path / "mlp.pt").returncode == 0
    proc = cli("inspect", tmp_path / "mlp.pt")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "TorchScript, class MLP" in out and "saved in training mode" in out
    assert "forward(x: Tensor) -> Tensor" in out
    assert "net.0.weight                 [16, 5]      float32  requires_grad" in out
    assert "net.4.bias" in out and "6 tensors, 419 values" in out
    # The snippet runs inference: the load line leaves the model in eval() mode; a note says how to train.
    assert 'call torch_model_load(model, "mlp.pt", torch_kCPU)\n' in out and "is_training=.true. keeps" in out
    proc = cli("inspect", tmp_path / "mlp.pt", "--input", "8,5", "--json")
    info = json.loads(proc.stdout)
    assert info["training"] is True and info["parameter_count"] == 419
    assert info["outputs"] == [{"shape": [8, 3], "dtype": "float32"}]
    assert {"name": "net.2.weight", "shape": [16, 16], "dtype": "float32", "requires_grad": True} in info["parameters"]
    assert "real(real32), target :: out(8, 3)" in info["fortran"]
    assert "call torch_model_forward(model, inputs, outputs)" in info["fortran"]


def test_inspect_snippet_takes_the_parameters_dtype(tmp_path):
    """Without --input, the snippet's arrays have the model's dtype (real64 for a float64 model)."""
    net = torch.jit.script(torch.nn.Linear(3, 2).double().eval())
    net.save(str(tmp_path / "f64.pt"))
    proc = cli("inspect", tmp_path / "f64.pt")
    assert proc.returncode == 0, proc.stderr
    assert "real(real64), target :: input(...)" in proc.stdout and "real(real32)" not in proc.stdout


def test_inspect_names_an_ftorch_checkpoint(tmp_path):
    """A checkpoint written by torch_checkpoint_save (here through the C API) is not a model: exit 2,
    saying what the file is; torch_model_load refuses it too (tests/fortran/test_train.f90)."""
    import ctypes

    import ftorch

    lib = ctypes.CDLL(str(Path(ftorch.get_libdir()) / "libftorch_c.so"))
    torch.jit.script(torch.nn.Linear(3, 2)).save(str(tmp_path / "net.pt"))
    model = ctypes.c_void_p()
    assert lib.ftc_model_load(ctypes.byref(model), str(tmp_path / "net.pt").encode(), 0, -1, 0, 0) == 0
    save = lib.ftc_checkpoint_save
    save.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    assert save(str(tmp_path / "run.ckpt").encode(), model, None, None, 7) == 0
    lib.ftc_model_delete(ctypes.byref(model))
    proc = cli("inspect", tmp_path / "run.ckpt")
    assert proc.returncode == 2 and "is an FTorch checkpoint (torch_checkpoint_save, step 7)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_inspect_rejects_what_is_not_a_model(tmp_path):
    (tmp_path / "text.pt").write_text("not a model\n")
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    for name, message in [("missing.pt", "no such file"), ("text.pt", "not a zip archive"),
                          ("state.pt", "torch.save file (a state_dict")]:
        proc = cli("inspect", tmp_path / name)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_import_stays_light():
    code = "import sys, ftorch; ftorch.export; ftorch.inspect_model; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
    assert {"export", "inspect_model"} <= set(__import__("ftorch").__all__)
