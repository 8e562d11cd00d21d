"""docs/developer.md (Layout): imports point down the architecture, never back up. This builds the import
graph of herd/ from the source (every import statement, those inside functions too, but
not those under `if TYPE_CHECKING:`, which never run) and
fails on any cycle, between modules and between herd's top-level parts (config, plan,
replay/, actors/, ...)."""
from __future__ import annotations

import ast
from pathlib import Path

import herd

ROOT = Path(herd.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_imports() -> dict[str, set[str]]:
    """module -> the herd modules it imports by name (a `from herd.x import y` that names
    a submodule counts as importing herd.x.y)."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        # Imports under `if TYPE_CHECKING:` never run: names for annotations only.
        skipped = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and
                   getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def part_of(module: str) -> str:
    """herd.replay.elite -> replay; herd.config -> config."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}          # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_is_read():
    graph = module_imports()
    assert "herd.config" in graph["herd.plan"] and "herd.training" in graph["herd.run"]
    assert "herd.run" in graph["herd.cli"]          # imported inside a function: counted too


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(module_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_part_of_herd_imports_itself_through_others():
    parts: dict[str, set[str]] = {}
    for module, targets in module_imports().items():
        parts.setdefault(part_of(module), set()).update(part_of(t) for t in targets if part_of(t) != part_of(module))
    cycle = find_cycle(parts)
    assert cycle is None, "import cycle between parts of herd: " + " -> ".join(cycle)
