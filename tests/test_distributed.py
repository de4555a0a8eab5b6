"""Data-parallel training and collectives over MPI (tests/fortran/test_distributed.f90), run with
`mpirun -np 2|3 --oversubscribe`. The Fortran program compares every data-parallel run with a
single-process run of the same model on the concatenated batch, step by step; here we also
compare the final parameters of one run with torch.optim in Python, and check checkpoint resume
bit for bit across processes, errors on every rank, and that a crashing rank ends the job."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import IN_CI, REPO, TESTS, require_compiler, run, tool_env


class DDPNet(torch.nn.Module):
    """An MLP with a buffer (used in forward) and a parameter that forward never uses."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 2)
        self.unused = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.tensor([1.5, 0.5]))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.scale


def deep_model() -> torch.nn.Module:
    layers = []
    for _ in range(25):
        layers += [torch.nn.Linear(4, 4), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(4, 2))
    return torch.nn.Sequential(*layers)


def mpi_env() -> dict[str, str]:
    env = tool_env()
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


def require_mpi() -> str:
    for tool in ("mpif90", "mpirun"):
        if shutil.which(tool) is None:
            if IN_CI:
                pytest.fail(f"{tool} is required in CI (apt-get install openmpi-bin libopenmpi-dev)")
            pytest.skip(f"{tool} not installed")
    return shutil.which("mpirun")


@pytest.fixture(scope="session")
def mpi_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mpi-data")
    torch.manual_seed(21)
    torch.jit.script(DDPNet().double()).save(str(d / "ddp_mlp.pt"))
    torch.manual_seed(22)
    torch.jit.script(deep_model().double()).save(str(d / "ddp_deep.pt"))
    torch.jit.script(torch.nn.Linear(3, 3).double()).save(str(d / "ddp_other.pt"))
    torch.manual_seed(23)
    bn = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    torch.jit.script(bn.double()).save(str(d / "ddp_bn.pt"))
    for buffer in ("a", "b"):  # the same parameters and buffer shapes; the buffer's name differs
        torch.manual_seed(24)
        torch.jit.script(NamedBuffer(buffer).double()).save(str(d / f"ddp_buffer_{buffer}.pt"))
    return d


class NamedBuffer(torch.nn.Module):
    def __init__(self, buffer: str):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.register_buffer(buffer, torch.zeros(2))

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="session")
def mpi_program(installed, mpi_data, tmp_path_factory) -> Path:
    """tests/projects/mpi built with CMake, find_package(MPI) and FTorch::ftorch_mpi."""
    require_mpi()
    bdir = tmp_path_factory.mktemp("cmake-mpi")
    run(["cmake", "-S", TESTS / "projects" / "mpi", "-B", bdir, "-G", "Ninja", "-DCMAKE_Fortran_COMPILER=gfortran",
         f"-DCMAKE_PREFIX_PATH={installed['prefix']}", "-DCMAKE_BUILD_TYPE=Debug"], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    return bdir / "test_distributed"


def mpirun(np_: int, program: Path, *args, check=True, timeout=600, env_extra=None):
    return run([require_mpi(), "--oversubscribe", "--bind-to", "none", "-np", str(np_), program, *args],
               env={**mpi_env(), **(env_extra or {})}, check=check, timeout=timeout)


def assert_every_rank_passed(proc, np_: int) -> None:
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    summaries = [ln for ln in lines if ln.endswith(" failed") and " passed, " in ln]
    failures = [ln for ln in lines if ln.startswith("FAIL")]
    ok = proc.returncode == 0 and len(summaries) == np_ and all(s.endswith(" passed, 0 failed") for s in summaries)
    assert ok and not failures, (
        "\n".join(failures) + f"\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    assert all(int(s.split()[0]) > 0 for s in summaries)


def global_batch(sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of tests/fortran/test_distributed.f90 (xval, yval; 1-based indices)."""
    i = torch.arange(1, sum(sizes) + 1, dtype=torch.float64)[:, None]
    j = torch.arange(1, 5, dtype=torch.float64)[None, :]
    k = torch.arange(1, 3, dtype=torch.float64)[None, :]
    return torch.sin(0.37 * i + 0.61 * j) + 0.1 * j, 0.5 * torch.cos(0.23 * i * k) + 0.1 * k


def torch_reference(model_file: Path, optimizer: str, sizes: list[int], steps: int = 20) -> np.ndarray:
    """torch.optim on the concatenated batch: what data-parallel training must reproduce."""
    model = torch.jit.load(str(model_file))
    params = list(model.parameters())
    opt = (torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False) if optimizer == "sgd"
           else torch.optim.Adam(params, lr=0.01, foreach=False))
    x, y = global_batch(sizes)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy()


@pytest.mark.parametrize("np_,direct", [(2, "default"), (3, "default"), (3, "all")])
def test_data_parallel_equals_single_process(mpi_program, mpi_data, np_, direct, tmp_path):
    """SGD with momentum, Adam, accumulation, frozen/unused parameters, uneven batches,
    torch_train_step, LBFGS and small buckets: 20 steps, loss and parameters within 1e-12 (LBFGS: 1e-6, why in the program) of
    single-process training (in the Fortran program); the final parameters also against
    torch.optim in Python, 1e-12 relative. The test models' gradients are small, so they are
    packed into buckets; direct="all" (FTORCH_DDP_DIRECT_BYTES=1) reduces every gradient in its
    own memory instead, as large gradients are by default."""
    dump = tmp_path / "parity.txt"
    env_extra = {"FTORCH_DDP_DIRECT_BYTES": "1"} if direct == "all" else None
    assert_every_rank_passed(mpirun(np_, mpi_program, mpi_data, "parity", dump, env_extra=env_extra), np_)
    got = {line.split()[0]: np.array(line.split()[1:], dtype=float) for line in dump.read_text().splitlines()}
    for name, optimizer, sizes in [("sgd_momentum", "sgd", [4] * np_), ("adam", "adam", [4] * np_),
                                   ("uneven", "adam", [2 + 2 * r for r in range(np_)]),
                                   ("train_step_uneven", "sgd", [2 + 2 * r for r in range(np_)])]:
        want = torch_reference(mpi_data / "ddp_mlp.pt", optimizer, sizes)
        err = np.max(np.abs(got[name] - want)) / np.max(np.abs(want))
        assert err <= 1e-12, f"{name}: data-parallel parameters differ from torch.optim by {err:.3e}"


def test_data_parallel_training_package(mpi_program, mpi_data, tmp_path):
    """The same data-parallel program on a training package of the same model (put in the
    TorchScript file's place): 2 ranks against single-process training in the program, and the
    final parameters against torch.optim on the eager model. The package's kernels are Inductor's
    (they may round a reduction differently from ATen's by an ulp): 1e-10 relative here, against
    1e-12 for TorchScript above."""
    import ftorch

    d = tmp_path / "data"
    d.mkdir()
    for f in mpi_data.iterdir():
        if f.name != "ddp_mlp.pt":
            (d / f.name).symlink_to(f)
    model = torch.jit.load(str(mpi_data / "ddp_mlp.pt"))
    eager = DDPNet().double()
    eager.load_state_dict(model.state_dict())
    # (check=False: the parity run below compares the package's training with single-process training)
    report = ftorch.export(eager, ["4,4:float64"], train_package=d / "ddp_mlp.pt2", dynamic_batch=True,
                           check=False)
    assert report.ok, report
    shutil.copy(d / "ddp_mlp.pt2", d / "ddp_mlp.pt")
    dump = tmp_path / "parity.txt"
    assert_every_rank_passed(mpirun(2, mpi_program, d, "parity", dump), 2)
    # the package as a node-shared model (forward, training, the failure cases)
    assert_every_rank_passed(mpirun(2, mpi_program, d, "shared"), 2)
    got = {line.split()[0]: np.array(line.split()[1:], dtype=float) for line in dump.read_text().splitlines()}
    for name, optimizer, sizes in [("sgd_momentum", "sgd", [4] * 2), ("adam", "adam", [4] * 2),
                                   ("uneven", "adam", [2 + 2 * r for r in range(2)])]:
        want = torch_reference(mpi_data / "ddp_mlp.pt", optimizer, sizes)
        err = np.max(np.abs(got[name] - want)) / np.max(np.abs(want))
        assert err <= 1e-10, f"{name}: data-parallel parameters differ from torch.optim by {err:.3e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_data_parallel_on_the_gpu(mpi_program, mpi_data):
    """torch_train_step data-parallel with the models and batches on the GPU (2 ranks sharing
    device 0, gradients staged through host memory): the single-process CPU run's losses and
    parameters, identical parameters on both ranks."""
    assert_every_rank_passed(mpirun(2, mpi_program, mpi_data, "cuda"), 2)


def test_node_shared_groups_with_data_parallel_leaders(mpi_program, mpi_data):
    """4 ranks in 2 groups (groups=2), one node-shared model per group, the leaders data-parallel
    over their own communicator (weighted by their groups' rows): single-process training on all
    4 ranks' batches (1e-12)."""
    assert_every_rank_passed(mpirun(4, mpi_program, mpi_data, "shared_ddp"), 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_node_shared_model_on_the_gpu(mpi_program, mpi_data):
    """A node-shared model held on the GPU by rank 0 of 3 ranks with host arrays: forward and
    training against the single-process CPU runs (1e-9: cuBLAS sums in another order)."""
    assert_every_rank_passed(mpirun(3, mpi_program, mpi_data, "shared_cuda"), 3)


def test_sub_communicator(mpi_program, mpi_data):
    assert_every_rank_passed(mpirun(3, mpi_program, mpi_data, "subcomm"), 3)


def test_running_statistics_are_the_same_on_every_rank(mpi_program, mpi_data, tmp_path):
    """BatchNorm's running statistics, which each rank's forward updates from its own batch, are
    rank 0's on every rank after each step (PyTorch's DDP broadcasts rank 0's buffers before each
    forward): every rank holds the same model, and a run resumed from rank 0's checkpoint goes on
    as the uninterrupted one."""
    assert_every_rank_passed(mpirun(2, mpi_program, mpi_data, "buffers", str(tmp_path / "bn_rank")), 2)
    models = [torch.jit.load(str(tmp_path / f"bn_rank{r}.pt")) for r in range(2)]
    buffers = [dict(m.named_buffers()) for m in models]
    assert set(buffers[0]) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    for name in buffers[0]:
        assert torch.equal(buffers[0][name], buffers[1][name]), name
    assert int(buffers[0]["1.num_batches_tracked"]) == 3
    assert buffers[0]["1.running_mean"].abs().max() > 0, "the statistics moved"
    for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(p, q)


def test_bucketing(mpi_program, mpi_data):
    assert_every_rank_passed(mpirun(2, mpi_program, mpi_data, "bucketing"), 2)


def test_direct_size_setting_is_checked(mpi_program, mpi_data):
    """A malformed FTORCH_DDP_DIRECT_BYTES is a clear error of torch_ddp_init, not a default."""
    proc = mpirun(1, mpi_program, mpi_data, "parity", "/dev/null", check=False,
                  env_extra={"FTORCH_DDP_DIRECT_BYTES": "1MB"})
    assert proc.returncode != 0
    assert "FTORCH_DDP_DIRECT_BYTES must be a positive number of bytes, not '1MB'" in proc.stdout + proc.stderr


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(mpi_program, mpi_data, np_):
    assert_every_rank_passed(mpirun(np_, mpi_program, mpi_data, "collectives"), np_)


@pytest.mark.parametrize("np_", [2, 3])
def test_node_shared_models(mpi_program, mpi_data, np_):
    """One model for the ranks of a node (torch_model_load_shared): forward and torch_train_step on
    uneven batches (a rank with none on 3 ranks) equal single-process runs on the concatenated batch
    (1e-12); a failing rank, a disagreeing rank and a failing leader end the call on every rank with
    their reasons; groups of ranks per node."""
    assert_every_rank_passed(mpirun(np_, mpi_program, mpi_data, "shared"), np_)


def test_errors_reach_every_rank(mpi_program, mpi_data):
    assert_every_rank_passed(mpirun(2, mpi_program, mpi_data, "errors"), 2)


def test_checkpoint_resume_bit_for_bit(mpi_program, mpi_data, tmp_path):
    ckpt = tmp_path / "ddp.ckpt"
    for phase in ("full", "first", "second"):
        assert_every_rank_passed(mpirun(2, mpi_program, mpi_data, "resume", phase, ckpt), 2)
    full = (tmp_path / "ddp.ckpt.full.txt").read_text()
    second = (tmp_path / "ddp.ckpt.second.txt").read_text()
    assert full == second, "resuming the data-parallel run did not reproduce the uninterrupted run"


def configure_mpi_project(bdir: Path, installed, compiler: str, *extra: str, check=True):
    return run(["cmake", "-S", TESTS / "projects" / "mpi", "-B", bdir, "-G", "Ninja",
                f"-DCMAKE_Fortran_COMPILER={compiler}", f"-DCMAKE_PREFIX_PATH={installed['prefix']}",
                "-DCMAKE_BUILD_TYPE=Debug", *extra], env=tool_env(), check=check)


# Debian 12's OpenMPI modules are gfortran 12's (module format 15, which gfortran 8-14 read):
# gfortran 11 builds ftorch_mpi over mpi_f08; flang cannot read them, so FTorch's CMake config
# builds ftorch_mpi over mpif.h by itself, and the test program then uses mpif.h too.
OTHER_MPI_COMPILERS = {"gfortran-11": "mpi_f08", "flang-new-19": "mpif.h"}


@pytest.fixture(scope="module", params=list(OTHER_MPI_COMPILERS))
def mpi_program_other_compiler(request, installed, mpi_data, tmp_path_factory) -> tuple[str, Path]:
    """tests/projects/mpi built with gfortran 11 or flang 19 and Debian's OpenMPI."""
    require_mpi()
    fc = require_compiler(request.param)
    bdir = tmp_path_factory.mktemp(f"cmake-mpi-{request.param}")
    proc = configure_mpi_project(bdir, installed, fc)
    interface = OTHER_MPI_COMPILERS[request.param]
    assert f"ftorch_mpi interface: {interface}" in proc.stdout, proc.stdout
    assert ("module ftorch_mpi over mpif.h" in proc.stdout) == (interface == "mpif.h"), proc.stdout
    run(["cmake", "--build", bdir], env=tool_env())
    return request.param, bdir / "test_distributed"


def test_other_compilers_parity_collectives_and_checkpoints(mpi_program_other_compiler, mpi_data, tmp_path):
    """gfortran 11 (over mpi_f08) and flang 19 (over mpif.h): data-parallel parity on 2 ranks and
    on a sub-communicator, the collectives, errors on every rank, and the checkpoint cases -- a
    resumed run equal bit for bit to the uninterrupted one, a failed write or load failing on every
    rank, and a collective load that fails on one rank (missing, corrupt or another model's file,
    another step) changing nothing on any rank."""
    _, program = mpi_program_other_compiler
    assert_every_rank_passed(mpirun(2, program, mpi_data, "parity", tmp_path / "parity.txt"), 2)
    assert_every_rank_passed(mpirun(3, program, mpi_data, "subcomm"), 3)
    assert_every_rank_passed(mpirun(2, program, mpi_data, "collectives"), 2)
    assert_every_rank_passed(mpirun(2, program, mpi_data, "errors"), 2)
    assert_every_rank_passed(mpirun(3, program, mpi_data, "shared"), 3)
    ckpt = tmp_path / "ddp.ckpt"
    for phase in ("full", "first", "second"):
        assert_every_rank_passed(mpirun(2, program, mpi_data, "resume", phase, ckpt), 2)
    assert (tmp_path / "ddp.ckpt.full.txt").read_text() == (tmp_path / "ddp.ckpt.second.txt").read_text()


def test_mpi_interface_can_be_chosen(installed, tmp_path):
    """FTORCH_MPI_INTERFACE=mpif.h builds ftorch_mpi over mpif.h with a compiler that could use
    mpi_f08 too, and a second find_package(FTorch) in a subdirectory reports the interface taken;
    an MPI::MPI_Fortran that FindMPI did not make keeps mpi_f08; a value other than mpi_f08,
    mpif.h or empty is a configure error."""
    require_mpi()
    fc = require_compiler("gfortran")
    proc = configure_mpi_project(tmp_path / "chosen", installed, fc, "-DFTORCH_MPI_INTERFACE=mpif.h")
    assert "ftorch_mpi interface: mpif.h" in proc.stdout, proc.stdout
    assert "second find_package: ftorch_mpi interface: mpif.h" in proc.stdout, proc.stdout
    proc = configure_mpi_project(tmp_path / "default", installed, fc)
    assert "ftorch_mpi interface: mpi_f08" in proc.stdout, proc.stdout
    assert "second find_package: ftorch_mpi interface: mpi_f08" in proc.stdout, proc.stdout
    # MPI::MPI_Fortran made by the project, not FindMPI (no HAVE_* variables): mpi_f08, no warning.
    proc = configure_mpi_project(tmp_path / "own-target", installed, fc, "-DTEST_MPI_TARGET_WITHOUT_FINDMPI=ON")
    assert "ftorch_mpi interface: mpi_f08" in proc.stdout and "can use neither" not in proc.stderr, proc
    proc = configure_mpi_project(tmp_path / "bad", installed, fc, "-DFTORCH_MPI_INTERFACE=mpi", check=False)
    assert proc.returncode != 0
    assert "FTORCH_MPI_INTERFACE must be mpi_f08, mpif.h or empty, not 'mpi'" in proc.stdout + proc.stderr


def test_mpifh_source_for_make(installed, tmp_path):
    """The mpif.h module for plain builds: pkg-config's fortran_mpi_mpifh_source, the helper's
    --fortran-mpi-mpifh-source and ftorch.get_fortran_mpi_source("mpif.h") name one file, which
    mpif90 compiles into module ftorch_mpi against the prebuilt modules."""
    require_mpi()
    import ftorch

    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config not installed")
    env = dict(os.environ, PKG_CONFIG_PATH=installed["pkgconfig"])
    from_pc = run(["pkg-config", "--variable=fortran_mpi_mpifh_source", "ftorch"], env=env).stdout.strip()
    from_cli = run([sys.executable, "-m", "ftorch", "--fortran-mpi-mpifh-source"]).stdout.strip()
    path = ftorch.get_fortran_mpi_source("mpif.h")
    assert Path(from_pc).resolve() == Path(from_cli).resolve() == path.resolve() and path.is_file()
    assert "include 'mpif.h'" in path.read_text() and "use mpi_f08" not in path.read_text()
    with pytest.raises(ValueError, match="interface must be 'mpi_f08' or 'mpif.h'"):
        ftorch.get_fortran_mpi_source("mpi")
    moddir = run(["pkg-config", "--variable=fortran_moddir", "ftorch"], env=env).stdout.strip()
    run(["mpif90", "-c", path, f"-I{moddir}", "-J", tmp_path, "-o", tmp_path / "ftorch_mpi.o"])
    assert (tmp_path / "ftorch_mpi.mod").is_file()


def test_a_crashing_rank_ends_the_job(mpi_program, mpi_data):
    """Rank 1 stops with error stop while rank 0 waits in a collective: mpirun must return (with
    a failure status) rather than hang."""
    proc = mpirun(2, mpi_program, mpi_data, "crash", check=False, timeout=120)
    assert proc.returncode != 0
    assert "rank 1 gives up" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def example10(installed, tmp_path_factory) -> Path:
    require_mpi()
    work = tmp_path_factory.mktemp("example10")
    run([sys.executable, REPO / "examples" / "10_data_parallel" / "write_model.py", work])
    return work


def test_example_data_parallel_cmake(example10, installed):
    """examples/10_data_parallel built by CMake (find_package(MPI), FTorch COMPONENTS MPI) and run
    on 2 ranks: rank 0 alone prints the global loss."""
    bdir = example10 / "build-cmake"
    run(["cmake", "-S", REPO / "examples" / "10_data_parallel", "-B", bdir, "-G", "Ninja",
         "-DCMAKE_Fortran_COMPILER=gfortran", f"-DCMAKE_PREFIX_PATH={installed['prefix']}"], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    proc = mpirun(2, bdir / "data_parallel", example10, "200")
    assert "trained on 2 ranks; example 10 finished" in proc.stdout
    assert proc.stdout.count("step  200  global loss") == 1
    assert (example10 / "emulator.ckpt").is_file()


def test_example_data_parallel_fpm(example10, installed, tmp_path):
    """The same example built by fpm, with ftorch_mpi as a dependency and mpif90 as the compiler."""
    if shutil.which("fpm", path=tool_env()["PATH"]) is None:
        pytest.skip("fpm not installed")
    project = tmp_path / "ex10"
    shutil.copytree(REPO / "examples" / "10_data_parallel", project)
    deps = [run([sys.executable, "-m", "ftorch", flag], cwd=project).stdout.strip()
            for flag in ("--fpm-dependency", "--fpm-mpi-dependency")]
    (project / "fpm.toml").write_text((project / "fpm.toml.in").read_text() + "\n".join(deps) + "\n")
    env = dict(tool_env(), FPM_LDFLAGS=installed["fpm_flags"])
    run(["fpm", "build", "--compiler", "mpif90"], cwd=project, env=env)
    (exe,) = (project / "build").glob("mpif90_*/app/data_parallel")
    proc = mpirun(2, exe, example10, "100")
    assert "trained on 2 ranks; example 10 finished" in proc.stdout


def test_example_node_shared(installed, tmp_path):
    """examples/18_node_shared built by CMake and run on 3 ranks of uneven sizes: one emulator held
    by rank 0, trained online on every rank's columns and then run in place of the physics."""
    require_mpi()
    run([sys.executable, REPO / "examples" / "10_data_parallel" / "write_model.py", tmp_path])
    bdir = tmp_path / "build"
    run(["cmake", "-S", REPO / "examples" / "18_node_shared", "-B", bdir, "-G", "Ninja",
         "-DCMAKE_Fortran_COMPILER=gfortran", f"-DCMAKE_PREFIX_PATH={installed['prefix']}"], env=tool_env())
    run(["cmake", "--build", bdir], env=tool_env())
    proc = mpirun(3, bdir / "node_shared", tmp_path, "300")
    assert "one model served 3 ranks; example 18 finished" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("node loss") == 3

