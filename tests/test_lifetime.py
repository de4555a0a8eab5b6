"""Value semantics of `=` and handle lifetime (tests/fortran/test_lifetime.f90) with every
supported Fortran compiler: gfortran 11, gfortran 12 (Debian 12's default) and flang 19."""

from __future__ import annotations

import pytest

from conftest import COMPILERS, IN_CI, NEWER_COMPILERS, assert_all_passed, require_compiler, run, tool_env

LIFETIME_COMPILERS = ["gfortran-11", "gfortran", "flang-new-19", *NEWER_COMPILERS]


def old_gfortran(compiler: str) -> bool:
    """gfortran 11 and 12: function results never finalized, components assigned without
    finalizing the left-hand side first."""
    return compiler in ("gfortran-11", "gfortran")


def new_gfortran(compiler: str) -> bool:
    """gfortran 13 and 14: the left-hand side and constructors finalized, as Fortran says, but no
    function result inside an array constructor."""
    return compiler in ("gfortran-13", "gfortran-14")


@pytest.fixture(scope="module", params=LIFETIME_COMPILERS)
def lifetime(request, cmake_consumer):
    compiler = request.param
    if compiler.startswith("gfortran") and IN_CI:
        # The README's table names gfortran 11 and 12: CI's `gfortran` must be 12 (Debian 12's).
        major = run([require_compiler(compiler), "-dumpversion"]).stdout.strip().split(".")[0]
        assert major == {"gfortran": "12"}.get(compiler, compiler.split("-")[-1]), (compiler, major)
    targets = None if compiler in COMPILERS else ["test_lifetime", "test_memory"]
    if targets is not None and compiler.startswith("gfortran"):
        targets.append("test_lifetime_checked")
    return compiler, cmake_consumer(compiler, targets) / "test_lifetime"


def test_value_semantics_and_lifetime(lifetime):
    compiler, binary = lifetime
    env = tool_env()
    env["FTORCH_LIVE_HANDLES_WARN"] = "0"
    assert_all_passed(run([binary], env=env, check=False))


def test_expressions_and_temporaries(lifetime, data_dir):
    """The README table's first row (expressions, temporaries, `x = f(x)`: no leak, no shared
    handle) rests on tests/fortran/test_memory.f90 too; test_cmake_consumer runs it with gfortran 12
    and flang, this with gfortran 11."""
    compiler, binary = lifetime
    if compiler != "gfortran-11":
        pytest.skip("run by test_cmake_consumer with this compiler")
    assert_all_passed(run([binary.parent / "test_memory", data_dir], check=False, timeout=600))


def test_growing_handles_warn_at_run_time(lifetime):
    """The run-time signal of a leak: with a low threshold, the unmarked function results of
    gfortran <= 12 (never finalized) trigger the warning; flang and gfortran 13 and 14 finalize them
    (outside array constructors), so they stay quiet."""
    compiler, binary = lifetime
    env = tool_env()
    env["FTORCH_LIVE_HANDLES_WARN"] = "300"
    proc = run([binary, "--plain-function-results"], env=env, check=False)
    assert_all_passed(proc)
    leaked = int(proc.stdout.split("plain function results leaked ")[1].split()[0])
    warned = "FTorch warning:" in proc.stderr and "torch_result" in proc.stderr
    if old_gfortran(compiler):
        assert leaked == 1000 and warned, proc.stderr
        # Once past the threshold, then again each time the count has doubled: at 301 and 603
        # handles (the thread holds fewer than 1206 here).
        assert proc.stderr.count("tensor/model handles created on this thread are alive") == 2, proc.stderr
    else:
        assert leaked == 0 and not warned, proc.stderr


STEP_GROWTH = "FTorch warning: the tensor/model handles alive grew from step to step "


@pytest.mark.parametrize("form, env, warnings", [
    ("growing-steps", {}, [100]),
    ("flat-steps", {}, []),
    ("growing-steps", {"FTORCH_STEP_GROWTH_WARN": "20"}, [20, 40, 80]),
    ("growing-steps", {"FTORCH_STEP_GROWTH_WARN": "0"}, []),
    ("growing-steps", {"FTORCH_LIVE_HANDLES_WARN": "0"}, []),
    ("plain-function-results-with-steps", {}, None)])
def test_handles_growing_step_after_step_warn(lifetime, form, env, warnings):
    """The run-time signal of a leak far below the threshold: live handles that grow between 100
    steps (forwards, optimizer and training steps, Python calls; the first step is the baseline)
    without falling warn once with the default settings, then after 200, 400...;
    FTORCH_STEP_GROWTH_WARN sets that number, 0 silences it, and FTORCH_LIVE_HANDLES_WARN=0
    silences it too. A loop that overwrites what it makes stays quiet. Function results without
    torch_result in such a loop: gfortran 11 and 12 leak one per step and warn, flang and gfortran 13
    and 14 neither."""
    compiler, binary = lifetime
    if warnings is None:
        warnings = [100] if old_gfortran(compiler) else []
    full = tool_env()
    full.pop("FTORCH_LIVE_HANDLES_WARN", None)
    full.pop("FTORCH_STEP_GROWTH_WARN", None)
    full.update(env)
    proc = run([binary, f"--{form}"], env=full, check=False)
    assert_all_passed(proc)
    gained = int(proc.stdout.split("handles gained over the loop ")[1].split()[0])
    leaking = form == "growing-steps" or (form == "plain-function-results-with-steps" and old_gfortran(compiler))
    assert gained == (150 if leaking else (1 if form == "flat-steps" else 0)), proc.stdout
    counts = [int(part.split()[0]) for part in proc.stderr.split(STEP_GROWTH)[1:]]
    assert counts == warnings, proc.stderr
    assert "FTorch warning" not in proc.stderr.replace(STEP_GROWTH, ""), proc.stderr


SELF_ASSIGNMENT = "FTorch warning: `x = x` with the same tensor on both sides"


def _form(binary, name, env=None):
    full = tool_env()
    full["FTORCH_LIVE_HANDLES_WARN"] = "0"
    full.update(env or {})
    return run([binary, f"--{name}"], env=full, check=False)


def _printed(proc, label: str, n: int = 1) -> list[str]:
    """The n words the program printed after `label`."""
    return proc.stdout.split(label)[1].split()[:n]


def _assert_bounds_check_reports(binary, form):
    """gfortran: `ts2 = ts1` into an unallocated array is undefined behaviour (the elemental `=` is
    called on elements that do not exist: a crash or an error, run to run), so it is run only as
    the README advises finding it, built with -fcheck=bounds, which stops at the statement."""
    proc = _form(binary.parent / "test_lifetime_checked", form)
    assert proc.returncode != 0 and "Array bound mismatch" in proc.stderr, proc.stdout + proc.stderr
    assert "copy allocated" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("form", ["constructor-of-user-types", "copy-user-array-into-unallocated",
                                  "constructor-into-allocated"])
def test_allocating_an_array_of_user_types(lifetime, form):
    """`arr = [s1, s2]` or `arr = src` into an unallocated array of a type with a tensor component:
    flang copies; gfortran 11 and 12 copy the handles bitwise and then assign each copied component
    to itself (a compiler bug: the components' `=` gets the copy on both sides), so the elements
    share the tensors until one side is deleted, and FTorch says so once on standard error (the
    `x = x` warning); the other side is then an error to use and a no-op to delete (never a
    double free). gfortran 13 and 14 do the same for `arr = src`; for `arr = [s1, s2]` they then
    finalize the constructor's bitwise copies, as Fortran says, which deletes the originals'
    tensors: both sides are stale afterwards (an error to use, never a wrong value). Into an
    allocated `arr`, every compiler copies, but gfortran 13 and 14 still finalize the constructor:
    the elements hold copies and the originals are stale."""
    compiler, binary = lifetime
    proc = _form(binary, form)
    assert_all_passed(proc)
    new = int(proc.stdout.split("new tensors ")[1].split()[0])
    usable = proc.stdout.split("element usable after deleting the original ")[1].split()[0] == "T"
    held = (_printed(proc, "elements hold", 2), _printed(proc, "originals hold", 2))
    if new_gfortran(compiler) and form == "constructor-of-user-types":
        assert (new, usable, held) == (-2, False, (["stale"] * 2, ["stale"] * 2)), proc.stdout
        assert proc.stderr.count(SELF_ASSIGNMENT) == 1, proc.stderr
        return
    if form == "constructor-into-allocated":
        assert SELF_ASSIGNMENT not in proc.stderr, proc.stderr
        if new_gfortran(compiler):
            assert (new, usable, held) == (0, True, (["1.", "2."], ["stale"] * 2)), proc.stdout
        else:
            assert (new, usable, held) == (2, True, (["1.", "2."], ["1.", "2."])), proc.stdout
        return
    assert held == (["1.", "2."], ["1.", "2."]), proc.stdout
    if compiler.startswith("gfortran"):
        assert (new, usable) == (0, False), proc.stdout
        assert proc.stderr.count(SELF_ASSIGNMENT) == 1 and "share their tensors" in proc.stderr, proc.stderr
    else:
        assert (new, usable) == (2, True), proc.stdout
        assert SELF_ASSIGNMENT not in proc.stderr, proc.stderr


@pytest.mark.parametrize("form", ["grow-history", "copy-into-unallocated"])
def test_allocating_assignment(lifetime, form):
    """`hist = [hist, t]` and `ts2 = ts1` into an unallocated array: a defined assignment never
    allocates (Fortran's rule). Where `assignment(=)` is imported, flang resolves these to FTorch's
    array `=`, which reports the shapes; gfortran 11 and 12 call the elemental `=` on the old
    elements, so `hist` keeps its size (each old element assigned to itself, which FTorch reports
    once on standard error); the unallocated `ts2` is undefined behaviour there, run only as built
    with -fcheck=bounds, which reports it."""
    compiler, binary = lifetime
    if compiler.startswith("gfortran") and form == "copy-into-unallocated":
        _assert_bounds_check_reports(binary, form)
        return
    proc = _form(binary, form)
    if compiler.startswith("gfortran"):
        assert proc.returncode == 0 and "history size 1" in proc.stdout, proc.stdout + proc.stderr
        assert proc.stderr.count(SELF_ASSIGNMENT) == 1 and "hist = [hist, t]" in proc.stderr, proc.stderr
    else:
        assert proc.returncode != 0, proc.stdout
        assert "[assignment(=)] the arrays of tensors have different shapes" in proc.stderr, proc.stderr


@pytest.mark.parametrize("form", ["grow-history-only-type", "copy-into-unallocated-only-type"])
def test_allocating_assignment_where_only_the_type_is_imported(lifetime, form):
    """The same in a scope that imports only `torch_tensor`: the type-bound elemental `=` is all
    there is, and no compiler reports the mismatch: `hist` keeps its size (the self-assignments
    of its old elements reported once on standard error); with flang, `ts2` stays unallocated and
    nothing reaches FTorch; with gfortran, as above (-fcheck=bounds reports it)."""
    compiler, binary = lifetime
    if compiler.startswith("gfortran") and form.startswith("copy"):
        _assert_bounds_check_reports(binary, form)
        return
    proc = _form(binary, form)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = "history size 1" if form.startswith("grow") else "copy allocated F"
    assert expected in proc.stdout, proc.stdout
    assert proc.stderr.count(SELF_ASSIGNMENT) == (1 if form.startswith("grow") else 0), proc.stderr


@pytest.mark.parametrize("form", ["shift-sections-only-type", "shift-user-types"])
def test_overlapping_sections_elsewhere(lifetime, form):
    """`ts(2:3) = ts(1:2)` where only the type is imported, and `hs(2:3) = hs(1:2)` for an array of
    a type with a tensor component (test_lifetime.f90's main run covers `use ftorch` scopes).
    Fortran's result is [1, 1, 2]. Tensors: refused ("stale copy", naming torch_assign) by every
    compiler there, after the first element and before any gets a value it should not have.
    Arrays of a type: flang finalizes the left-hand side first (deleting its tensors, whose
    elements then get new ones) and reads the right-hand side from a bitwise copy, whose second
    element is a finalized tensor: refused as a stale handle, the wrapped arrays untouched;
    gfortran 11 and 12 assign element by element from the array itself, without a copy: [1, 1, 1],
    wrong and silent, which no library can see (a compiler bug, in the README's table); gfortran
    13 and 14 do that too after finalizing the left-hand side (tensors [1, 1, 1], new ones, the
    wrapped arrays untouched). The loop the guide advises gives [1, 1, 2] in the tensors everywhere."""
    compiler, binary = lifetime
    proc = _form(binary, form)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.split("shifted ")[1].splitlines()[0]
    values, _, rest = line.partition(" stat ")
    stat, message = int(rest.split()[0]), rest
    if form == "shift-user-types":  # the loop the guide advises instead: right on every compiler
        assert proc.stdout.split("looped ")[1].split()[:3] == ["1.", "1.", "2."], proc.stdout
    held = _printed(proc, "held ", 3) if form == "shift-user-types" else None
    if form == "shift-user-types" and old_gfortran(compiler):
        assert (values.split(), stat, held) == (["1.", "1.", "1."], 0, ["1.", "1.", "1."]), proc.stdout
    elif form == "shift-user-types" and new_gfortran(compiler):
        assert (values.split(), stat, held) == (["1.", "2.", "3."], 0, ["1.", "1.", "1."]), proc.stdout
    elif form == "shift-user-types":
        assert values.split() == ["1.", "2.", "3."] and stat != 0 and "stale handle" in message, line
    else:
        assert values.split() == ["1.", "1.", "3."] and stat != 0, line
        assert "stale copy" in message and "torch_assign" in message, line


def test_structure_constructor_of_a_named_tensor(lifetime):
    """`s2 = state_t(s1%t)`: the constructor holds a bitwise copy of s1's handle. gfortran 11 and
    12 and flang copy the value into s2 (a new tensor); gfortran 13 and 14 finalize the
    constructor after the assignment, as Fortran says, which deletes s1's tensor: s1 is stale
    afterwards (an error to use, never a wrong value). The guide's safe form: `s2%t = s1%t`."""
    compiler, binary = lifetime
    proc = _form(binary, "structure-constructor")
    assert_all_passed(proc)
    new = int(_printed(proc, "new tensors ")[0])
    held = _printed(proc, "copy and original hold", 2)
    if new_gfortran(compiler):
        assert (new, held) == (0, ["5.", "stale"]), proc.stdout
    else:
        assert (new, held) == (1, ["5.", "5."]), proc.stdout


# leaked tensors per 10 repetitions: (gfortran 11/12, gfortran 13/14, flang 19/22)
LEAKS = {
    "b2 = b1 (allocatable array component)": (0, 0, 20),
    "b2%ts = b1%ts": (0, 0, 0),
    "an impure elemental function without torch_result": (30, 20, 30),
    "an impure elemental function with torch_result": (0, 0, 0),
    "an expression argument never read": (10, 0, 0),
}


def test_leaks_that_depend_on_the_compiler(lifetime):
    """What the guide lists per compiler: flang finalizes `b2` before `b2 = b1` but binds no
    finalizer for the allocatable array of tensors (no compiler gets one), so the old elements'
    tensors stay alive (`b2%ts = b1%ts` is the safe form); an impure elemental function returning
    a tensor leaks on every compiler without torch_result, none with it; gfortran 11 and 12 never
    free an expression argument that the procedure does not read (they never finalize it; the
    others do)."""
    compiler, binary = lifetime
    proc = _form(binary, "leak-patterns")
    assert_all_passed(proc)
    column = 0 if old_gfortran(compiler) else 1 if new_gfortran(compiler) else 2
    for form, counts in LEAKS.items():
        leaked = int(_printed(proc, f"leaked by {form} ")[0])
        assert leaked == counts[column], (form, proc.stdout)


def test_assignment_to_a_dummy_argument(lifetime):
    """`dst = src` of a type with an allocatable and a tensor component, `dst` a dummy argument:
    gfortran 11 and 12 finalize a bitwise temporary copy of `dst` on return, which deletes
    `dst%t` (stale afterwards: an error to use); gfortran 13 and 14 and flang copy. Assigning the
    components one by one (`dst%a = src%a; dst%t = src%t`) writes the value into the array `dst%t`
    wraps with every compiler."""
    compiler, binary = lifetime
    proc = _form(binary, "assignment-to-a-dummy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    whole = _printed(proc, "whole:")[0]
    assert whole == ("stale" if old_gfortran(compiler) else "3."), proc.stdout
    assert _printed(proc, "components:", 2) == ["3.", "3."], proc.stdout


def test_torch_assign_of_another_shape_is_an_error(lifetime):
    """torch_assign(a, b) with a(2,3) and b(3,2): the same number of tensors, no element of one
    paired with an element of the other: the program stops naming the mismatch."""
    _, binary = lifetime
    proc = _form(binary, "torch-assign-other-shape")
    assert proc.returncode != 0 and "assigned" not in proc.stdout, proc.stdout + proc.stderr
    assert "[assignment(=)] the arrays of tensors have different shapes" in proc.stderr, proc.stderr


def test_assignment_into_a_view_of_a_leaf_that_requires_grad_is_an_error(lifetime):
    """v = torch_reshape(leaf) then v = 7: the values would land in the leaf behind autograd's back
    (PyTorch refuses the in-place write into a view of such a leaf): the program stops, naming it."""
    _, binary = lifetime
    proc = _form(binary, "assign-into-view-of-leaf")
    assert proc.returncode != 0 and "assigned" not in proc.stdout, proc.stdout + proc.stderr
    assert "[assignment(=)]" in proc.stderr and "leaf" in proc.stderr, proc.stderr


def test_self_assignment_of_a_type(lifetime):
    """`s = s` of a variable of a type with a tensor component. flang and gfortran 13 and 14
    finalize `s` (deleting `s%t`) before assigning the components: a stale-handle error, `s%t`
    stale afterwards. gfortran 11 and 12 leave `s` alone when they see one variable on both sides;
    through two dummy arguments naming it (`call copy(s, s)`) they finalize a bitwise temporary
    (the `dst = src` bug): no error, but `s%t` is stale afterwards. Never a wrong value."""
    compiler, binary = lifetime
    proc = _form(binary, "self-assignment-of-a-type")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    direct = (int(_printed(proc, "direct stat ")[0]), _printed(proc, "direct holds")[0])
    dummies = (int(_printed(proc, "through dummies stat ")[0]), _printed(proc, "through dummies holds")[0])
    if old_gfortran(compiler):
        assert (direct, dummies) == ((0, "4."), (0, "stale")), proc.stdout
    else:
        assert (direct, dummies) == ((2, "stale"), (2, "stale")), proc.stdout
        assert "right-hand side tensor is not a live tensor" in proc.stdout, proc.stdout


def test_intent_out_array_of_tensors(lifetime):
    """An `intent(out)` array of tensors (no finalizer is bound for arrays): flang resets the
    elements to unconstructed on entry, as Fortran says, so the tensors they held stay alive (2 per
    call of a 2-element array); gfortran (11 to 14) passes the handles in, and constructing into
    them frees the old tensors."""
    compiler, binary = lifetime
    proc = _form(binary, "intent-out-array")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    leaked = int(_printed(proc, "intent(out) array leaked ")[0])
    entered = _printed(proc, "elements arrived constructed ")[0] == "T"
    if compiler.startswith("gfortran"):
        assert (leaked, entered) == (0, True), proc.stdout
    else:
        assert (leaked, entered) == (20, False), proc.stdout


def test_unended_catch_scope_is_reported_at_exit(lifetime):
    """A catch scope begun in the main program and never ended keeps the failures that follow
    (the program goes on); when the program ends, FTorch names the scope and the failure it kept."""
    _, binary = lifetime
    proc = _form(binary, "unended-catch-scope")
    assert "reached the end" in proc.stdout, proc.stdout + proc.stderr
    assert ("FTorch warning: 1 catch scope begun by torch_catch_begin was never ended" in proc.stderr
            and "[torch_reshape] shape '[7]' is invalid" in proc.stderr), proc.stderr


def test_self_assignment_warning_can_be_silenced(lifetime):
    """FTORCH_SELF_ASSIGNMENT_WARN=0 turns the report of `x = x` off."""
    _, binary = lifetime
    proc = _form(binary, "grow-history-only-type", env={"FTORCH_SELF_ASSIGNMENT_WARN": "0"})
    assert proc.returncode == 0 and "history size 1" in proc.stdout, proc.stdout + proc.stderr
    assert SELF_ASSIGNMENT not in proc.stderr, proc.stderr



# The checks of test_lifetime.f90 that fail when expression results are flagged for a finalizer
# that this compiler does not run on them (FTORCH_RESULT_KIND=finalized): gfortran 11 and 12
# finalize no function result, gfortran 13 and 14 none inside an array constructor.
_LEAKS_WITHOUT_FINALIZER = {
    "old": ["... with no tensor left behind", "assigning a function result: no handle leaks",
            "r = torch_result(...) in a function: no handle leaks",
            "... and release the temporaries they were given",
            "expressions in array constructors of accepted calls are released", "no handle left alive at the end"],
    "new": ["... and release the temporaries they were given",
            "expressions in array constructors of accepted calls are released", "no handle left alive at the end"],
}


def test_each_result_kind_forced(lifetime, data_dir):
    """The finalization probe picks one of two paths for expression results (ftorch_result_kind);
    FTORCH_RESULT_KIND forces either, so each path runs with every compiler, not only with those
    that pick it. Released by their first read (`temporary`): correct everywhere, flang included
    (its finalizer then deletes a stale handle, a no-op). Deleted by the finalizer (`finalized`):
    correct with flang; with gfortran the suite must catch the leaks of the results it does not
    finalize, exactly those. Any other value stops the program, naming the variable."""
    compiler, binary = lifetime
    env = tool_env()
    env["FTORCH_LIVE_HANDLES_WARN"] = "0"
    assert_all_passed(run([binary], env={**env, "FTORCH_RESULT_KIND": "temporary"}, check=False))
    if compiler.startswith("flang"):
        assert_all_passed(run([binary.parent / "test_memory", data_dir],
                              env={**env, "FTORCH_RESULT_KIND": "temporary"}, check=False, timeout=600))
    proc = run([binary], env={**env, "FTORCH_RESULT_KIND": "finalized"}, check=False)
    failed = [line[len("FAIL "):].strip() for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
    if compiler.startswith("flang"):
        assert_all_passed(proc)
    else:
        assert failed == _LEAKS_WITHOUT_FINALIZER["old" if old_gfortran(compiler) else "new"], proc.stdout
        assert proc.returncode != 0
    for wrong in ("finalised", "temporary" + " " * 10 + "x"):  # (the second longer than what is read)
        proc = run([binary], env={**env, "FTORCH_RESULT_KIND": wrong}, check=False)
        assert proc.returncode != 0, wrong
        assert "[ftorch_result_kind] FTORCH_RESULT_KIND must be temporary, finalized or empty" in proc.stderr, proc.stderr
