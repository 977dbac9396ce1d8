"""No import cycles inside ``crf`` or ``pipeline``, counting every import statement.

The graph is read from the source with :mod:`ast`: module-level and function-local imports alike,
``import a.b``, ``from a import b`` (an edge to the submodule ``a.b`` when it is one, else to ``a``)
and relative ``from . import x``. ``from crf import CRF`` also counts as an import of the module
that defines ``CRF`` (``crf`` imports its names on first use, from its ``_EXPORTS`` table).
Imports under ``if TYPE_CHECKING:`` count as well: annotations are part of the design. Importing ``a.b`` runs the package
``a`` first; that implicit step is not an edge (a package that imports its own submodules would
otherwise always be a cycle), an explicit ``from a import name`` is.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str, root: Path) -> dict[str, Path]:
    """{module name: source file} of every module of ``package`` (a folder under ``root``)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _lazy_exports(init: Path) -> dict[str, str]:
    """A package's ``_EXPORTS`` table ({name: submodule}), empty when it has none."""
    for node in ast.parse(init.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            return {str(k): str(v) for k, v in ast.literal_eval(node.value).items()}
    return {}


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the modules of ``package`` it imports} for every module of ``package``."""
    modules = _modules(package, root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = importlib.util.resolve_name("." * node.level + (node.module or ""), base) if node.level else node.module
                exports = _lazy_exports(modules[source]) if source in modules and modules[source].name == "__init__.py" else {}
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        targets.add(submodule)
                    else:
                        targets.add(source)
                        if alias.name in exports:
                            targets.add(f"{source}.{exports[alias.name]}")
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_function_local_and_relative_imports(tmp_path):
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from toy.c import x\n")
    (package / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import toy.a\ndef g():\n    import toy.a\n")
    graph = import_graph("toy", tmp_path)
    assert graph["toy.a"] == {"toy.b"} and graph["toy.b"] == {"toy.c"} and graph["toy.c"] == {"toy.a"}
    assert find_cycle(graph) == ["toy.a", "toy.b", "toy.c", "toy.a"]


@pytest.mark.parametrize(
    "package",
    [
        "crf",
        "pipeline",
    ],
)
def test_no_import_cycles(package):
    cycle = find_cycle(import_graph(package))
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle)}"


def imported_names(path: Path, name: str) -> set[str]:
    """Every module that an import statement of module ``name`` (file ``path``) names, project or
    not, function-local ones too (``from a import b`` gives ``a`` and ``a.b``)."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), base) if node.level else node.module
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


# what the engine must not know: it defines the interfaces (run store, remote cache, trial hooks) and
# pipeline.__main__ plugs the implementations in
ENGINE_MUST_NOT_IMPORT = ("mlflow", "optuna", "pipeline.tracking", "pipeline.sweeps", "pipeline.__main__")


def test_imported_names_sees_function_local_and_relative_imports(tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "a.py").write_text(
        "import mlflow.entities\ndef f():\n    from .b import c\n    from optuna import trial\n"
    )
    assert imported_names(tmp_path / "toy" / "a.py", "toy.a") == {"mlflow.entities", "toy.b", "toy.b.c", "optuna", "optuna.trial"}


def test_the_engine_imports_no_store_and_no_sweeper():
    """Neither the engine's modules nor any project module they import, transitively, import MLflow,
    Optuna, the tracking or sweep packages, or the composition module."""
    modules = _modules("pipeline", ROOT)
    graph = import_graph("pipeline")
    via: dict[str, list[str]] = {
        name: [name] for name in modules if name == "pipeline.engine" or name.startswith("pipeline.engine.")
    }
    pending = list(via)
    while pending:  # every project module the engine reaches, with the chain that reaches it
        name = pending.pop()
        for target in graph[name] - via.keys():
            via[target] = via[name] + [target]
            pending.append(target)
    found = [
        f"{' -> '.join(chain)} imports {imported}"
        for module, chain in sorted(via.items())
        for imported in sorted(imported_names(modules[module], module))
        if any(imported == banned or imported.startswith(banned + ".") for banned in ENGINE_MUST_NOT_IMPORT)
    ]
    assert len(via) > 6 and "pipeline.engine.runner" in via  # the walk saw the engine
    assert not found, "\n".join(found)


def test_the_engine_names_no_stage():
    """The engine's own modules import no stage module and no dataset code: the stages come from the
    list in ``pipeline.stages`` and tell the engine what it needs (their inputs, files and metrics)."""
    modules = _modules("pipeline", ROOT)
    engine = [name for name in modules if name.startswith("pipeline.engine.")]
    found = [
        f"{name} imports {imported}"
        for name in sorted(engine)
        for imported in sorted(imported_names(modules[name], name))
        if imported.startswith("pipeline.stages")
    ]
    assert "pipeline.engine.runner" in engine and not found, "\n".join(found)
    source = modules["pipeline.engine.stage"].read_text()
    assert "pipeline.stages.prepare" not in source  # the stage list lives with the stages
