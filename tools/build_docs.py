#!/usr/bin/env python3
"""Build FTorch's documentation site (the user guide and the API reference, HTML) with FORD, and
check that the public API is documented and that the site has no broken links.

    python tools/build_docs.py                  # HTML in docs/api/ (entry point docs/api/index.html)
    python tools/build_docs.py --output DIR     # HTML in DIR/ (FORD replaces the whole directory)
    python tools/build_docs.py --check          # exit 1 on documentation gaps or broken links
    python tools/build_docs.py --src DIR        # document the sources in DIR (default src/fortran)

The user guide (docs/guide/*.md) becomes FORD's "pages" (DIR/page/*.html, the guide's index.md is
DIR/page/index.html and the navigation bar's "User guide"). The Markdown files are written to be
read on GitHub as well, so FORD reads adapted copies (see ``prepare_guide``): links to other guide
pages (``tensors.md#anchor``) become links to their HTML (``tensors.html#anchor``), links to files
of the repository (``../../examples/01_tensors/tensors.f90``) point at copies of those files made
under DIR/repo/, links into the API reference (``../api/module/ftorch.html``, valid in a checkout
once the default build has run) point at the reference in DIR, the ``# Title`` heading repeating
the page's ``title:`` is dropped (FORD prints the title) and the guide's index lists its pages in the
order of its links (FORD's ``ordered_subpage``). After FORD has written the site, every relative
link (``href``, ``src``) of the guide's pages and of the site's front page must name a file that
exists, and a ``#fragment`` an element id of that page: the script reports each broken link, and
``--check`` fails on any.

The Fortran sources are partly fypp templates, so FORD reads preprocessed copies: every
SRC/*.fypp except the include-only files (ftorch_common, ftorch_enums, ftorch_handles) and
SRC/mpi/ftorch_mpi.fypp (its mpi_f08 form) is run through fypp with ``-I SRC``, as the build does,
and written next to copies of SRC/*.f90 in a temporary directory. FORD then reads that
directory with the settings of docs/ford.md. Comments follow the sources' convention: a ``!>``
block before an entity documents it, a trailing ``!<`` after a declaration (typically a dummy
argument's) documents that declaration.

The script reports (and with ``--check`` fails on) two kinds of gaps:

* undocumented entities of the public API: a module; a public procedure, generic or abstract
  interface, derived type, variable, parameter or enumerator; a public component or type-bound
  procedure of a public type; a dummy argument of any procedure a user can call (public
  procedures, the specific procedures of public generic interfaces and of public generic
  type-bound procedures such as ``assignment(=)``, the procedures bound to public type-bound
  procedures, abstract interfaces). FORD's own "Undocumented ..." warnings cannot decide this:
  FORD emits them while parsing, before ``public``/``private`` statements are applied, so they
  also name every private helper and C binding (thousands), which need no documentation. The
  script therefore walks the project FORD parsed and reports the public entities only, named
  ``module::procedure(argument) [source file]``;
* any other FORD warning, as these point at broken documentation, e.g. "Ignoring unknown Ford
  metadata key": a comment block whose first line reads ``Word: ...`` is taken as FORD metadata
  and silently dropped from the pages. Excepted are FORD's "Unknown entity ... with attribute
  'public'" warnings: FORD cannot follow a name that a module re-exports (``use a, only: x`` then
  ``public :: x``) or an enumerator made public by a ``public`` statement, a FORD limitation
  rather than a documentation problem (the check does see those enumerators).

The two FORD warning kinds not counted as problems are summarized; ``--verbose`` prints them.
FORD warnings about the guide's pages (a page without ``title:``, an unknown metadata key) count
as documentation problems.
"""

from __future__ import annotations

import argparse
import html.parser
import io
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
PROJECT_FILE = REPO / "docs" / "ford.md"
GUIDE = REPO / "docs" / "guide"
# Where the copies of repository files that the guide links to go, inside the output directory.
REPO_COPIES = "repo"
# fypp files that are only #:include'd by the others (see cmake/FTorchFortranSources.cmake).
INCLUDE_ONLY = {"ftorch_common.fypp", "ftorch_enums.fypp", "ftorch_handles.fypp", "ftorch_callback_kinds.fypp"}
# FORD warnings that are not documentation problems (see the module docstring).
BENIGN_WARNING = re.compile(r"Unknown entity '[^']*' with attribute 'public'")
UNDOCUMENTED_WARNING = re.compile(r"Undocumented \w+ '")


DEFAULT_ACCESS = re.compile(r"^[ \t]*(private|public)[ \t]*(!.*)?$", re.IGNORECASE)
IMPLICIT_NONE = re.compile(r"^[ \t]*implicit[ \t]+none\b", re.IGNORECASE)
MODULE_START = re.compile(r"^[ \t]*module[ \t]+(?!procedure\b)\w+[ \t]*(!.*)?$", re.IGNORECASE)
# Where a module's default-access statement can no longer be: `contains`, the module's end, or a
# derived type or interface block (whose own `private` is not the module's).
SCOPE_END = re.compile(r"^[ \t]*(contains\b|end[ \t]*module\b|type[ \t]*(,|::|[ \t]\w)|(abstract[ \t]+)?interface\b)",
                       re.IGNORECASE)


def hoist_default_access(path: Path) -> None:
    """Move a module's default-access statement (a bare ``private``/``public``) up to just after
    ``implicit none``. Fortran applies it to the whole module wherever it stands, but FORD applies it
    only to the entities declared after it, so that a parameter declared above ``private`` (such
    as ``dp`` in ftorch_loss) would be documented as public. Only the copy FORD reads is changed."""
    lines = path.read_text().splitlines(keepends=True)
    changed = False
    i = 0
    while i < len(lines):
        if MODULE_START.match(lines[i]):
            implicit = None
            for j in range(i + 1, len(lines)):
                if IMPLICIT_NONE.match(lines[j]) and implicit is None:
                    implicit = j
                elif SCOPE_END.match(lines[j]):
                    break  # past the module's own specification statements
                elif DEFAULT_ACCESS.match(lines[j]):
                    if implicit is not None and j > implicit + 1:
                        lines.insert(implicit + 1, lines.pop(j))
                        changed = True
                    break
        i += 1
    if changed:
        path.write_text("".join(lines))


def preprocess(src: Path, out: Path) -> dict[Path, str]:
    """Write the Fortran sources FORD reads into `out`: fypp output and copies of the .f90 files."""
    try:
        import fypp
    except ImportError:
        sys.exit("build_docs: fypp is not installed (pip install fypp)")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[Path, str] = {}  # file FORD reads -> its source, relative to `src`
    for f90 in sorted(src.glob("*.f90")) + sorted((src / "mpi").glob("*.f90")):
        if (out / f90.name).exists():
            sys.exit(f"build_docs: two sources named {f90.name} in {src}")
        shutil.copyfile(f90, out / f90.name)
        written[out / f90.name] = f90.relative_to(src).as_posix()
    for template in sorted(src.glob("*.fypp")) + sorted((src / "mpi").glob("*.fypp")):
        if template.name in INCLUDE_ONLY:
            continue
        target = out / (template.stem + ".f90")
        if target.exists():
            sys.exit(f"build_docs: both {template.name} and {target.name} exist in {src}")
        options = fypp.FyppOptions()
        options.includes = [str(src)]  # fypp -I SRC
        try:
            fypp.Fypp(options).process_file(str(template), str(target))
        except fypp.FyppError as err:
            sys.exit(f"build_docs: fypp failed on {template}:\n{err}")
        written[target] = template.relative_to(src).as_posix()
    if not written:
        sys.exit(f"build_docs: no Fortran sources in {src}")
    for path in written:
        hoist_default_access(path)
    return written


# An inline Markdown link or image: [text](target) or [text](target "title").
MD_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^\s*(```|~~~)")


def _outside_code(line: str, replace) -> str:
    """Apply `replace` to the parts of a Markdown line that are not inline code spans."""
    parts = re.split(r"(`+[^`]*`+)", line)
    return "".join(part if i % 2 else replace(part) for i, part in enumerate(parts))


def markdown_links(text: str) -> list[str]:
    """The targets of the inline links of a Markdown text, outside code blocks and spans."""
    targets: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            _outside_code(line, lambda part: targets.extend(m.group(2) for m in MD_LINK.finditer(part)) or part)
    return targets


def is_external(target: str) -> bool:
    return bool(urlsplit(target).scheme) or target.startswith("//")


def prepare_guide(guide: Path, dest: Path) -> tuple[set[Path], list[str]]:
    """Write the copies of the guide's pages that FORD reads into `dest` (see the module docstring).
    The guide is GUIDE_ROOT/docs/guide. Returns the files of GUIDE_ROOT that the guide links to
    (relative to it; to be copied into the site) and the problems found: links to missing files or
    to directories, pages without a title, pages the index does not link to."""
    guide = Path(os.path.abspath(guide))
    root = guide.parent.parent
    dest.mkdir(parents=True, exist_ok=True)
    pages = sorted(guide.glob("*.md"))
    names = {page.name for page in pages}
    copies: set[Path] = set()
    problems: list[str] = []
    if "index.md" not in names:
        return copies, [f"{guide}: no index.md"]

    def shown(page: Path) -> str:
        return page.relative_to(root).as_posix()

    def rewrite(page: Path, target: str) -> str:
        if is_external(target) or target.startswith("#"):
            return target
        parts = urlsplit(target)
        path, fragment = unquote(parts.path), (f"#{parts.fragment}" if parts.fragment else "")
        if path.startswith("../api/"):  # the API reference, built next to the guide
            return "../" + path[len("../api/"):] + fragment
        resolved = Path(os.path.normpath(page.parent / path))
        if resolved.parent == guide and resolved.suffix == ".md":
            if resolved.name not in names:
                problems.append(f"{shown(page)}: link to a missing page: {target}")
            return resolved.with_suffix(".html").name + fragment
        if root not in resolved.parents:
            problems.append(f"{shown(page)}: link outside the repository: {target}")
        elif not resolved.is_file():
            problems.append(f"{shown(page)}: link to "
                            f"{'a directory (link a file)' if resolved.is_dir() else 'a missing file'}: {target}")
        else:
            relative = resolved.relative_to(root)
            copies.add(relative)
            return f"../{REPO_COPIES}/{relative.as_posix()}{fragment}"
        return target

    order: list[str] = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        meta: list[str] = []
        if lines and lines[0].strip() == "---":  # front matter (YAML for GitHub, metadata for FORD)
            end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
            if end is None:
                problems.append(f"{shown(page)}: front matter not closed by ---")
                end = 0
            meta, lines = lines[1:end], lines[end + 1:]
        if not any(m.lower().startswith("title:") for m in meta):
            problems.append(f"{shown(page)}: no 'title:' in its front matter")
        body: list[str] = []
        in_fence = False
        dropped_title = False
        for line in lines:
            if FENCE.match(line):
                in_fence = not in_fence
            elif not in_fence:
                if not dropped_title and line.startswith("# "):
                    dropped_title = True  # FORD prints the title itself
                    continue
                line = _outside_code(line, lambda part: MD_LINK.sub(
                    lambda m: m.group(1) + rewrite(page, m.group(2)) + m.group(3), part))
            if line.strip() or body:
                body.append(line)
        if page.name == "index.md":
            for target in markdown_links("\n".join(lines)):
                name = urlsplit(target).path
                if not is_external(target) and name in names and name != "index.md" and name not in order:
                    order.append(name)
            meta += [f"ordered_subpage: {name}" for name in order]
        (dest / page.name).write_text("---\n" + "\n".join(meta) + "\n---\n\n" + "\n".join(body) + "\n",
                                      encoding="utf-8")
    for name in sorted(names - set(order) - {"index.md"}):
        problems.append(f"{shown(guide / 'index.md')} does not link to {name}")
    return copies, problems


class _Links(html.parser.HTMLParser):
    """The relative links (href, src) and the element ids of an HTML page."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            elif name in ("href", "src") and value and not is_external(value) \
                    and not value.startswith(("javascript:", "mailto:", "data:")):
                self.links.append(value)


def _parse_html(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def broken_links(output: Path) -> list[str]:
    """Relative links of the guide's pages (DIR/page/) and of the front page (DIR/index.html) that
    name no existing file, or a fragment that is no element id of the page it names."""
    checked = [output / "index.html", *sorted((output / "page").rglob("*.html"))]
    parsed: dict[Path, _Links] = {}

    def parse(path: Path) -> _Links:
        if path not in parsed:
            parsed[path] = _parse_html(path)
        return parsed[path]

    broken: list[str] = []
    for page in checked:
        if not page.is_file():
            broken.append(f"{page.relative_to(output)}: missing")
            continue
        for link in parse(page).links:
            parts = urlsplit(link)
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir() and (target / "index.html").is_file():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(output)}: {link} (no such file)")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parse(target).ids:
                broken.append(f"{page.relative_to(output)}: {link} (no element with id '{unquote(parts.fragment)}')")
    return broken


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_ford(srcdir: Path, output: Path, pages: Path | None = None):
    """Run FORD (in this process) on `srcdir` with the settings of docs/ford.md, writing HTML into
    `output`, with the Markdown pages of `pages` (None: those docs/ford.md names). Returns FORD's
    output (warnings included) and the project it parsed and correlated, or None where FORD
    failed."""
    import traceback

    import ford
    import ford.fortran_project
    from ford.console import console

    captured = {}
    base = ford.fortran_project.Project

    class CapturingProject(base):  # the project ford.main builds, kept for the check
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            captured["project"] = self

    log = io.StringIO()
    saved = (console.file, console.width)
    ford.fortran_project.Project = CapturingProject
    try:
        # FORD prints warnings through a rich console: into `log`, without wrapping long lines.
        console.file = log
        console.width = 100000
        with redirect_stdout(log), redirect_stderr(log):
            docs, settings = ford.load_settings(PROJECT_FILE.read_text(), PROJECT_FILE.parent, str(PROJECT_FILE))
            arguments = {"project_file": PROJECT_FILE, "src_dir": [srcdir], "output_dir": output}
            if pages is not None:
                arguments["page_dir"] = pages
            settings, docs = ford.parse_arguments(arguments, docs, settings, PROJECT_FILE.parent)
            ford.main(settings, docs)
    except SystemExit as stop:
        if stop.code not in (None, 0):
            captured.pop("project", None)
    except Exception:
        log.write(traceback.format_exc())
        captured.pop("project", None)
    finally:
        ford.fortran_project.Project = base
        console.file, console.width = saved
    return ANSI.sub("", log.getvalue()), captured.get("project")


def ford_warnings(log: str) -> list[str]:
    return [line.split("Warning:", 1)[1].strip() for line in log.splitlines() if "Warning:" in line]


def undocumented_public(project, sources: dict[str, str]) -> list[str]:
    """Qualified names (``module::procedure(argument)``) of the public API entities without
    documentation, each followed by the source file to edit (``sources`` maps the names of the
    preprocessed files to those of the originals)."""
    from ford.sourceform import FortranBoundProcedure, FortranModule, FortranProcedure

    missing: list[str] = []
    seen: set[int] = set()

    def documented(*entities) -> bool:
        return any(line.strip() for entity in entities for line in (getattr(entity, "doc_list", None) or []))

    def home(entity) -> tuple[str, str]:
        """The module that defines `entity`, and its source file."""
        owner = entity
        while owner is not None and not isinstance(owner, FortranModule):
            owner = getattr(owner, "parent", None)
        module = owner.name if owner is not None else "?"
        filename = Path(str(getattr(entity, "filename", "") or getattr(owner, "filename", ""))).name
        return f"{module}::", f" [{sources.get(filename, filename)}]"

    def need(entity, name: str, *alternatives) -> None:
        if not documented(entity, *alternatives):
            prefix, suffix = home(entity)
            missing.append(f"{prefix}{name}{suffix}")

    def args_of(proc) -> None:
        """Every dummy argument of a procedure a user can call must be documented."""
        if proc is None or isinstance(proc, str) or id(proc) in seen:
            return
        seen.add(id(proc))
        for arg in getattr(proc, "args", []):
            if not isinstance(arg, str):
                need(arg, f"{proc.name}({arg.name})")

    def interface(intr) -> None:
        if intr.generic:
            need(intr, intr.name)
            for modproc in intr.modprocs:
                args_of(modproc.procedure)
            for proc in intr.subroutines + intr.functions:
                args_of(proc)
        elif getattr(intr, "procedure", None) is not None:
            # An abstract interface, or an interface body: the comment may precede either the
            # interface block or the procedure inside it.
            need(intr.procedure, intr.procedure.name, intr)
            args_of(intr.procedure)

    for mod in sorted(project.modules, key=lambda m: m.name.lower()):
        need(mod, "(module)")
        public = set(getattr(mod, "public_list", []))

        def is_public(entity) -> bool:
            return getattr(entity, "permission", "public") in ("public", "protected") or (
                entity.name.lower() in public
            )

        # After correlate() FORD has pruned the module's lists to what it displays: the public
        # and protected entities (display: public, protected in docs/ford.md).
        for proc in mod.functions + mod.subroutines:
            if is_public(proc):
                need(proc, proc.name)
                args_of(proc)
        for intr in mod.interfaces + mod.absinterfaces:
            if is_public(intr if intr.name else intr.procedure):
                interface(intr)
        for var in mod.variables:
            if is_public(var):
                need(var, var.name)
        for enum in getattr(mod, "enums", []):
            enumerators = [var for var in enum.variables if is_public(var)]
            if enumerators:
                need(enum, f"enum of {enumerators[0].name}")
            for var in enumerators:
                need(var, var.name)
        for dtype in mod.types:
            if not is_public(dtype):
                continue
            need(dtype, dtype.name)
            for comp in dtype.variables:
                if getattr(comp, "permission", "public") != "private":
                    need(comp, f"{dtype.name}%{comp.name}")
            for bound in dtype.boundprocs:
                if getattr(bound, "permission", "public") == "private":
                    continue
                need(bound, f"{dtype.name}%{bound.name}")
                # A generic binding (`generic :: assignment(=) => share`) binds other type-bound
                # procedures, private ones included: their procedures are called through it.
                specifics = [b for b in bound.bindings if isinstance(b, FortranBoundProcedure)]
                for binding in [bound, *specifics]:
                    for target in binding.bindings:
                        if isinstance(target, FortranProcedure):
                            args_of(target)
                if bound.deferred and bound.proto is not None and not isinstance(bound.proto, str):
                    args_of(getattr(bound.proto, "procedure", bound.proto))
    return sorted(set(missing))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "api",
                        help="directory of the HTML pages (default docs/api; entry point DIR/index.html)")
    parser.add_argument("--src", type=Path, default=REPO / "src" / "fortran",
                        help="directory of the Fortran sources (default src/fortran)")
    parser.add_argument("--guide", type=Path, default=GUIDE,
                        help="directory of the user guide's Markdown pages (default docs/guide; it must be "
                             "ROOT/docs/guide, its links to ../../PATH naming files of ROOT)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a public entity or argument is undocumented, FORD warns about "
                             "the documentation, or a link of the guide or of the front page is broken")
    parser.add_argument("--verbose", action="store_true",
                        help="print all of FORD's warnings, also those about private entities (thousands) "
                             "and about names FORD cannot resolve")
    args = parser.parse_args(argv)

    try:
        import ford  # noqa: F401
    except ImportError:
        print("build_docs: FORD is not installed (pip install ford)", file=sys.stderr)
        return 2

    src = args.src.resolve()
    output = args.output.resolve()
    guide = Path(os.path.abspath(args.guide))
    if not src.is_dir():
        print(f"build_docs: no source directory {src}", file=sys.stderr)
        return 2
    if not (guide / "index.md").is_file():
        print(f"build_docs: no user guide in {guide} (index.md)", file=sys.stderr)
        return 2
    # FORD deletes the output directory before writing it: refuse anything but an empty or
    # missing directory, or an earlier FORD output.
    previous_output = (output / "index.html").is_file() and (output / "module").is_dir()
    if output.is_file() or (output.is_dir() and any(output.iterdir()) and not previous_output) \
            or output in (REPO, *REPO.parents) or src == output or output in src.parents:
        print(f"build_docs: {output} is not a documentation directory: FORD would delete it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ftorch-docs-") as tmp:
        srcdir = Path(tmp) / "src"
        sources = {path.name: name for path, name in preprocess(src, srcdir).items()}
        copies, link_problems = prepare_guide(guide, Path(tmp) / "guide")
        start = time.perf_counter()
        log, project = run_ford(srcdir, output, Path(tmp) / "guide")
        elapsed = time.perf_counter() - start
        if project is None or not (output / "index.html").is_file():
            print(log, file=sys.stderr)
            print("build_docs: FORD failed", file=sys.stderr)
            return 1
        warnings = ford_warnings(log)
        undocumented = [w for w in warnings if UNDOCUMENTED_WARNING.match(w)]
        benign = [w for w in warnings if BENIGN_WARNING.search(w) and not UNDOCUMENTED_WARNING.match(w)]
        others = [w for w in warnings if not (UNDOCUMENTED_WARNING.match(w) or BENIGN_WARNING.search(w))]
        for w in warnings if args.verbose else others:
            print(f"FORD warning: {w}")
        print(f"build_docs: FORD took {elapsed:.1f} s; {len(warnings)} warnings: {len(others)} about the "
              f"documentation (printed above), {len(undocumented)} about undocumented entities, private ones "
              f"included (those of the public API are listed below), {len(benign)} about names FORD cannot "
              f"resolve (re-exports, enumerators); --verbose prints them all")
        missing = undocumented_public(project, sources)

    # The repository files the guide links to (examples, benchmark results, ...), next to the pages.
    root = guide.parent.parent
    for relative in sorted(copies):
        (output / REPO_COPIES / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / relative, output / REPO_COPIES / relative)
    broken = link_problems + broken_links(output)
    guide_pages = len(list((output / "page").rglob("*.html")))
    print(f"build_docs: site written to {output / 'index.html'}: API reference, and the user guide "
          f"({guide_pages} pages, {output / 'page' / 'index.html'})")
    for name in missing:
        print(f"undocumented public entity: {name}")
    for link in broken:
        print(f"broken link: {link}")
    failed = bool(missing or others or broken)
    if failed:
        print(f"build_docs: {len(missing)} undocumented public entities, {len(others)} FORD warnings about "
              f"the documentation, {len(broken)} broken links", file=sys.stderr)
    if not args.check:
        return 0
    if failed:
        print("build_docs: check failed", file=sys.stderr)
        return 1
    print(f"build_docs: check passed: the public API is fully documented, and the guide's and the front "
          f"page's links all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
