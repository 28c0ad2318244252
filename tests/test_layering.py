"""How mlgo's modules depend on each other, read from their `import` statements.

An import circle makes a module that cannot be read (or loaded) without the others in it;
imports under `if TYPE_CHECKING:` and inside functions count too, since a reader follows
them just the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module in PATH under ROOT (a package by its `__init__.py`)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under `if TYPE_CHECKING:` blocks: imports for annotations alone."""
    blocks = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    return {inner for block in blocks for stmt in block.body for inner in ast.walk(stmt)}


def imported_modules(path: Path, root: Path, known: set[str], annotations: bool = True) -> set[str]:
    """The KNOWN modules the module in PATH imports anywhere in it (with ANNOTATIONS, those
    under `if TYPE_CHECKING:` too): `from a.b import c` names the module a.b.c if there is
    one, else a.b."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if annotations else _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, or as many levels up
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            )
    return (found & known) - {name}


def import_graph(
    root: Path = ROOT, package: str = "mlgo", annotations: bool = True
) -> dict[str, set[str]]:
    """Each module of PACKAGE (a folder under ROOT) -> the modules of PACKAGE it imports
    (with ANNOTATIONS, for type annotations alone too)."""
    paths = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    known = set(paths)
    return {n: imported_modules(p, root, known, annotations) for n, p in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle in GRAPH as [a, b, ..., a], or [] if there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if cycle := visit(imported):
                return cycle
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if cycle := visit(module):
            return cycle
    return []


@pytest.mark.unit
def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import circle: " + " -> ".join(cycle)


@pytest.mark.unit
def test_a_circle_through_type_checking_or_a_function_is_found(tmp_path: Path) -> None:
    """The walker itself: an import only a type checker or a call runs still closes a circle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("")
    assert find_cycle(import_graph(tmp_path, "pkg")) == []


# The folders of mlgo/ from the ground up (README's "How it is built"): each imports only from
# itself and the folders before it, type annotations aside (a Problem passed through llvm/).
# The loose modules stand with the floor they serve: data, errors, options, plots with runtime/,
# records (plain data of a compile and its decisions) with llvm/, whose log format they hold.
FLOORS = (
    ("runtime", "data", "errors", "options", "plots"),
    ("llvm", "records"),
    ("problems",),
    ("corpus",),
    ("packages",),
    ("traces",),
    ("ship",),
    ("train",),
    ("serve",),
    ("programs",),
    ("xla",),
    ("cli",),
)


def floor_of(module: str) -> int:
    room = module.split(".")[1] if "." in module else module
    for i, rooms in enumerate(FLOORS):
        if room in rooms:
            return i
    raise AssertionError(f"{module}: a room on no floor; add it to FLOORS (and to README)")


@pytest.mark.unit
def test_each_folder_imports_only_from_the_folders_before_it() -> None:
    upward = [
        f"{module} -> {imported}"
        for module, imports in sorted(import_graph(annotations=False).items())
        if module != "mlgo"
        for imported in sorted(imports)
        if floor_of(imported) > floor_of(module)
    ]
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def _tool_imports(path: Path) -> list[tuple[str, str]]:
    """Each (module, name) the file at PATH imports, `import a.b` as ("a.b", "")."""
    pairs: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            pairs += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            pairs += [(node.module, alias.name) for alias in node.names]
    return pairs


@pytest.mark.unit
def test_the_lab_is_the_top_floor() -> None:
    """tools/ may use the product's public names, not its CLI (the lab is not a user of the
    command line) nor its private ones; a tool never imports another tool, only the lab's
    shared helpers in tools/lab/."""
    wrong = []
    for path in sorted((ROOT / "tools").rglob("*.py")):
        where = path.relative_to(ROOT)
        for module, name in _tool_imports(path):
            if module == "mlgo.cli" or module.startswith("mlgo.cli."):
                wrong.append(f"{where}: imports {module}")
            elif module.startswith("mlgo") and (name.startswith("_") or "._" in module):
                wrong.append(f"{where}: imports a private name {module}.{name}")
            elif module.split(".")[0] == "tools" and "lab" not in (module.split(".") + [name])[1:2]:
                wrong.append(f"{where}: imports another tool, {module}")
    assert wrong == [], "\n".join(wrong)
