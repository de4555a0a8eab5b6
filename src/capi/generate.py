"""The one definition of FTorch's C interface, and what is generated from it.

Each ``src/capi/<concern>.capi`` file defines the C entry points of one concern (the same split as
``src/cpp/<concern>.cpp`` and the Fortran modules). From them the build writes

* the C headers ``ftorch_c_<concern>.h`` and the umbrella ``ftorch_c.h`` (installed; every C++
  translation unit includes them, so a definition whose signature differs from its declaration
  does not compile: two ``extern "C"`` functions of one name cannot have two signatures);
* the Fortran module ``ftorch_c_api``: one ``bind(c)`` interface per entry point, used by every
  other Fortran module (no module declares a C function itself).

A ``.capi`` file is C text:

* the leading comment, ``#include`` and conditional (``#if``...) lines (its prologue) open the header, before
  ``extern "C"``; ``#include`` lines at its very end (its epilogue) close it, after ``extern "C"``
  (torchfort.h ends by including torchfort_rl.h, as TorchFort's does); the rest is copied inside it,
  comments included;
* an entry point is a declaration that starts with ``FTC_API`` and ends with ``;``;
* a parameter written ``T name[]`` is an array (Fortran: ``name(*)``); ``T *name`` is one value
  the function reads (``const``) or writes; ``FTC_NULLABLE T *name`` may be null (Fortran passes a
  ``type(c_ptr)`` by value: ``c_loc(x)`` or ``c_null_ptr``);
* ``typedef struct x_s *x;`` and ``typedef void *x;`` declare handle types (``type(c_ptr)``);
  ``typedef R (*x)(...);`` a callback type (``type(c_funptr)``);
* ``FTC_OPTIONS name { double lr = 1e-3; /* doc */ ... };`` declares a structure of named options
  with their defaults: the header gets ``typedef struct name {...} name;`` and the initializer
  ``NAME_DEFAULTS``; the Fortran module a ``bind(c)`` type whose components start at the defaults.
  A parameter ``const name *options`` then passes one (Fortran: ``type(name), intent(in)``).

Command line: ``python generate.py CAPI_DIR HEADER_DIR FORTRAN_FILE``; files are rewritten only
when their text changes (so that the build recompiles nothing otherwise).
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import sys

# C types of values passed by value, and their Fortran kinds.
_NUMERIC = {
    "int": "integer(c_int)",
    "int32_t": "integer(c_int32_t)",
    "int64_t": "integer(c_int64_t)",
    "size_t": "integer(c_size_t)",
    "double": "real(c_double)",
    "float": "real(c_float)",
    "char": "character(kind=c_char)",
    "bool": "logical(c_bool)",
}
_FORTRAN_NAMES = ("c_ptr", "c_funptr", "c_int", "c_int32_t", "c_int64_t", "c_size_t", "c_double", "c_float",
                  "c_char", "c_bool")
_LINE = 100  # Fortran lines are wrapped before this column (every compiler accepts 132)
_OPTION_TYPES = ("double", "float", "int", "int32_t", "int64_t")
_KIND = {"double": "c_double", "float": "c_float", "int": "c_int", "int32_t": "c_int32_t", "int64_t": "c_int64_t"}


class DefinitionError(ValueError):
    """A .capi file that the generator cannot read: the message names the file and the entry."""


@dataclasses.dataclass
class Param:
    name: str
    base: str          # the C type without const, pointers and brackets ("ftc_tensor", "double")
    const: bool
    pointers: int      # number of '*'
    array: bool        # written name[]
    nullable: bool     # FTC_NULLABLE

    def c(self) -> str:
        text = ("FTC_NULLABLE " if self.nullable else "") + ("const " if self.const else "") + self.base
        text += " " + "*" * self.pointers if self.pointers else " "
        return text + self.name + ("[]" if self.array else "")


@dataclasses.dataclass
class Option:
    ctype: str
    name: str
    default: str       # a C constant expression: a number, or a number / a number
    doc: str


@dataclasses.dataclass
class Function:
    name: str
    result: str        # C result type ("int", "void", "const char *", a handle type)
    params: list
    concern: str


@dataclasses.dataclass
class Concern:
    name: str          # optim
    prologue: str      # leading comment and #include lines
    body: str          # the rest, declarations included
    epilogue: str      # trailing #include lines
    functions: list
    options: dict      # structure name -> [Option]
    callbacks: list = dataclasses.field(default_factory=list)  # callback typedefs, as Functions

    @property
    def header(self) -> str:
        return header_name(self.name)

    @property
    def foreign(self) -> bool:
        """An API of another project that FTorch implements under that project's names (TorchFort):
        its own header names, not part of the umbrella ftorch_c.h."""
        return self.name.startswith(FOREIGN_PREFIXES)


# Concerns whose .capi file name starts with one of these keep that name for their header
# (torchfort.capi -> torchfort.h), as the project whose API they implement names it.
FOREIGN_PREFIXES = ("torchfort",)


def fortran_name(f) -> str:
    """The Fortran name of an entry point's interface: its C name, but ``c_<name>`` for a foreign API,
    whose Fortran module (e.g. torchfort) defines procedures of the C names itself (gfortran checks
    procedures of one name against each other, whatever module they come from)."""
    return f"c_{f.name}" if f.concern.startswith(FOREIGN_PREFIXES) else f.name


def header_name(concern: str) -> str:
    return f"{concern}.h" if concern.startswith(FOREIGN_PREFIXES) else f"ftorch_c_{concern}.h"


_OPTIONS = re.compile(r"FTC_OPTIONS\s+(?P<name>\w+)\s*\{(?P<fields>.*?)\}\s*;", re.S)
_FIELD = re.compile(r"^\s*(?P<type>\w+)\s+(?P<name>\w+)\s*=\s*(?P<default>[^;]+?)\s*;\s*(?:/\*(?P<doc>.*?)\*/)?\s*$")
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_ENUM = re.compile(r"typedef\s+enum\s+\w*\s*\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;", re.S)
_DECL = re.compile(r"FTC_API\s+(?P<head>[^;(]*?)\s*\((?P<params>[^;]*?)\)\s*;", re.S)
_CALLBACK = re.compile(r"typedef\s+(?P<result>[\w\s*]+?)\s*\(\s*\*\s*(?P<name>\w+)\s*\)\s*\((?P<params>[^;]*?)\)\s*;",
                       re.S)


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group(0)), text, flags=re.S)


def _split_prologue(text: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    end, in_comment = 0, False
    for i, line in enumerate(lines):
        s = line.strip()
        if in_comment:
            in_comment = "*/" not in s
        elif s.startswith("/*"):
            in_comment = "*/" not in s
        elif not (s == "" or re.match(r"#\s*(include|if|ifdef|ifndef|elif|else|endif)\b", s)):
            break
        end = i + 1
    return "".join(lines[:end]).rstrip() + "\n", "".join(lines[end:]).strip("\n") + "\n"


def _split_epilogue(body: str) -> tuple[str, str]:
    lines = body.rstrip("\n").splitlines(keepends=True)
    start = len(lines)
    while start > 0 and (lines[start - 1].strip() == "" or re.match(r"#\s*include\b", lines[start - 1].strip())):
        start -= 1
    return "".join(lines[:start]).rstrip("\n") + "\n", "".join(lines[start:]).strip("\n")


def _param(text: str, where: str) -> Param:
    words = text.replace("*", " * ").split()
    nullable = "FTC_NULLABLE" in words
    words = [w for w in words if w != "FTC_NULLABLE"]
    const = "const" in words
    words = [w for w in words if w != "const"]
    name = words[-1]
    array = name.endswith("[]")
    name = name[:-2] if array else name
    pointers = words.count("*")
    base = " ".join(w for w in words[:-1] if w != "*")
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or not base:
        raise DefinitionError(f"{where}: cannot read the parameter '{text}'")
    if nullable and (pointers == 0 or array):
        raise DefinitionError(f"{where}: FTC_NULLABLE applies to a pointer parameter ('{text}')")
    return Param(name, base, const, pointers, array, nullable)


def _options(name: str, fields: str, where: str) -> list:
    options = []
    for line in fields.strip().splitlines():
        m = _FIELD.match(line)
        if not m or m.group("type") not in _OPTION_TYPES:
            raise DefinitionError(f"{where}: {name}: cannot read the option '{line.strip()}' (expected "
                                  f"'TYPE NAME = DEFAULT; /* doc */' with TYPE one of {', '.join(_OPTION_TYPES)})")
        default = m.group("default")
        if not all(_NUMBER.fullmatch(part.strip()) for part in default.split("/")):
            raise DefinitionError(f"{where}: {name}: the default of {m.group('name')} must be a number "
                                  f"(or a number / a number), not '{default}'")
        options.append(Option(m.group("type"), m.group("name"), default, " ".join((m.group("doc") or "").split())))
    if not options:
        raise DefinitionError(f"{where}: {name} has no options")
    return options


def parse(path: pathlib.Path) -> Concern:
    text = path.read_text()
    prologue, body = _split_prologue(text)
    body, epilogue = _split_epilogue(body)
    options = {m.group("name"): _options(m.group("name"), m.group("fields"), path.name)
               for m in _OPTIONS.finditer(body)}
    functions = []
    callbacks = []
    for m in _CALLBACK.finditer(_strip_comments(body)):
        where = f"{path.name}: {m.group('name')}"
        params = m.group("params").strip()
        plist = [] if params in ("", "void") else [_param(p, where) for p in params.split(",")]
        callbacks.append(Function(m.group("name"), " ".join(m.group("result").split()), plist, path.stem))
    for m in _DECL.finditer(_strip_comments(body)):
        head = " ".join(m.group("head").split())
        name = re.search(r"(\w+)$", head).group(1)
        result = head[: -len(name)].strip()
        where = f"{path.name}: {name}"
        params = m.group("params").strip()
        plist = [] if params in ("", "void") else [_param(p, where) for p in params.split(",")]
        functions.append(Function(name, result, plist, path.stem))
    return Concern(path.stem, prologue, body, epilogue, functions, options, callbacks)


def load(capi_dir: pathlib.Path) -> list:
    """Every concern, the runtime first (the others include it), then by name."""
    paths = sorted(pathlib.Path(capi_dir).glob("*.capi"), key=lambda p: (p.stem != "runtime", p.stem))
    concerns = [parse(p) for p in paths]
    seen = {}
    for c in concerns:
        for f in c.functions:
            if f.name in seen:
                raise DefinitionError(f"{f.name} is defined twice ({seen[f.name]}.capi and {c.name}.capi)")
            seen[f.name] = c.name
    return concerns


@dataclasses.dataclass
class Types:
    handles: set       # type(c_ptr)
    callbacks: set     # type(c_funptr)
    options: dict      # structure name -> [Option]
    enums: dict        # enumeration type name -> [(enumerator, value)]: integer(c_int)


def enumerations(body: str, where: str) -> dict:
    """``typedef enum [tag] { A = 1, B = -2 } name;`` of a concern: each enumerator with its value
    written out (the Fortran module declares them as integer(c_int) parameters)."""
    found = {}
    for m in _ENUM.finditer(_strip_comments(body)):
        items = []
        for item in m.group("body").split(","):
            if not item.strip():
                continue
            em = re.fullmatch(r"\s*(\w+)\s*=\s*(-?\d+)\s*", item)
            if not em:
                raise DefinitionError(f"{where}: {m.group('name')}: write each enumerator as NAME = integer, "
                                      f"not '{item.strip()}'")
            items.append((em.group(1), int(em.group(2))))
        found[m.group("name")] = items
    return found


def types(concerns) -> Types:
    """The types declared in the definitions (typedefs and FTC_OPTIONS)."""
    found = Types(set(), set(), {}, {})
    for c in concerns:
        found.enums.update(enumerations(c.body, f"{c.name}.capi"))
        body = _strip_comments(c.body)
        found.handles |= set(re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", body))
        found.handles |= set(re.findall(r"typedef\s+void\s*\*\s*(\w+)\s*;", body))
        found.callbacks |= set(re.findall(r"typedef\s+[\w\s*]+\(\s*\*\s*(\w+)\s*\)", body))
        found.options.update(c.options)
    return found


# ------------------------------------------------------------------------------------- C headers

def _c_options(m) -> str:
    name = m.group("name")
    options = _options(name, m.group("fields"), name)
    lines = [f"typedef struct {name} {{"]
    for o in options:
        doc = f"default {o.default}" + (f": {o.doc}" if o.doc else "")
        lines.append(f"  {o.ctype} {o.name}; /* {doc} */")
    defaults = ", ".join(o.default for o in options)
    lines += [f"}} {name};", f"#define {name.upper()}_DEFAULTS {{{defaults}}}"]
    return "\n".join(lines)


def header(concern: Concern) -> str:
    body = _OPTIONS.sub(_c_options, concern.body)
    guard = f"FTORCH_C_{concern.name.upper()}_H"
    return (f"{concern.prologue.rstrip()}\n"
            f"/* Generated from src/capi/{concern.name}.capi by src/capi/generate.py: edit that file. */\n"
            f"#ifndef {guard}\n#define {guard}\n\n"
            "#include <stdint.h>\n"
            "#ifndef FTC_API\n#if defined(__GNUC__)\n#define FTC_API __attribute__((visibility(\"default\")))\n"
            "#else\n#define FTC_API\n#endif\n#endif\n"
            "#ifndef FTC_NULLABLE\n#define FTC_NULLABLE /* the pointer may be null */\n#endif\n\n"
            "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
            f"{body.rstrip()}\n\n"
            "#ifdef __cplusplus\n}\n#endif\n"
            + (f"\n{concern.epilogue}\n" if concern.epilogue else "")
            + "#endif\n")


def umbrella(concerns) -> str:
    includes = "".join(f'#include "{c.header}"\n' for c in concerns if not c.foreign)
    return ("/* ftorch_c.h - the C API of FTorch: umbrella header, includes one header per concern.\n"
            " * Generated by src/capi/generate.py from the definitions in src/capi. */\n"
            f"#ifndef FTORCH_C_H\n#define FTORCH_C_H\n\n{includes}\n#endif\n")


# ------------------------------------------------------------------------------------- Fortran

def _fortran_type(base: str, found: Types, where: str) -> str:
    if base in found.handles or base == "void":
        return "type(c_ptr)"
    if base in found.callbacks:
        return "type(c_funptr)"
    if base in found.options:
        return f"type({base})"
    if base in found.enums:
        return "integer(c_int)"
    if base in _NUMERIC:
        return _NUMERIC[base]
    raise DefinitionError(f"{where}: no Fortran type for the C type '{base}' (declare handles and callbacks "
                          "with a typedef in a .capi file, options with FTC_OPTIONS)")


def fortran_declaration(p: Param, found: Types, where: str, callback: bool = False) -> tuple[str, str]:
    """(type and attributes, the name as declared) of one dummy argument; `callback`: of a callback
    type, which the Fortran side implements (a `char *` is a buffer it writes through a pointer; a
    value it returns through a pointer is preset by the caller: intent(inout))."""
    if p.nullable or (p.base == "void" and p.pointers == 1 and not p.array):
        return "type(c_ptr), value", p.name
    if callback and p.base == "char" and p.pointers == 1 and not p.const:
        return "type(c_ptr), value", p.name
    if p.pointers >= 2:
        # the address of a pointer the function sets (const qualifies what that pointer points to)
        return "type(c_ptr), intent(inout)", p.name
    if p.pointers == 1 and (p.base in found.handles or p.base == "void"):
        # the address of a handle (or data pointer) the function reads (const) or may replace
        return "type(c_ptr), " + ("intent(in)" if p.const else "intent(inout)"), p.name
    ftype = _fortran_type(p.base, found, where)
    if p.array or (p.base == "char" and p.pointers == 1):
        if p.pointers and p.base != "char":
            raise DefinitionError(f"{where}: '{p.c()}' is both an array and a pointer")
        intent = "intent(in)" if p.const else ("intent(out)" if p.base == "char" else "intent(inout)")
        return f"{ftype}, {intent}", p.name + "(*)"
    if p.pointers == 1:
        if p.base in found.options or callback:  # options the function reads (or fills); a preset value
            return f"{ftype}, " + ("intent(in)" if p.const else "intent(inout)"), p.name
        return f"{ftype}, " + ("intent(in)" if p.const else "intent(out)"), p.name
    return f"{ftype}, value", p.name


def _result_type(f: Function, found: Types) -> str | None:
    r = " ".join(f.result.replace("*", " * ").split())
    if r == "void":
        return None
    if r.endswith("*") or r in found.handles:
        return "type(c_ptr)"
    if r in found.options:
        raise DefinitionError(f"{f.concern}.capi: {f.name}: a structure is not returned by value")
    return _fortran_type(r, found, f.name)


def _wrap(line: str, indent: str) -> list:
    out = []
    while len(line) > _LINE:
        cut = line.rfind(", ", 0, _LINE - 2)
        if cut <= len(indent):
            cut = line.rfind(" ", 0, _LINE - 2)
        out.append(line[: cut + 1].rstrip() + " &")
        line = indent + "    " + line[cut + 1:].lstrip()
    return out + [line]


def fortran_interface(f: Function, found: Types, callback: bool = False) -> list:
    """The bind(c) interface of an entry point, or (callback) the abstract interface of a callback
    type, named as the typedef, which the Fortran procedures passed for it must match."""
    where = f"{f.concern}.capi: {f.name}"
    names = [p.name for p in f.params]
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered) or "ftc_result" in lowered or fortran_name(f).lower() in lowered:
        raise DefinitionError(f"{where}: parameter names must differ in Fortran (which ignores case)")
    result = _result_type(f, found)
    kind = "function" if result else "subroutine"
    name = f.name if callback else fortran_name(f)
    head = f"    {kind} {name}({', '.join(names)})" + (" result(ftc_result)" if result else "")
    lines = _wrap(head + (" bind(c)" if callback else f' bind(c, name="{f.name}")'), "    ")
    decls = []
    for p in f.params:
        spec, declared = fortran_declaration(p, found, where, callback)
        decls.append(f"      {spec} :: {declared}")
    if result:
        decls.append(f"      {result} :: ftc_result")
    imported = set(_FORTRAN_NAMES) | set(found.options)
    used = {n for d in decls for n in imported if re.search(rf"\b{n}\b", d)}
    if used:
        lines += _wrap("      import :: " + ", ".join(sorted(used)), "      ")
    lines += decls
    lines.append(f"    end {kind} {name}")
    return lines


def _fortran_constant(default: str, ctype: str) -> str:
    kind = _KIND[ctype]
    parts = []
    for part in default.split("/"):
        part = part.strip()
        if ctype in ("double", "float") and not re.search(r"[.eE]", part):
            part += ".0"
        parts.append(f"{part}_{kind}")
    return " / ".join(parts)


def fortran_options(name: str, options: list) -> list:
    lines = [f"  !> {name}: see its C header (defaults as there)", f"  type, bind(c) :: {name}"]
    for o in options:
        ftype = _NUMERIC[o.ctype]
        lines.append(f"    {ftype} :: {o.name} = {_fortran_constant(o.default, o.ctype)}")
    lines.append(f"  end type {name}")
    return lines


def fortran_module(concerns) -> str:
    found = types(concerns)
    names = [fortran_name(f) for c in concerns for f in c.functions]
    lines = ["! ftorch_c_api.f90 -- generated by src/capi/generate.py from the .capi files of src/capi: edit those.",
             "! The C interface of FTorch as Fortran sees it: one bind(c) interface per entry point of the C",
             "! headers, for the other modules of FTorch (which declare no C function themselves).",
             "module ftorch_c_api",
             "  use, intrinsic :: iso_c_binding, only: " + ", ".join(_FORTRAN_NAMES),
             "  implicit none",
             "  private",
             ""]
    enumerators = [e for items in found.enums.values() for e in items]
    callbacks = [f for c in concerns for f in c.callbacks]
    lines += _wrap("  public :: " + ", ".join(list(found.options) + [e for e, _ in enumerators] + names +
                                               [f.name for f in callbacks]), "  ")
    for name, items in found.enums.items():
        lines += ["", f"  ! {name}"]
        lines += [f"  integer(c_int), parameter :: {e} = {v}" for e, v in items]
    for name, options in found.options.items():
        lines += [""] + fortran_options(name, options)
    if callbacks:
        # A procedure passed for a callback is checked against its type where it is passed: through
        # a procedure pointer with this interface (`procedure(ftc_pack_fn), pointer :: p => proc`).
        lines += ["", "  abstract interface"]
        for f in callbacks:
            lines.append(f"    ! {f.concern}.capi: {f.name}")
            lines += fortran_interface(f, found, callback=True)
        lines += ["  end interface"]
    lines += ["", "  interface"]
    for c in concerns:
        lines.append(f"    ! {c.header}")
        for f in c.functions:
            lines += fortran_interface(f, found)
    lines += ["  end interface", "", "end module ftorch_c_api", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- files

def _write(path: pathlib.Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(capi_dir, header_dir, fortran_file) -> list:
    concerns = load(pathlib.Path(capi_dir))
    header_dir = pathlib.Path(header_dir)
    header_dir.mkdir(parents=True, exist_ok=True)
    for c in concerns:
        _write(header_dir / c.header, header(c))
    _write(header_dir / "ftorch_c.h", umbrella(concerns))
    fortran_file = pathlib.Path(fortran_file)
    fortran_file.parent.mkdir(parents=True, exist_ok=True)
    _write(fortran_file, fortran_module(concerns))
    return concerns


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: generate.py CAPI_DIR HEADER_DIR FORTRAN_FILE")
    try:
        generate(*sys.argv[1:])
    except DefinitionError as e:
        sys.exit(f"src/capi/generate.py: {e}")
