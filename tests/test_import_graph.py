"""The package's import graph: no cycles, no import from a lower layer to a higher one, front ends that do not
import each other, and the one place that writes results and the one way front ends get their settings.

Every .py file under anima_rknn/ is parsed with `ast` (the package is never imported). `python
tests/test_import_graph.py` prints the layer of every module, the imports between layers and the layer diagram,
so docs/architecture.md's section "## Layers" and the README's "## How it is built" can be regenerated from here.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import networkx as nx  # a dependency of torch: installed wherever the package is
import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "anima_rknn"
# Where the layer diagram is shown, each page with the section that holds it: both are checked.
DIAGRAM_PAGES = {"docs/architecture.md": "## Layers", "README.md": "## How it is built"}

# The layers, lowest first: the one statement of the order. Each name is a top-level module or subpackage of
# anima_rknn. A module may import from the other members of its own layer and from any lower layer, never from a
# higher one (not even lazily in a function, nor under `if TYPE_CHECKING:`). A name with no module yet is fine;
# a top-level module or subpackage that is in no layer is not.
LAYERS: list[tuple[str, ...]] = [
    # 0 foundation: the error types and the checks of values from outside (ints, finite numbers in a range)
    ("errors", "checks"),
    # 1 core: atomic file publishing, names and folders, strict JSON, PNGs; tensor files; memory; the CPU speed probe
    ("core",),
    # 2 sampling: flow schedule, the Euler loop and its step events, the step caches, Spectrum
    ("sampling",),
    # 3 components: prompt weights, tokenizers and the text encoder; the VAE; the DiT, adapter, LoRA, model files
    ("text", "vae", "model"),
    # 4 export: ONNX export of the subgraphs and the VAE tile, RKNN conversion, the subgraph set's manifest
    ("export",),
    # 5 engine: split execution of the DiT on a backend (torch / onnx / rknn), the VAE's tiles on a backend
    ("engine",),
    # 6 generation: settings (params), encode -> denoise -> decode (pipeline), results and their publishing, resume
    ("generation",),
    # 7 jobs: generation jobs and their queue, shared by the server and batch
    ("jobs",),
    # 8 tools: cached-vs-baseline benchmarks and reports; the demo model's dataset, training and evaluation
    ("bench", "demo"),
    # 9 services: many jobs into one folder, locally or over Ray (batch); the HTTP APIs and the page (server)
    ("batch", "server"),
    # 10 cli: the command line, one module per command
    ("cli",),
]

# The word for a layer in the diagram, where it holds more than one name (else the name itself).
LAYER_LABELS = {0: "foundation", 3: "components", 8: "tools", 9: "services"}

# The package's entry points: above every layer (no layered module may import them), their own imports not
# layered, but part of the cycle check.
ENTRY_POINTS = ("__init__", "__main__")

# Modules of cli/ that define no command; every other module of cli/ is a command module, a front end.
CLI_SUPPORT = ("__init__", "group", "options", "signals", "commands", "sdcpp")
# The route modules of server/, front ends (whichever exist).
SERVER_ROUTES = ("a1111", "openai", "native", "page")
# Further front ends, whole: every module of these subpackages.
FRONT_END_PACKAGES = ("batch", "bench")

# What writes a result by hand: a PNG or the PNG's parameters text. Only generation/ calls these.
PUBLISH_CALLS = ("png_parameters", "save_png", "png_bytes")
PUBLISH_EXEMPT = {
    "anima_rknn/core/files.py": "defines save_png and png_bytes: the one PNG writer, which generation/ calls",
    "anima_rknn/vae/preview.py": "live previews are scratch pictures of a run in progress, not results",
    "anima_rknn/cli/eval_demo.py": "writes the demo evaluation's contact sheet, a picture of many results",
}
# What builds generation settings by hand; front ends derive them through anima_rknn/generation/params.py.
SETTINGS_CALLS = ("GenerationParams",)


# ---------------------------------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Module:
    name: str  # dotted: anima_rknn.core.files; a package is its __init__ (or a namespace folder, file None)
    file: Path | None
    display: str  # the path shown in messages: anima_rknn/core/files.py

    @property
    def folder(self) -> str:
        """anima_rknn/core/ for a package, else the file."""
        return self.display.removesuffix("__init__.py")


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    target: str | None  # the module it imports (None: no module of the package)
    written: str  # the module imported (target), or for one of no module what the import names
    display: str
    line: int
    type_checking: bool  # under `if TYPE_CHECKING:`: does not run
    lazy: bool  # inside a function

    @property
    def where(self) -> str:
        return f"{self.display}:{self.line}"

    @property
    def how(self) -> str:
        notes = [note for note, on in (("under TYPE_CHECKING", self.type_checking), ("in a function", self.lazy)) if on]
        return f" ({', '.join(notes)})" if notes else ""


@dataclass(frozen=True)
class Graph:
    package: str
    modules: dict[str, Module]
    imports: list[Import]  # the package's own imports only, in file and line order
    trees: dict[str, ast.Module]
    unparsable: list[str]  # files that are no Python: file:line: the error


def _module_name(package_dir: Path, file: Path) -> str:
    parts = [package_dir.name, *file.relative_to(package_dir).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def call_name(node: ast.Call) -> str | None:
    """`f(...)` and `x.f(...)` both call `f`."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


class _Imports(ast.NodeVisitor):
    """Every import of one module, with (absolute base, imported name or None for `import base`)."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.here = module.split(".") if is_package else module.split(".")[:-1]
        self.found: list[tuple[int, str | None, str | None, bool, bool]] = []  # line, base, name, tc, lazy
        self.type_checking = 0
        self.functions = 0

    def _add(self, line: int, base: str | None, name: str | None) -> None:
        self.found.append((line, base, name, self.type_checking > 0, self.functions > 0))

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            return self.generic_visit(node)
        self.visit(node.test)
        self.type_checking += 1
        for statement in node.body:
            self.visit(statement)
        self.type_checking -= 1
        for statement in node.orelse:
            self.visit(statement)

    def _function(self, node: ast.AST) -> None:
        self.functions += 1
        self.generic_visit(node)
        self.functions -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node.lineno, alias.name, None)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            up = len(self.here) - (node.level - 1)
            base = ".".join(self.here[:up] + ([node.module] if node.module else [])) if up > 0 else None
        else:
            base = node.module
        for alias in node.names:
            self._add(node.lineno, base, alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("anima_rknn.x"): an import, when its name is written out
        if (call_name(node) == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
            self._add(node.lineno, node.args[0].value, None)
        self.generic_visit(node)


def scan(package_dir: Path) -> Graph:
    """Parse every .py file of the package in package_dir (a folder named like the package)."""
    package = package_dir.name
    files = sorted(f for f in package_dir.rglob("*.py") if "__pycache__" not in f.parts)
    modules: dict[str, Module] = {}
    for file in files:  # every folder on the way to a .py file is a package, with an __init__ or not
        for folder in [file.parent, *file.parent.parents]:
            if folder == package_dir.parent:
                break
            name = _module_name(package_dir, folder / "__init__.py")
            modules.setdefault(name, Module(name, None, folder.relative_to(package_dir.parent).as_posix() + "/"))
    for file in files:
        name = _module_name(package_dir, file)
        modules[name] = Module(name, file, file.relative_to(package_dir.parent).as_posix())

    def resolve(base: str, name: str | None) -> str | None:
        if name is None:  # import a.b.c / import_module("a.b.c"): a.b.c must be a module
            return base if base in modules else None
        if name != "*" and f"{base}.{name}" in modules:  # from a.b import c, c a submodule
            return f"{base}.{name}"
        return base if base in modules else None  # from a.b import c, c a name in a.b

    imports: list[Import] = []
    trees: dict[str, ast.Module] = {}
    unparsable: list[str] = []
    seen: set[Import] = set()
    for module in sorted(modules.values(), key=lambda m: m.display):
        if module.file is None:
            continue
        try:
            tree = ast.parse(module.file.read_text(encoding="utf-8"), filename=str(module.file))
        except SyntaxError as e:
            unparsable.append(f"{module.display}:{e.lineno}: cannot be parsed: {e.msg}")
            continue
        trees[module.name] = tree
        visitor = _Imports(module.name, module.file.name == "__init__.py")
        visitor.visit(tree)
        for line, base, name, type_checking, lazy in visitor.found:
            if base is None:
                written, target = "a module above the package (a relative import too deep)", None
            elif base != package and not base.startswith(package + "."):
                continue  # not the package's own
            else:
                target = resolve(base, name)
                written = target or base
            found = Import(module.name, target, written, module.display, line, type_checking, lazy)
            if found not in seen:  # from x import a, b: one import of x
                seen.add(found)
                imports.append(found)
    return Graph(package, modules, imports, trees, unparsable)


# ---------------------------------------------------------------------------------------------------- the rules


def _top(module: str) -> str | None:
    """The top-level name under the package (core for anima_rknn.core.files); None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _is_entry_point(module: str) -> bool:
    return _top(module) in (None, *ENTRY_POINTS)


def _layer_index(layers: list[tuple[str, ...]]) -> dict[str, int]:
    return {name: i for i, names in enumerate(layers) for name in names}


def layer_label(i: int, layers: list[tuple[str, ...]] = LAYERS) -> str:
    return LAYER_LABELS.get(i, "+".join(layers[i])) if layers is LAYERS else "+".join(layers[i])


def placement_violations(graph: Graph, layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Every top-level module and subpackage is in exactly one layer; the layers name each member once."""
    problems = []
    index = _layer_index(layers)
    counts = Counter(name for names in layers for name in names)
    problems += [f"LAYERS: {name!r} is in {n} layers (a name belongs to one)" for name, n in counts.items() if n > 1]
    tops: dict[str, str] = {}
    for module in sorted(graph.modules.values(), key=lambda m: m.display):
        top = _top(module.name)
        if top is not None and top not in ENTRY_POINTS:
            tops.setdefault(top, graph.modules[f"{graph.package}.{top}"].folder)
    for top, display in tops.items():
        if top not in index:
            problems.append(f"{display}: {graph.package}.{top} is in no layer: place it in LAYERS "
                            f"(tests/test_import_graph.py) and in the diagram (docs/architecture.md, README.md)")
    return problems


def unresolved_imports(graph: Graph) -> list[str]:
    return [f"{i.where}: {i.importer} imports {i.written}, which is no module of {graph.package}{i.how}"
            for i in graph.imports if i.target is None]


def layer_violations(graph: Graph, layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Imports from a lower layer to a higher one, and imports of the entry points (which sit above every layer).

    TYPE_CHECKING-only and in-function imports count: a layering violation is one even when lazy."""
    index = _layer_index(layers)
    problems = []
    for i in graph.imports:
        if i.target is None or _is_entry_point(i.importer) or _top(i.importer) not in index:
            continue  # unresolved and unplaced ones are reported by their own rules
        low = index[_top(i.importer)]
        if _is_entry_point(i.target):
            problems.append(f"{i.where}: upward import: {i.importer} (layer {low} {layer_label(low, layers)}) "
                            f"imports {i.written}, the package's entry point, above every layer{i.how}")
            continue
        if _top(i.target) not in index:
            continue
        high = index[_top(i.target)]
        if high > low:
            problems.append(f"{i.where}: upward import: {i.importer} (layer {low} {layer_label(low, layers)}) "
                            f"imports {i.written} (layer {high} {layer_label(high, layers)}){i.how}")
    return problems


def cycle_violations(graph: Graph) -> list[str]:
    """Strongly connected components of the module graph. Imports under TYPE_CHECKING count: they do not run, but a
    circle hidden under them is still two modules that cannot be read, moved or tested apart."""
    edges: dict[tuple[str, str], list[Import]] = {}
    for i in graph.imports:
        if i.target is not None and i.target != i.importer:
            edges.setdefault((i.importer, i.target), []).append(i)
    directed = nx.DiGraph(list(edges))
    problems = []
    for component in sorted((sorted(c) for c in nx.strongly_connected_components(directed) if len(c) > 1)):
        members = set(component)
        cycle = nx.find_cycle(directed.subgraph(members), source=component[0])
        example = [a for a, _ in cycle] + [cycle[0][0]]
        lines = [f"import cycle among {len(component)} modules ({', '.join(component)}): "
                 f"{' -> '.join(example)}; its imports:"]
        for (a, b), found in sorted(edges.items()):
            if a in members and b in members:
                lines += [f"    {i.where}: {a} -> {b}{i.how}" for i in found]
        problems.append("\n".join(lines))
    return problems


def _front_end_unit(module: str) -> tuple[str, str] | None:
    """(kind, unit) when module is a cli command module or a server route module."""
    parts = module.split(".")
    if len(parts) < 3:
        return None
    if parts[1] == "cli" and parts[2] not in CLI_SUPPORT:
        return "command", parts[2]
    if parts[1] == "server" and parts[2] in SERVER_ROUTES:
        return "route", parts[2]
    return None


def front_end_violations(graph: Graph) -> list[str]:
    """A cli command module imports no other command module; a server route module no other route module; a
    front-end package (batch/, bench/) no other one (batch runs the task bench hands it)."""
    problems = []
    for i in graph.imports:
        here = _front_end_unit(i.importer)
        there = _front_end_unit(i.target) if i.target else None
        if here and there and here[0] == there[0] and here[1] != there[1]:
            shared = "cli/options.py or a lower layer" if here[0] == "command" else "server/runtime.py or a lower layer"
            problems.append(f"{i.where}: front end imports front end: {here[0]} module {i.importer} imports "
                            f"{i.written}, another {here[0]} module (shared code goes to {shared}){i.how}")
        elif i.target and _top(i.importer) in FRONT_END_PACKAGES and _top(i.target) in FRONT_END_PACKAGES \
                and _top(i.importer) != _top(i.target):
            problems.append(f"{i.where}: front end imports front end: {i.importer} imports {i.written}, of "
                            f"another front-end package (hand it what it runs instead){i.how}")
    return problems


def _is_front_end(module: str) -> bool:
    return _front_end_unit(module) is not None or _top(module) in FRONT_END_PACKAGES


def _calls(graph: Graph, module: str, names: tuple[str, ...]):
    for node in ast.walk(graph.trees[module]):
        if isinstance(node, ast.Call) and call_name(node) in names:
            yield node.lineno, call_name(node)


def publish_violations(graph: Graph, exempt: dict[str, str] = PUBLISH_EXEMPT) -> list[str]:
    """Outside generation/ (and the exemptions), no module writes a PNG or its parameters text by hand."""
    problems = []
    for module in sorted(graph.trees, key=lambda m: graph.modules[m].display):
        display = graph.modules[module].display
        if _top(module) == "generation" or display in exempt:
            continue
        problems += [f"{display}:{line}: publishing by hand: {module} calls {name}(); results are written by the "
                     f"publisher in {graph.package}/generation/" for line, name in _calls(graph, module, PUBLISH_CALLS)]
    return sorted(problems, key=_by_place)


def settings_violations(graph: Graph) -> list[str]:
    """No front end (cli command modules, server route modules, batch/, bench/) constructs GenerationParams."""
    problems = []
    for module in sorted(graph.trees, key=lambda m: graph.modules[m].display):
        if not _is_front_end(module):
            continue
        display = graph.modules[module].display
        problems += [f"{display}:{line}: settings by hand: front end {module} constructs {name}(); front ends "
                     f"derive settings through {graph.package}/generation/params.py"
                     for line, name in _calls(graph, module, SETTINGS_CALLS)]
    return sorted(problems, key=_by_place)


def _by_place(message: str) -> tuple[str, int]:
    path, line, _ = message.split(":", 2)
    return path, int(line)


# ------------------------------------------------------------------------------------------- the diagram's pages

DIAGRAM_HEADER = "layers (lowest first):"
DATA_FLOW = ("front end (cli, server, batch, bench) -> generation (params -> pipeline -> result) -> "
             "sampling (sampler + cache) -> engine -> backend (torch / onnx / rknn)")
_LAYER_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+(\S.*?)\s*$")


def diagram(layers: list[tuple[str, ...]] = LAYERS) -> str:
    """The pages' fenced block: one line per layer, then the data flow."""
    rows = [f"{i:>3} {layer_label(i, layers):<12} {', '.join(names)}" for i, names in enumerate(layers)]
    return "\n".join(["```", DIAGRAM_HEADER, *rows, "", DATA_FLOW, "```"])


def diagram_violations(text: str, layers: list[tuple[str, ...]] = LAYERS, page: str = "docs/architecture.md",
                       section: str = "## Layers") -> list[str]:
    """How the diagram in `section` of a page (its text) differs from `layers`, each as 'page:line: ...'."""
    lines = text.splitlines()
    start = next((n for n, line in enumerate(lines) if line.strip() == section), None)
    if start is None:
        return [f"{page}: no section {section!r}"]
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith("## ")), len(lines))
    fence = None
    for n in range(start + 1, end):
        if lines[n].startswith("```") and n + 1 < end and lines[n + 1].strip() == DIAGRAM_HEADER:
            fence = n
            break
    if fence is None:
        return [f"{page}:{start + 1}: the section {section!r} has no fenced block starting with the "
                f"line {DIAGRAM_HEADER!r} (python tests/test_import_graph.py prints it)"]
    found: list[tuple[int, tuple[str, ...], int]] = []  # layer number, names, line of the page
    problems = []
    for n in range(fence + 2, end):
        if not lines[n].strip() or lines[n].startswith("```"):
            break
        match = _LAYER_LINE.match(lines[n])
        if match is None:
            problems.append(f"{page}:{n + 1}: not a layer line ('<number> <label> <name>, <name>'): {lines[n]!r}")
            continue
        names = tuple(name.strip() for name in match.group(3).split(","))
        found.append((int(match.group(1)), names, n + 1))
    expected = list(enumerate(layers))
    for k in range(max(len(found), len(expected))):
        if k >= len(found):
            problems.append(f"{page}:{fence + 1}: the diagram lacks layer {k} ({', '.join(expected[k][1])})")
        elif k >= len(expected):
            problems.append(f"{page}:{found[k][2]}: the diagram has a layer {found[k][0]} "
                            f"({', '.join(found[k][1])}) that LAYERS does not")
        elif found[k][:2] != expected[k]:
            problems.append(f"{page}:{found[k][2]}: the diagram's layer {found[k][0]} ({', '.join(found[k][1])}) "
                            f"is not LAYERS' layer {k} ({', '.join(expected[k][1])})")
    return problems


def pages_diagram_violations() -> list[str]:
    """The diagram on every page that shows it (DIAGRAM_PAGES)."""
    return [problem for page, section in DIAGRAM_PAGES.items()
            for problem in diagram_violations((PACKAGE_DIR.parent / page).read_text(encoding="utf-8"),
                                              page=page, section=section)]


# ---------------------------------------------------------------------------------------------------- the tests


@cache
def package_graph() -> Graph:
    return scan(PACKAGE_DIR)


def _fail(problems: list[str], rule: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {rule}:\n" + "\n".join(problems), pytrace=False)


def test_every_module_parses():
    _fail(package_graph().unparsable, "files that are no Python (their imports are not checked)")


def test_every_module_is_in_one_layer():
    _fail(placement_violations(package_graph()), "modules or layer names out of place")


def test_every_import_of_the_package_is_of_a_module():
    _fail(unresolved_imports(package_graph()), "imports of no module")


def test_no_import_cycle():
    _fail(cycle_violations(package_graph()), "import cycles")


def test_no_import_from_a_lower_layer_to_a_higher_one():
    _fail(layer_violations(package_graph()), "upward imports")


def test_no_front_end_imports_another():
    _fail(front_end_violations(package_graph()), "front ends importing front ends")


def test_only_generation_publishes_results():
    graph = package_graph()
    stale = [f"PUBLISH_EXEMPT: {path} does not exist (drop or move its exemption)" for path in PUBLISH_EXEMPT
             if not (PACKAGE_DIR.parent / path).is_file()]
    _fail(stale + publish_violations(graph), "PNGs or parameters written outside generation/")


def test_no_front_end_builds_settings():
    _fail(settings_violations(package_graph()), "front ends constructing settings")


def test_diagram_is_the_layers():
    _fail(pages_diagram_violations(), "layer diagram differences (docs/architecture.md, README.md)")


# The checker itself, on small packages written to tmp_path (named anima_rknn, so the same rules apply).


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "anima_rknn"
    for path, text in {"__init__.py": "", **files}.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(textwrap.dedent(text), encoding="utf-8")
    return package


def test_checker_resolves_absolute_relative_and_submodule_imports(tmp_path):
    graph = scan(write_package(tmp_path, {
        "core/__init__.py": "from . import files\nfrom .files import save\nLIMIT = 1\n",
        "core/files.py": "import os\ndef save(): pass\n",
        "engine/__init__.py": "",
        "engine/run.py": ("import anima_rknn.core.files\nfrom anima_rknn.core import LIMIT\nfrom ..core import files\n"
                          "from .. import core\nimport importlib\nimportlib.import_module('anima_rknn.core')\n"
                          "from anima_rknn.nothing import x\n"),
        "data/notes.txt": "not a module",
    }))
    assert "anima_rknn.data" not in graph.modules
    assert [(i.importer, i.target, i.line) for i in graph.imports] == [
        ("anima_rknn.core", "anima_rknn.core.files", 1), ("anima_rknn.core", "anima_rknn.core.files", 2),
        ("anima_rknn.engine.run", "anima_rknn.core.files", 1), ("anima_rknn.engine.run", "anima_rknn.core", 2),
        ("anima_rknn.engine.run", "anima_rknn.core.files", 3), ("anima_rknn.engine.run", "anima_rknn.core", 4),
        ("anima_rknn.engine.run", "anima_rknn.core", 6), ("anima_rknn.engine.run", None, 7)]
    assert unresolved_imports(graph) == [
        "anima_rknn/engine/run.py:7: anima_rknn.engine.run imports anima_rknn.nothing, "
        "which is no module of anima_rknn"]


def test_checker_finds_a_two_module_cycle(tmp_path):
    graph = scan(write_package(tmp_path, {
        "core/__init__.py": "",
        "core/a.py": "from . import b\n",
        "core/b.py": "import os\n\ndef late():\n    import anima_rknn.core.a\n",
        "core/c.py": "from .a import name\n",  # into the cycle, not part of it
    }))
    assert cycle_violations(graph) == [
        "import cycle among 2 modules (anima_rknn.core.a, anima_rknn.core.b): "
        "anima_rknn.core.a -> anima_rknn.core.b -> anima_rknn.core.a; its imports:\n"
        "    anima_rknn/core/a.py:1: anima_rknn.core.a -> anima_rknn.core.b\n"
        "    anima_rknn/core/b.py:4: anima_rknn.core.b -> anima_rknn.core.a (in a function)"]
    assert layer_violations(graph) == [] and placement_violations(graph) == []


def test_checker_finds_an_upward_import_and_an_unplaced_module(tmp_path):
    graph = scan(write_package(tmp_path, {
        "__main__.py": "from .cli import run\n",
        "errors.py": "",
        "core/__init__.py": "",
        "core/files.py": "from ..errors import AnimaError\n\ndef f():\n    from anima_rknn.engine.run import go\n",
        "engine/run.py": "from anima_rknn import errors\n",  # a namespace package: engine/ has no __init__
        "cli/__init__.py": "from ..engine import run\nfrom ..core import files\n",
        "stray/__init__.py": "from ..core import files\n",
        "sampling/sample.py": "import anima_rknn\n",
    }))
    assert layer_violations(graph) == [
        "anima_rknn/core/files.py:4: upward import: anima_rknn.core.files (layer 1 core) imports "
        "anima_rknn.engine.run (layer 5 engine) (in a function)",
        "anima_rknn/sampling/sample.py:1: upward import: anima_rknn.sampling.sample (layer 2 sampling) imports "
        "anima_rknn, the package's entry point, above every layer"]
    assert placement_violations(graph) == [
        "anima_rknn/stray/: anima_rknn.stray is in no layer: place it in LAYERS (tests/test_import_graph.py) "
        "and in the diagram (docs/architecture.md, README.md)"]
    assert cycle_violations(graph) == []


def test_checker_counts_a_type_checking_import_for_layers_and_for_cycles(tmp_path):
    graph = scan(write_package(tmp_path, {
        "vae/__init__.py": "",
        "vae/preview.py": ("from typing import TYPE_CHECKING\nimport typing\n\nif TYPE_CHECKING:\n"
                           "    from ..sampling.sample import StepEvent\nelse:\n    StepEvent = object\n"
                           "if typing.TYPE_CHECKING:\n    from ..engine import split\n"),
        "sampling/__init__.py": "",
        "sampling/sample.py": "",
        "engine/__init__.py": "",
        "engine/split.py": "from anima_rknn.vae.preview import StepEvent\n",
    }))
    assert cycle_violations(graph) == [
        "import cycle among 2 modules (anima_rknn.engine.split, anima_rknn.vae.preview): "
        "anima_rknn.engine.split -> anima_rknn.vae.preview -> anima_rknn.engine.split; its imports:\n"
        "    anima_rknn/engine/split.py:1: anima_rknn.engine.split -> anima_rknn.vae.preview\n"
        "    anima_rknn/vae/preview.py:9: anima_rknn.vae.preview -> anima_rknn.engine.split (under TYPE_CHECKING)"]
    assert layer_violations(graph) == [
        "anima_rknn/vae/preview.py:9: upward import: anima_rknn.vae.preview (layer 3 components) imports "
        "anima_rknn.engine.split (layer 5 engine) (under TYPE_CHECKING)"]
    # the same import outside TYPE_CHECKING is a cycle
    (tmp_path / "anima_rknn/vae/preview.py").write_text("from ..engine import split\n")
    assert cycle_violations(scan(tmp_path / "anima_rknn")) == [
        "import cycle among 2 modules (anima_rknn.engine.split, anima_rknn.vae.preview): "
        "anima_rknn.engine.split -> anima_rknn.vae.preview -> anima_rknn.engine.split; its imports:\n"
        "    anima_rknn/engine/split.py:1: anima_rknn.engine.split -> anima_rknn.vae.preview\n"
        "    anima_rknn/vae/preview.py:1: anima_rknn.vae.preview -> anima_rknn.engine.split"]


def test_checker_finds_front_ends_importing_front_ends_and_hand_made_results(tmp_path):
    graph = scan(write_package(tmp_path, {
        "cli/__init__.py": "",
        "cli/options.py": "from ..generation.params import GenerationParams\np = GenerationParams()\n",
        "cli/commands.py": "from . import generate, serve\n",
        "cli/generate.py": "from .options import p\nfrom .serve import serve\nsave_png(1)\n",
        "cli/serve.py": "from anima_rknn.server import openai\n",
        "server/__init__.py": "",
        "server/openai.py": "from . import a1111\nfrom .app import App\n",
        "server/a1111.py": "from .app import App\nx = gen.GenerationParams(prompt='x')\n",
        "server/app.py": "GenerationParams()\n",
        "batch/worker.py": "from anima_rknn.core.files import png_bytes\nb = png_bytes(1)\nGenerationParams()\n",
        "batch/local.py": "from ..bench.run import Sweep\n",
        "bench/__init__.py": "",
        "bench/run.py": "",
        "generation/publish.py": "save_png(1)\npng_parameters(2)\n",
        "vae/preview.py": "save_png(1)\n",
    }))
    assert front_end_violations(graph) == [
        "anima_rknn/batch/local.py:1: front end imports front end: anima_rknn.batch.local imports "
        "anima_rknn.bench.run, of another front-end package (hand it what it runs instead)",
        "anima_rknn/cli/generate.py:2: front end imports front end: command module anima_rknn.cli.generate "
        "imports anima_rknn.cli.serve, another command module (shared code goes to cli/options.py or a "
        "lower layer)",
        "anima_rknn/server/openai.py:1: front end imports front end: route module anima_rknn.server.openai imports "
        "anima_rknn.server.a1111, another route module (shared code goes to server/runtime.py or a lower layer)"]
    assert publish_violations(graph) == [
        "anima_rknn/batch/worker.py:2: publishing by hand: anima_rknn.batch.worker calls png_bytes(); results are "
        "written by the publisher in anima_rknn/generation/",
        "anima_rknn/cli/generate.py:3: publishing by hand: anima_rknn.cli.generate calls save_png(); results are "
        "written by the publisher in anima_rknn/generation/"]
    assert [p.split(": settings")[0] for p in settings_violations(graph)] == [
        "anima_rknn/batch/worker.py:3", "anima_rknn/server/a1111.py:2"]


def test_checker_reads_the_diagram():
    block = diagram()
    good = f"# x\n\n## Layers\n\nsome words\n\n{block}\n\n## Next\n"
    assert diagram_violations(good) == []
    swapped = good.replace("text, vae, model", "text, model, vae").replace("  7 jobs", "  7 queue")
    assert diagram_violations(swapped) == [
        "docs/architecture.md:12: the diagram's layer 3 (text, model, vae) is not LAYERS' layer 3 (text, vae, model)"]
    short = good.replace(" 10 cli          cli\n", "")
    assert diagram_violations(short) == ["docs/architecture.md:7: the diagram lacks layer 10 (cli)"]
    assert diagram_violations("## Layers\n\n```\nanima_rknn/\n```\n") == [
        "docs/architecture.md:1: the section '## Layers' has no fenced block starting with the line "
        "'layers (lowest first):' (python tests/test_import_graph.py prints it)"]
    readme = good.replace("## Layers", "## How it is built")
    assert diagram_violations(readme) == ["docs/architecture.md: no section '## Layers'"]
    assert diagram_violations(readme, page="README.md", section="## How it is built") == []
    assert diagram_violations(short.replace("## Layers", "## How it is built"), page="README.md",
                              section="## How it is built") == ["README.md:7: the diagram lacks layer 10 (cli)"]
    # Every page that shows the diagram is read, so a stale copy in either fails.
    assert set(DIAGRAM_PAGES) == {"docs/architecture.md", "README.md"}


# ---------------------------------------------------------------------------------------------------- for a human


def main() -> None:
    graph = package_graph()
    index = _layer_index(LAYERS)

    def layer_of(module: str) -> tuple[int, str]:
        """(sort key, name): the layers in order, then the entry points, then the unplaced."""
        top = _top(module)
        if _is_entry_point(module):
            return len(LAYERS), "entry point"
        if top not in index:
            return len(LAYERS) + 1, "unplaced"
        return index[top], f"{index[top]} {layer_label(index[top])}"

    print("modules by layer:")
    for i, names in enumerate(LAYERS):
        members = sorted(m for m in graph.modules if _top(m) in names)
        print(f"{i:>3} {layer_label(i):<12} {', '.join(names)}")
        for line in textwrap.wrap(", ".join(members) or "(no module yet)", 108):
            print(f"      {line}")
    for module in sorted(m for m in graph.modules if layer_of(m)[0] >= len(LAYERS)):
        print(f"  {layer_of(module)[1]:<15} {module}")

    print("\nimports between layers: distinct module -> module edges (* upward; TYPE_CHECKING-only ones included):")
    counts = Counter((layer_of(i.importer), layer_of(i.target)) for i in
                     {(i.importer, i.target): i for i in graph.imports if i.target and i.target != i.importer}.values())
    for (a, b), n in sorted(counts.items()):
        upward = a[0] < len(LAYERS) and (b[0] == len(LAYERS) or a[0] < b[0] < len(LAYERS))  # entry point: above all
        print(f"  {'*' if upward else ' '} {a[1]:<15} -> {b[1]:<15} {n:>4}")

    print("\nthe layer diagram (docs/architecture.md '## Layers', README.md '## How it is built'):\n")
    print(diagram())

    problems = (graph.unparsable + placement_violations(graph) + unresolved_imports(graph) + cycle_violations(graph)
                + layer_violations(graph) + front_end_violations(graph) + publish_violations(graph)
                + settings_violations(graph) + pages_diagram_violations())
    print(f"\n{len(problems)} violations" + (": pytest tests/test_import_graph.py lists them" if problems else ""))


if __name__ == "__main__":
    sys.exit(main())
