"""The C interface's one definition (src/capi/*.capi): the library, its headers and the Fortran
module generated from it agree, a C++ definition that differs from it does not compile, and the
generated C and Fortran sides pass every kind of argument correctly at run time."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COMPILERS, REPO, assert_all_passed, helper, require_compiler, run


def _load_generator():
    spec = importlib.util.spec_from_file_location("ftorch_capi_generate", REPO / "src" / "capi" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
CONCERNS = gen.load(REPO / "src" / "capi")
FUNCTIONS = [f for c in CONCERNS for f in c.functions]
NAMES = {f.name for f in FUNCTIONS}


def test_the_library_exports_exactly_the_defined_functions(installed):
    lib = Path(installed["libdir"]) / "libftorch_c.so"
    symbols = run(["nm", "-D", "--defined-only", lib]).stdout
    exported = set(re.findall(r"\s[TW]\s+((?:ftc|torchfort)_\w+)$", symbols, re.M))
    assert len(NAMES) > 150
    assert sorted(NAMES - exported) == [], "defined in src/capi but not implemented (or not with C linkage)"
    assert sorted(exported - NAMES) == [], "exported by the library but missing from src/capi"


def test_installed_headers_and_fortran_module_are_the_generated_ones(installed, tmp_path):
    gen.generate(REPO / "src" / "capi", tmp_path / "include", tmp_path / "ftorch_c_api.f90")
    includedir = Path(helper("--includedir"))
    for header in sorted((tmp_path / "include").iterdir()):
        assert (includedir / header.name).read_text() == header.read_text(), header.name
    sources = helper("--fortran-sources").split()
    installed_module = next(Path(s) for s in sources if Path(s).name == "ftorch_c_api.f90")
    assert installed_module.read_text() == (tmp_path / "ftorch_c_api.f90").read_text()
    # compiled before every module that uses it
    names = [Path(s).name for s in sources]
    assert names.index("ftorch_c_api.f90") < names.index("ftorch_errors.f90")


def test_no_c_function_is_declared_by_hand():
    """The C side and the Fortran side take their declarations from the generated files only."""
    hand_written = []
    for path in sorted((REPO / "src" / "fortran").rglob("*")):
        if path.suffix in (".f90", ".fypp") and re.search(r'bind\(\s*c\s*,\s*name\s*=\s*"(ftc|torchfort)_', path.read_text(), re.I):
            hand_written.append(str(path.relative_to(REPO)))
    for path in sorted((REPO / "src" / "cpp").iterdir()):
        if path.suffix in (".h", ".hpp") and re.search(r"^\s*FTC_API\b", path.read_text(), re.M):
            hand_written.append(str(path.relative_to(REPO)))
    assert hand_written == []
    # Every translation unit that defines entry points sees their declarations (internal.hpp, which
    # includes ftorch_c.h, is the precompiled header of each source of the library), which is what
    # makes a differing definition an error.
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "target_precompile_headers(ftorch_c_objects PRIVATE src/cpp/internal.hpp)" in cmake
    assert '#include "ftorch_c.h"' in (REPO / "src" / "cpp" / "internal.hpp").read_text()
    library_sources = re.search(r"add_library\(ftorch_c_objects OBJECT(.*?)\)", cmake, re.S).group(1)
    for path in sorted((REPO / "src" / "cpp").glob("*.cpp")):
        if re.search(r"^(?:int|int64_t|void|double|const char \*)\s*ftc_\w+\(", path.read_text(), re.M):
            assert f"src/cpp/{path.name}" in library_sources, path.name


def _stub(f, params: str) -> str:
    body = "" if f.result == "void" else " return {};"
    return f'extern "C" {f.result} {f.name}({params}) {{{body} }}\n'


def test_a_definition_that_differs_from_its_declaration_does_not_compile(installed, tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    includedir = helper("--includedir")
    umbrella = '#include "ftorch_c.h"\n' + "".join(f'#include "{c.header}"\n' for c in CONCERNS if c.foreign)
    right = umbrella + "".join(_stub(f, ", ".join(p.c() for p in f.params) or "void")
                                                 for f in FUNCTIONS)
    (tmp_path / "right.cpp").write_text(right)
    run([cxx, "-std=c++17", "-fsyntax-only", f"-I{includedir}", tmp_path / "right.cpp"])
    # Each function again with one parameter more (or its first parameter's type changed): every
    # one of them is reported.
    wrong = umbrella
    for f in FUNCTIONS:
        params = [p.c() for p in f.params]
        params = (["long double changed"] + params[1:]) if params else ["int extra"]
        wrong += _stub(f, ", ".join(params))
    (tmp_path / "wrong.cpp").write_text(wrong)
    proc = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-fmax-errors=0", f"-I{includedir}",
                           tmp_path / "wrong.cpp"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode != 0
    conflicts = set(re.findall(r"conflicting declaration of C function .[^(]*?((?:ftc|torchfort)_\w+)\(", proc.stderr))
    assert conflicts == NAMES, sorted(NAMES - conflicts)[:10]


def test_generated_headers_are_strict_c99(installed, tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    includedir = helper("--includedir")
    for c in CONCERNS:
        (tmp_path / "one.c").write_text(f'#include "{c.header}"\n#include "{c.header}"\nint main(void) {{ return 0; }}\n')
        run([cc, "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only", f"-I{includedir}",
             tmp_path / "one.c"])


# ---------------------------------------------------------------------- the generator on its own

ROUND_TRIP_CAPI = """\
/* probe.capi - one function per kind of argument the generator maps. */

typedef struct probe_s *probe;
typedef void *probe_ctx;
typedef int (*probe_fn)(int x);

FTC_API int probe_scalars(int a, int32_t b, int64_t c, double d, float e, size_t f);
FTC_API int probe_arrays(const double x[], int n, int64_t out[], const probe hs[], probe many[]);
FTC_API int probe_handles(probe h, probe *out, const probe *in, probe_ctx ctx, void *data);
FTC_API int probe_strings(const char *s, int64_t len, char *buf, int64_t buflen);
FTC_API int probe_outputs(int *i, int64_t *j, double *d, float *f, const int64_t **where, void **data);
FTC_API int probe_nullable(FTC_NULLABLE double *x, FTC_NULLABLE const int32_t *y);
FTC_API int probe_callback(probe_fn fn, int x);
FTC_API const char *probe_name(void);
FTC_API int64_t probe_count(void);
FTC_API double probe_half(double x);
FTC_API void probe_set(int *flag);

/* Named options with defaults. */
FTC_OPTIONS probe_options {
  double rate = 1e-3;          /* a rate */
  int64_t count = 20;
  int on = 0;
  double third = 1.0 / 3.0;
  float small = 0.5;
  int32_t code = -7;
};
FTC_API int probe_take_options(const probe_options *options, int changed);
FTC_API int probe_fill_options(probe_options *options);
"""

ROUND_TRIP_C = r"""
#include <string.h>
#include "ftorch_c_probe.h"
static struct probe_s { int tag; } objects[3] = {{1}, {2}, {3}};
static const int64_t table[2] = {7, 8};
static double slot = 2.5;
int probe_scalars(int a, int32_t b, int64_t c, double d, float e, size_t f) {
  return a == -3 && b == 5 && c == 9000000000LL && d == 0.25 && e == 1.5f && f == 12 ? 0 : 1;
}
int probe_arrays(const double x[], int n, int64_t out[], const probe hs[], probe many[]) {
  double sum = 0;
  for (int i = 0; i < n; ++i) { sum += x[i]; out[i] = 10 * (i + 1); }
  many[0] = hs[1]; many[1] = hs[0];
  return sum == 6.0 ? 0 : 1;
}
int probe_handles(probe h, probe *out, const probe *in, probe_ctx ctx, void *data) {
  *out = &objects[h->tag];
  return (*in)->tag == 1 && ctx == (void *)&objects[2] && *(double *)data == 4.0 ? 0 : 1;
}
int probe_strings(const char *s, int64_t len, char *buf, int64_t buflen) {
  if (len != 5 || memcmp(s, "hello", 5) != 0 || buflen < 3) return 1;
  memcpy(buf, "abc", 3);
  return 0;
}
int probe_outputs(int *i, int64_t *j, double *d, float *f, const int64_t **where, void **data) {
  *i = 11; *j = 12; *d = 13.5; *f = 14.5f; *where = table; *data = &slot;
  return 0;
}
int probe_nullable(double *x, const int32_t *y) {
  if (x != NULL) *x = 42.0;
  return (x == NULL ? 0 : 1) + (y != NULL && *y == 9 ? 10 : 0);
}
int probe_callback(probe_fn fn, int x) { return fn(x); }
const char *probe_name(void) { return "probe"; }
int64_t probe_count(void) { return 1LL << 40; }
double probe_half(double x) { return x / 2; }
void probe_set(int *flag) { *flag = 1; }
probe probe_object(int i) { return &objects[i]; }
/* The options as Fortran made them: its defaults must be the header's, but for `changed`. */
int probe_take_options(const probe_options *o, int changed) {
  probe_options d = PROBE_OPTIONS_DEFAULTS;
  if (changed) d.count = 3;
  return o->rate == d.rate && o->count == d.count && o->on == d.on && o->third == d.third && o->small == d.small &&
         o->code == d.code && o->third == 1.0 / 3.0 ? 0 : 1;
}
int probe_fill_options(probe_options *o) {
  o->rate = 0.25; o->count = 5; o->on = 1; o->third = 2; o->small = 4; o->code = 9;
  return 0;
}
"""

ROUND_TRIP_F90 = """\
module probe_callbacks
  use, intrinsic :: iso_c_binding, only: c_int
  implicit none
contains
  integer(c_int) function triple(x) bind(c)
    integer(c_int), value :: x
    triple = 3 * x
  end function triple
end module probe_callbacks

program probe_round_trip
  use, intrinsic :: iso_c_binding
  use ftorch_c_api
  use probe_callbacks, only: triple
  implicit none
  interface
    function probe_object(i) result(p) bind(c)
      import :: c_int, c_ptr
      integer(c_int), value :: i
      type(c_ptr) :: p
    end function probe_object
  end interface
  integer :: passed = 0, failed = 0
  real(c_double) :: x(3) = [1d0, 2d0, 3d0]
  real(c_double), target :: four = 4d0, written
  real(c_double) :: d
  real(c_float) :: f
  integer(c_int) :: i
  integer(c_int32_t), target :: nine = 9
  integer(c_int64_t) :: j, out(3)
  integer(c_int64_t), pointer :: values(:)
  real(c_double), pointer :: slot
  type(c_ptr) :: h, got, hs(2), many(2), where, data
  character(kind=c_char) :: buf(3)
  character(kind=c_char), pointer :: name(:)
  type(probe_options) :: options

  call check(probe_scalars(-3_c_int, 5_c_int32_t, 9000000000_c_int64_t, 0.25d0, 1.5, 12_c_size_t) == 0, "scalars")
  hs = [probe_object(0), probe_object(1)]
  call check(probe_arrays(x, 3_c_int, out, hs, many) == 0, "arrays in")
  call check(all(out == [10, 20, 30]), "array out")
  call check(c_associated(many(1), hs(2)) .and. c_associated(many(2), hs(1)), "handle arrays out")
  h = probe_object(1)
  got = c_null_ptr
  call check(probe_handles(h, got, hs(1), probe_object(2), c_loc(four)) == 0, "handles in")
  call check(c_associated(got, probe_object(2)), "handle out")
  call check(probe_strings("hello", 5_c_int64_t, buf, 3_c_int64_t) == 0, "string in")
  call check(all(buf == ["a", "b", "c"]), "string out")
  call check(probe_outputs(i, j, d, f, where, data) == 0, "outputs")
  call check(i == 11 .and. j == 12 .and. d == 13.5d0 .and. f == 14.5, "scalar outputs")
  call c_f_pointer(where, values, [2])
  call c_f_pointer(data, slot)
  call check(all(values == [7, 8]) .and. slot == 2.5d0, "pointer outputs")
  call check(probe_nullable(c_null_ptr, c_null_ptr) == 0, "null pointers")
  call check(probe_nullable(c_loc(written), c_loc(nine)) == 11 .and. written == 42d0, "pointers given")
  call check(probe_callback(c_funloc(triple), 7_c_int) == 21, "callback")
  call c_f_pointer(probe_name(), name, [5])
  call check(all(name == ["p", "r", "o", "b", "e"]), "string result")
  call check(probe_count() == 2_c_int64_t**40, "int64 result")
  call check(probe_half(3d0) == 1.5d0, "double result")
  i = 0
  call probe_set(i)
  call check(i == 1, "subroutine")
  call check(probe_take_options(options, 0_c_int) == 0, "option defaults")
  options%count = 3
  call check(probe_take_options(options, 1_c_int) == 0, "an option set")
  call check(probe_fill_options(options) == 0, "options filled")
  call check(options%rate == 0.25d0 .and. options%count == 5 .and. options%on == 1 .and. options%third == 2d0 &
             .and. options%small == 4.0 .and. options%code == 9, "options read back")
  print "(i0, a, i0, a)", passed, " passed, ", failed, " failed"
contains
  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      passed = passed + 1
    else
      failed = failed + 1
      print "(2a)", "FAILED: ", what
    end if
  end subroutine check
end program probe_round_trip
"""


@pytest.mark.parametrize("fc", COMPILERS)
def test_generated_c_and_fortran_sides_agree_at_run_time(fc, tmp_path):
    """Every mapping rule of the generator, checked by a C implementation that receives and
    returns values through the generated header and a Fortran program that uses the generated
    module (no torch involved)."""
    fc = require_compiler(fc)
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "capi").mkdir()
    (tmp_path / "capi" / "probe.capi").write_text(ROUND_TRIP_CAPI)
    gen.generate(tmp_path / "capi", tmp_path / "include", tmp_path / "ftorch_c_api.f90")
    (tmp_path / "probe.c").write_text(ROUND_TRIP_C)
    (tmp_path / "main.f90").write_text(ROUND_TRIP_F90)
    run([cc, "-std=c99", "-Wall", "-Werror", "-c", f"-I{tmp_path / 'include'}", "probe.c"], cwd=tmp_path)
    run([fc, "ftorch_c_api.f90", "main.f90", "probe.o", "-o", "probe"], cwd=tmp_path)
    assert assert_all_passed(run([tmp_path / "probe"], cwd=tmp_path)) == 22


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FTC_API int bad(struct unknown_s *u);", "no Fortran type for the C type 'struct unknown_s'"),
        ("FTC_API int bad(long double x);", "no Fortran type for the C type 'long double'"),
        ("FTC_API int bad(FTC_NULLABLE int x);", "FTC_NULLABLE applies to a pointer parameter"),
        ("FTC_API int bad(int n, int N);", "parameter names must differ in Fortran"),
        ("FTC_API int bad(int x);\nFTC_API int bad(int y);", "bad is defined twice"),
        ("FTC_API int bad(int);", "cannot read the parameter 'int'"),
        ("FTC_OPTIONS bad_options { double x; };", "cannot read the option 'double x;'"),
        ("FTC_OPTIONS bad_options { char c = 1; };", "cannot read the option 'char c = 1;'"),
        ("FTC_OPTIONS bad_options { double x = PI; };", "the default of x must be a number"),
        ("FTC_OPTIONS bad_options {\n};", "bad_options has no options"),
    ],
)
def test_the_generator_rejects_a_definition_it_cannot_map(tmp_path, text, message):
    (tmp_path / "capi").mkdir()
    (tmp_path / "capi" / "bad.capi").write_text(f"/* bad.capi */\n\n{text}\n")
    with pytest.raises(gen.DefinitionError, match=re.escape(message)):
        gen.generate(tmp_path / "capi", tmp_path / "include", tmp_path / "out.f90")


CALLBACK_MATCHING = """module callback_probe
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_ptr
  use ftorch_c_api, only: ftc_pack_fn
  implicit none
  procedure(ftc_pack_fn), pointer :: passed => pack
contains
  function pack(data, tensor, packed) result(status) bind(c)
    type(c_ptr), value :: data
    type(c_ptr), value :: tensor
    type(c_ptr), intent(inout) :: packed
    integer(c_int) :: status
    packed = tensor
    status = 0
    if (.false.) packed = data
  end function pack
end module callback_probe
"""


@pytest.mark.parametrize("fc", COMPILERS)
def test_a_procedure_passed_for_a_callback_must_match_its_c_type(fc, tmp_path):
    """ftorch_c_api has an abstract interface per callback typedef of src/capi; FTorch passes its
    trampolines (and ftorch_mpi its collectives) through procedure pointers of those interfaces,
    so a Fortran procedure that differs from its C type in any characteristic does not compile:
    checked here for each kind of difference, with the module generated from src/capi."""
    fc = require_compiler(fc)
    gen.generate(REPO / "src" / "capi", tmp_path / "include", tmp_path / "ftorch_c_api.f90")
    api = (tmp_path / "ftorch_c_api.f90").read_text()
    abstract = api.split("  abstract interface\n")[1].split("  end interface\n")[0]
    for name in ("ftc_grad_hook_fn", "ftc_pack_fn", "ftc_unpack_fn", "ftc_segment_fn", "ftc_backward_fn",
                 "ftc_closure", "ftc_allreduce_fn", "ftc_gatherv_fn", "ftc_comm_free_fn"):
        assert re.search(rf"^    (function|subroutine) {name}\(", abstract, re.M), name
    run([fc, "-c", "ftorch_c_api.f90"], cwd=tmp_path)
    (tmp_path / "good.f90").write_text(CALLBACK_MATCHING)
    run([fc, "-c", "good.f90"], cwd=tmp_path)
    wrong = {
        "intent": ("type(c_ptr), intent(inout) :: packed", "type(c_ptr), intent(out) :: packed"),
        "value": ("type(c_ptr), value :: data", "type(c_ptr) :: data"),
        "result kind": ("integer(c_int) :: status", "integer(c_int64_t) :: status"),
        "rank": ("type(c_ptr), intent(inout) :: packed", "type(c_ptr), intent(inout) :: packed(*)"),
    }
    for what, (right, bad) in wrong.items():
        source = tmp_path / f"bad_{what.replace(' ', '_')}.f90"
        text = CALLBACK_MATCHING.replace(right, bad).replace("callback_probe", "callback_bad")
        if what == "rank":  # the body stays valid: only the interface differs
            text = text.replace("packed = ", "packed(1) = ")
        source.write_text(text)
        proc = subprocess.run([fc, "-c", source.name], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode != 0, f"{what}: a wrong callback compiled\n{proc.stdout}{proc.stderr}"
        assert re.search(r"(?i)interface mismatch|incompatible", proc.stdout + proc.stderr), proc.stderr
