"""The documentation: the site (user guide + API reference) that tools/build_docs.py builds with
FORD, the links of the README and of the guide, and the Fortran snippets of both.

The site: tools/build_docs.py runs FORD on the sources (fypp templates preprocessed) with the
guide (docs/guide/*.md) as FORD's pages. Its check fails on any undocumented public entity or
argument and on any broken link of the guide's pages. Those tests need only Python with fypp and
FORD (no build of FTorch, no compiler): skipped where FORD is not installed, except in CI, where
tools/quickstart.sh installs it.

Snippets: every ```fortran block of README.md and docs/guide/*.md is compiled against the
installed FTorch (the modules and library that the gfortran build of tests/projects/cmake makes,
linked with `python -m ftorch --link-flags`), so the documentation cannot drift from the API.
Conventions, for whoever writes documentation:

* A block whose first statement is `program` is compiled as it stands; one that starts with
  `module` too (it is linked when it also holds a program). A block that starts with `subroutine`
  or `function` (with or without prefixes) is wrapped into a module, and any other block, an
  executable fragment, into a program:

      module doc_snippet_hidden        module doc_snippet_procedures
        use ftorch                       use ftorch
        <hidden use lines>               <hidden use lines>
        implicit none                    implicit none
      contains                           <hidden declarations>
        <hidden procedures>            contains
      end module                         <the block>
      program doc_snippet                <hidden procedures>
        use ftorch                     end module
        <hidden use lines>
        use doc_snippet_hidden
        <use lines of the block>
        implicit none
        <hidden declarations>
        <the block>
      end program

  (module doc_snippet_hidden only where there are hidden procedures: module procedures, since
  callbacks such as hooks must not be internal procedures).

* The hidden lines come from a directive, an HTML comment (GitHub and the site do not show it)
  that ends on the line right before the block's opening fence:

      <!-- doc-test: run
      use, intrinsic :: iso_fortran_env, only: real64
      real(real64), target :: x(3)
      contains
      subroutine simulate(x) ...
      -->

  Its first line holds the options; the following lines, up to `-->`, are the hidden Fortran
  lines (`use` lines first, then declarations; the lines after a line `contains` are procedures).
  A one-line directive `<!-- doc-test: run -->` has options only.
* Options: `run`: the program is also run, and must exit with status 0. The runnable blocks of a
  page run in the order of the page, in one working directory per page, so that one can use a
  file an earlier one wrote. A ```python block marked `run` is run there too (with this Python:
  e.g. to write the TorchScript model the next Fortran block loads); `file=NAME` writes a block
  (of any language) into NAME in that directory (e.g. the Python module a Fortran program calls).
  A ```text block marked `output`, the next block after a runnable Fortran block, is what that
  program must print, compared word by word (so the page shows what the program prints).
* Blocks using module `ftorch_mpi` are compiled with mpif90, against the module built from
  `python -m ftorch --fortran-mpi-source`.
* Unmarked ```python blocks must be valid Python; other languages are not checked.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import IN_CI, helper, require_compiler, run

REPO = Path(__file__).resolve().parent.parent
BUILD_DOCS = REPO / "tools" / "build_docs.py"
GUIDE = REPO / "docs" / "guide"
DOCUMENTS = [REPO / "README.md", *sorted(GUIDE.glob("*.md"))]

HAVE_FORD = importlib.util.find_spec("ford") is not None


def require_ford() -> None:
    if not HAVE_FORD:
        if IN_CI:
            pytest.fail("FORD is required in CI (tools/quickstart.sh installs it)", pytrace=False)
        pytest.skip("FORD is not installed (pip install ford)")


def build_docs(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BUILD_DOCS, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          errors="replace", timeout=600)


# ---------------------------------------------------------------------------------------------
# The site


def test_api_reference_is_complete(tmp_path):
    require_ford()
    out = tmp_path / "api"
    proc = build_docs("--check", "--output", out)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert "check passed" in proc.stdout
    assert (out / "index.html").is_file()
    # Pages of key procedures (generic interfaces have pages of their own), with the argument
    # descriptions of their specific procedures.
    from_array = (out / "interface" / "torch_tensor_from_array.html").read_text()
    assert "permute_dims" in from_array and "outlives the tensor" in from_array
    forward = (out / "interface" / "torch_model_forward.html").read_text()
    assert "output_tensors" in forward and "one per tensor forward returns" in forward
    assert (out / "proc" / "torch_model_load.html").is_file()
    # Every module has its page, ftorch_mpi (which uses the user's MPI) included.
    for module in ["ftorch", "ftorch_tensor_type", "ftorch_model", "ftorch_optim", "ftorch_mpi", "torch_ftn",
                   "ftorch_test_utils"]:
        assert (out / "module" / f"{module}.html").is_file(), module


def test_site_holds_the_guide(tmp_path):
    """The guide's pages are FORD pages of the same site, in the order of the guide's index, with
    links to each other and to the files of the repository (copied into the site) that work."""
    require_ford()
    out = tmp_path / "site"
    proc = build_docs("--output", out)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert "broken link" not in proc.stdout, proc.stdout
    pages = {path.stem for path in GUIDE.glob("*.md")}
    assert {path.stem for path in (out / "page").glob("*.html")} == pages
    index = (out / "page" / "index.html").read_text()
    # The sidebar lists the pages in the order of the index's links.
    order = [Path(t).stem for t in re.findall(r"\]\(([\w-]+)\.md\)", (GUIDE / "index.md").read_text())]
    sidebar = index[index.index('id="sidebar-toc"'):]
    positions = [sidebar.index(f'href="{name}.html"') for name in dict.fromkeys(order)]
    assert positions == sorted(positions)
    # The front page of the site leads to the guide; example sources are in the site.
    assert 'href="page/index.html"' in (out / "index.html").read_text()
    assert (out / "repo" / "examples" / "06_online_training" / "online_training.f90").is_file()
    # The title is FORD's, not repeated from the Markdown heading.
    tensors = (out / "page" / "tensors.html").read_text()
    assert tensors.count("<h1>") == 1


def test_check_fails_on_broken_links(tmp_path):
    """A copy of the guide with a link to a missing page, a missing example, a missing anchor and
    a page the index does not link to: --check names each and fails."""
    require_ford()
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in ("docs", ".git", ".venv", "build"):
            (root / entry.name).symlink_to(entry)
    guide = root / "docs" / "guide"
    shutil.copytree(GUIDE, guide)
    with (guide / "tensors.md").open("a") as page:
        page.write("\nSee [a missing page](missing.md), [a missing example](../../examples/nope.f90), "
                   "[a missing section](models.md#no-such-section) and [a directory](../../examples/01_tensors).\n")
    (guide / "orphan.md").write_text("---\ntitle: Orphan\n---\n\n# Orphan\n\nNot linked from the index.\n")
    proc = build_docs("--check", "--guide", guide, "--output", tmp_path / "site")
    assert proc.returncode == 1, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    broken = [line for line in proc.stdout.splitlines() if line.startswith("broken link:")]
    for expected in ["link to a missing page: missing.md", "link to a missing file: ../../examples/nope.f90",
                     "models.html#no-such-section (no element with id 'no-such-section')",
                     "link to a directory (link a file): ../../examples/01_tensors",
                     "does not link to orphan.md"]:
        assert any(expected in line for line in broken), (expected, broken)
    assert "check failed" in proc.stderr


def test_check_fails_on_undocumented_public_entity(tmp_path):
    require_ford()
    src = tmp_path / "fortran"
    shutil.copytree(REPO / "src" / "fortran", src)
    runtime = src / "ftorch_runtime.fypp"
    text = runtime.read_text()
    assert "implicit none\n" in text and "end module ftorch_runtime" in text
    # A public subroutine without any comment, and a private one (private helpers need none).
    text = text.replace("implicit none\n", "implicit none\n  public :: ftorch_probe_undocumented\n", 1)
    text = text.replace("end module ftorch_runtime",
                        "  subroutine ftorch_probe_undocumented(n)\n"
                        "    integer, intent(in) :: n\n"
                        "  end subroutine ftorch_probe_undocumented\n\n"
                        "  subroutine ftorch_probe_private(m)\n"
                        "    integer, intent(in) :: m\n"
                        "  end subroutine ftorch_probe_private\n"
                        "end module ftorch_runtime")
    runtime.write_text(text)
    proc = build_docs("--check", "--src", src, "--output", tmp_path / "api")
    assert proc.returncode == 1, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    reported = [line for line in proc.stdout.splitlines() if line.startswith("undocumented public entity:")]
    # The subroutine and its argument, named with their module and the file to edit.
    assert "undocumented public entity: ftorch_runtime::ftorch_probe_undocumented [ftorch_runtime.fypp]" in reported
    assert "undocumented public entity: ftorch_runtime::ftorch_probe_undocumented(n) [ftorch_runtime.fypp]" in reported
    assert not [line for line in reported if "ftorch_runtime::" in line and "probe_undocumented" not in line]
    assert "check failed" in proc.stderr
    assert "ftorch_probe_private" not in proc.stdout


# ---------------------------------------------------------------------------------------------
# Links and commands of the Markdown files, as GitHub shows them (no FORD needed)


def markdown_links(text: str) -> list[str]:
    sys.path.insert(0, str(BUILD_DOCS.parent))
    try:
        import build_docs as bd
    finally:
        sys.path.pop(0)
    return bd.markdown_links(text)


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (the site's are checked by
    tools/build_docs.py: a fragment must work in both)."""
    anchors: set[str] = set()
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # link text only
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_markdown_links_resolve(document):
    """Relative links of README.md and the guide name files of the checkout, and their fragments
    headings of the Markdown file they name (links into the API reference, ../api/..., name pages
    that tools/build_docs.py generates: its check covers them)."""
    bad = []
    for target in markdown_links(document.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("//"):
            continue
        path, _, fragment = target.partition("#")
        if document.parent == GUIDE and path.startswith("../api/"):
            continue
        named = document.parent / path if path else document
        if not named.exists():
            bad.append(target)
        elif fragment and named.suffix == ".md" and fragment not in github_anchors(named.read_text()):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"{document.name}: broken links: {bad}"


def test_readme_states_the_ci_test_command():
    """.ci/run runs the quick start, then the README's test command: the README must say both."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in ci if line.strip() and not line.lstrip().startswith("#")]
    tests = [c for c in commands if "pytest" in c]
    assert tests and "bash tools/quickstart.sh" in commands
    readme = (REPO / "README.md").read_text()
    for command in [*tests, "bash tools/quickstart.sh"]:
        assert command in readme, command
    assert len(readme.splitlines()) <= 260, "the README stays short: move details into docs/guide"


def test_guide_index_links_every_page():
    index = (GUIDE / "index.md").read_text()
    for page in GUIDE.glob("*.md"):
        if page.name != "index.md":
            assert f"({page.name})" in index or f"({page.name}#" in index, page.name
    readme = (REPO / "README.md").read_text()
    assert "(docs/guide/index.md)" in readme


# ---------------------------------------------------------------------------------------------
# Snippets


@dataclass
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    options: list[str] = field(default_factory=list)
    hidden: str = ""

    @property
    def id(self) -> str:
        return f"{self.document.relative_to(REPO).as_posix()}:{self.line}"

    def option(self, name: str) -> str | None:
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value or name
        return None


FENCE_OPEN = re.compile(r"^```(\w*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*doc-test:(.*)$")


def blocks_of(document: Path) -> list[Block]:
    lines = document.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        block = Block(document, i + 1, m.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n")
        # A directive ending on the line before the fence.
        if i > 0 and lines[i - 1].rstrip().endswith("-->"):
            start = next((k for k in range(i - 1, -1, -1) if lines[k].startswith("<!--")), None)
            if start is not None and (d := DIRECTIVE.match(lines[start])):
                first = d.group(1)
                body = lines[start + 1:i]
                if start == i - 1:  # one line
                    first, body = first.rsplit("-->", 1)[0], []
                else:
                    body[-1] = body[-1].rsplit("-->", 1)[0]
                block.options = first.split()
                block.hidden = "\n".join(body).strip("\n")
        found.append(block)
        i = end + 1
    return found


BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]
FORTRAN = [block for block in BLOCKS if block.language == "fortran"]
PROCEDURE_START = re.compile(
    r"^((pure|impure|elemental|recursive|module)\s+)*"
    r"((type|class)\s*\([^)]*\)|real(\s*\([^)]*\))?|integer(\s*\([^)]*\))?|logical(\s*\([^)]*\))?)?\s*"
    r"(subroutine|function)\b", re.IGNORECASE)


def first_statement(code: str) -> str:
    for line in code.splitlines():
        if line.strip() and not line.strip().startswith("!"):
            return line.strip().lower()
    return ""


def is_use(line: str) -> bool:
    return bool(re.match(r"^\s*use\b", line, re.IGNORECASE))


def fortran_source(block: Block) -> tuple[str, bool]:
    """The source file of a Fortran block, and whether it holds a main program."""
    hidden = block.hidden.splitlines()
    cut = next((i for i, line in enumerate(hidden) if line.strip().lower() == "contains"), len(hidden))
    hidden_spec, hidden_procs = hidden[:cut], hidden[cut + 1:]
    hidden_uses = [line for line in hidden_spec if is_use(line)]
    hidden_decls = [line for line in hidden_spec if not is_use(line)]
    first = first_statement(block.code)
    has_program = bool(re.search(r"^\s*program\s+\w+", block.code, re.IGNORECASE | re.MULTILINE))
    if first.startswith("program") or (first.startswith("module") and not first.startswith("module procedure")):
        assert not block.hidden, f"{block.id}: a whole program or module takes no hidden lines"
        return block.code, has_program
    if PROCEDURE_START.match(first):
        lines = ["module doc_snippet_procedures", "  use ftorch", *hidden_uses, "  implicit none",
                 *hidden_decls, "contains", block.code, *hidden_procs, "end module doc_snippet_procedures"]
        return "\n".join(lines) + "\n", False
    code = block.code.splitlines()
    uses = [line for line in code if is_use(line)]
    body = [line for line in code if not is_use(line)]
    lines = []
    if hidden_procs:  # in a module of their own: callbacks must be module procedures
        lines += ["module doc_snippet_hidden", "  use ftorch", *hidden_uses, "  implicit none", "contains",
                  *hidden_procs, "end module doc_snippet_hidden"]
        hidden_uses = [*hidden_uses, "  use doc_snippet_hidden"]
    lines += ["program doc_snippet", "  use ftorch", *hidden_uses, *uses, "  implicit none", *hidden_decls, *body,
              "end program doc_snippet"]
    return "\n".join(lines) + "\n", True


@pytest.fixture(scope="module")
def fortran_env(cmake_consumer):
    """Compiler command pieces for snippets: module directory, library, link flags."""
    fc = require_compiler("gfortran")
    bdir = cmake_consumer("gfortran")
    library = bdir / "libftorch_fortran.a"
    assert (bdir / "ftorch_modules" / "ftorch.mod").is_file() and library.is_file()
    return {"fc": fc, "modules": bdir / "ftorch_modules", "library": library,
            "link": shlex.split(helper("--link-flags"))}


_mpi_module: dict[str, Path] = {}


def mpi_module(env, tmp_path_factory) -> Path:
    """ftorch_mpi built with mpif90 against the installed modules: its .o and .mod directory."""
    if "dir" not in _mpi_module:
        if shutil.which("mpif90") is None:
            if IN_CI:
                pytest.fail("mpif90 is required in CI")
            pytest.skip("mpif90 not installed")
        out = tmp_path_factory.mktemp("ftorch-mpi")
        run(["mpif90", "-c", helper("--fortran-mpi-source"), f"-I{env['modules']}", "-J", out,
             "-o", out / "ftorch_mpi.o"])
        _mpi_module["dir"] = out
    return _mpi_module["dir"]


_workdirs: dict[Path, Path] = {}
_outputs: dict[Path, dict[int, str]] = {}  # document -> line of a run block -> its stdout


def workdir(document: Path, tmp_path_factory) -> Path:
    if document not in _workdirs:
        _workdirs[document] = tmp_path_factory.mktemp("doc-" + document.stem)
    return _workdirs[document]


def build(block: Block, env, tmp_path_factory) -> Path | None:
    """Compile a Fortran block (and link it, when it holds a program): the executable or None."""
    source, linkable = fortran_source(block)
    out = tmp_path_factory.mktemp("snippet")
    src = out / "snippet.f90"
    src.write_text(source)
    mpi = re.search(r"^\s*use\s+ftorch_mpi\b", source, re.IGNORECASE | re.MULTILINE) is not None
    fc = env["fc"]
    includes = [f"-I{env['modules']}"]
    objects: list[Path] = []
    if mpi:
        fc = "mpif90"
        mpi_dir = mpi_module(env, tmp_path_factory)
        includes.append(f"-I{mpi_dir}")
        objects.append(mpi_dir / "ftorch_mpi.o")
    cmd = [fc, "-ffree-line-length-none", *includes, "-J", out]
    numbered = "\n".join(f"{n:4d}  {line}" for n, line in enumerate(source.splitlines(), 1))
    if not linkable:
        proc = run([*cmd, "-c", src, "-o", out / "snippet.o"], check=False)
        assert proc.returncode == 0, f"{block.id} does not compile:\n{proc.stderr[-6000:]}\n--- source\n{numbered}"
        return None
    exe = out / "snippet"
    proc = run([*cmd, src, *objects, env["library"], *env["link"], "-o", exe], check=False)
    assert proc.returncode == 0, f"{block.id} does not compile:\n{proc.stderr[-6000:]}\n--- source\n{numbered}"
    return exe


def run_page_until(block: Block, env, tmp_path_factory) -> None:
    """Run the runnable and file blocks of the block's page before it (once per page), in order."""
    directory = workdir(block.document, tmp_path_factory)
    done = _outputs.setdefault(block.document, {})
    for earlier in blocks_of(block.document):
        if earlier.line >= block.line:
            break
        if earlier.line in done:
            continue
        if earlier.option("file"):
            (directory / earlier.option("file")).write_text(earlier.code)
        elif earlier.option("run") and earlier.language == "python":
            script = directory / f"block_{earlier.line}.py"
            script.write_text(earlier.code)
            proc = run([sys.executable, script], cwd=directory, check=False, timeout=600)
            assert proc.returncode == 0, f"{earlier.id} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        elif earlier.option("run") and earlier.language == "fortran":
            run_fortran(earlier, env, tmp_path_factory)
        done[earlier.line] = done.get(earlier.line, "")


def run_fortran(block: Block, env, tmp_path_factory) -> str:
    exe = build(block, env, tmp_path_factory)
    assert exe is not None, f"{block.id} is marked run but holds no program"
    directory = workdir(block.document, tmp_path_factory)
    proc = run([exe], cwd=directory, check=False, timeout=600)
    assert proc.returncode == 0, (f"{block.id} failed with status {proc.returncode}:\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    _outputs.setdefault(block.document, {})[block.line] = proc.stdout
    return proc.stdout


def test_snippets_are_found():
    """The conventions above find the guide's snippets (a parsing regression would skip them all)."""
    assert len(FORTRAN) >= 30
    assert any(block.option("run") for block in FORTRAN)
    for block in BLOCKS:
        for opt in block.options:
            assert opt.split("=")[0] in ("run", "file", "output"), f"{block.id}: unknown option {opt}"
        if block.option("output"):
            assert block.language == "text", f"{block.id}: output applies to ```text blocks"


@pytest.mark.parametrize("block", FORTRAN, ids=lambda b: b.id)
def test_fortran_snippet(block, fortran_env, tmp_path_factory):
    if block.option("run"):
        run_page_until(block, fortran_env, tmp_path_factory)
        stdout = run_fortran(block, fortran_env, tmp_path_factory)
        # A ```text block marked output, next after this block, is what it prints.
        page = blocks_of(block.document)
        following = [b for b in page if b.line > block.line]
        if following and following[0].option("output"):
            expected = following[0].code.split()
            assert stdout.split() == expected, (f"{block.id} prints\n{stdout}\nbut "
                                                f"{following[0].id} shows\n{following[0].code}")
    else:
        build(block, fortran_env, tmp_path_factory)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "python"], ids=lambda b: b.id)
def test_python_snippet_parses(block):
    ast.parse(block.code, filename=block.id)


def test_output_blocks_follow_runnable_blocks():
    for document in DOCUMENTS:
        page = blocks_of(document)
        for before, block in zip(page, page[1:]):
            if block.option("output"):
                assert before.language == "fortran" and before.option("run"), \
                    f"{block.id}: an output block follows a runnable Fortran block"
