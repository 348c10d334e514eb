"""The package's layering, read from its own import statements (``ast``; nothing is imported).

The package stands in wings, each a folder named for its role (``docs/architecture.md``):

=============  ===========================================================  ========
wing           what it holds                                                floor
=============  ===========================================================  ========
``common``     audio facts, the engine's vocabulary, timeline, metrics      1
``text``       the text front end: markdown in, speakable segments out     2
``engine``     speech generation: checkpoints in, PCM streams out          2
``catalogue``  the voices: folder, presets, speakers; writing the folder   3
``service``    the speech service every door calls, its scheduler          4
``doors``      the protocols: Wyoming, HTTP (API, WebSocket, studio)       5
=============  ===========================================================  ========

Above them the commands: ``__main__`` (the server) with ``startup``, ``healthcheck``,
``gguf`` (the checkpoint converter) and ``testing`` (the test checkpoints).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: each is a
module the importer's reader must know. A module's wing is the first part of its path in
the package; ``wyoming_qwen3tts/__init__.py`` (the version) may be imported by any.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = "wyoming_qwen3tts"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: Each wing and the other wings it may import (it may always import itself and the
#: package's face). ``engine`` stands on ``common`` alone: it never reaches the voice
#: catalogue, the service or a door; a door reaches the engine only through the service.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "text": frozenset({"common"}),
    "engine": frozenset({"common"}),
    "catalogue": frozenset({"common", "text"}),
    "service": frozenset({"common", "text", "catalogue", "engine"}),
    "doors": frozenset({"common", "text", "catalogue", "service"}),
    "startup": frozenset({"common", "text", "catalogue", "engine", "service"}),
    "__main__": frozenset({"common", "text", "catalogue", "engine", "service", "doors", "startup"}),
    "healthcheck": frozenset(),
    "gguf": frozenset({"engine"}),  # its command line checks a checkpoint's widths with the GGML engine
    "testing": frozenset({"common"}),
}
#: Most floors the wings may stand on (a wing stands above every wing it imports): issue 51.
MAX_FLOORS = 6


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports(
    name: str, path: Path, modules: dict[str, Path]
) -> list[tuple[str, int]]:
    """The package's modules that ``name`` (at ``path``) imports, each with its line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            targets = submodules or [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c`: the nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def _graph() -> dict[str, list[tuple[str, int]]]:
    """Module -> [(imported module, line)] for every module of the package."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _wing(module: str) -> str | None:
    """The wing a module stands in; None for the package's face (``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _reaches(graph: dict[str, list[tuple[str, int]]], start: str, avoid: set[str]) -> dict[str, list[str]]:
    """Every module reachable from ``start`` without passing through a wing in ``avoid``,
    each with the path of imports that reaches it."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        here = todo.pop()
        for there, _ in graph[here]:
            if there not in paths and _wing(there) not in avoid:
                paths[there] = [*paths[here], there]
                todo.append(there)
    return paths


def test_every_module_stands_in_a_known_wing() -> None:
    """A new top-level module or folder is given its place (and its imports) here first."""
    unplaced = sorted(m for m in _modules() if _wing(m) is not None and _wing(m) not in MAY_IMPORT)
    assert unplaced == [], f"modules in no known wing (add the wing to MAY_IMPORT): {unplaced}"


def test_each_wing_imports_only_the_wings_below_it() -> None:
    graph = _graph()
    refused = [
        f"{module} -> {target} (line {line}): {_wing(module)} may import only {sorted(MAY_IMPORT[_wing(module) or ''])}"
        for module, targets in graph.items()
        for target, line in targets
        if _wing(module) is not None
        and _wing(target) not in (None, _wing(module))
        and _wing(target) not in MAY_IMPORT[_wing(module) or ""]
    ]
    assert refused == []


def test_the_engine_reaches_no_catalogue_service_or_door() -> None:
    """Not even through another module: what the engine imports, and all that imports in
    turn, stays in ``engine`` and ``common``."""
    graph = _graph()
    outside = {
        target: " -> ".join(path)
        for module in graph
        if _wing(module) == "engine"
        for target, path in _reaches(graph, module, set()).items()
        if _wing(target) not in (None, "engine", "common")
    }
    assert outside == {}


def test_the_doors_reach_the_engine_only_through_the_service() -> None:
    """With the service taken away, no chain of imports leads from a door to the engine."""
    graph = _graph()
    around = {
        target: " -> ".join(path)
        for module in graph
        if _wing(module) == "doors"
        for target, path in _reaches(graph, module, {"service"}).items()
        if _wing(target) == "engine"
    }
    assert around == {}


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target, _ in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert circles == []


def _floors(graph: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
    """Each wing's floor: 1 for a wing that imports no other, else one above the highest
    wing it imports (the wings import each other in no circle: see the test above)."""
    below: dict[str, set[str]] = collections.defaultdict(set)
    for module, targets in graph.items():
        for target, _ in targets:
            if _wing(module) and _wing(target) and _wing(module) != _wing(target):
                below[_wing(module) or ""].add(_wing(target) or "")
    floors: dict[str, int] = {}

    def floor(wing: str, seen: tuple[str, ...] = ()) -> int:
        assert wing not in seen, f"the wings import each other in a circle: {' -> '.join((*seen, wing))}"
        if wing not in floors:
            floors[wing] = 1 + max((floor(w, (*seen, wing)) for w in below[wing]), default=0)
        return floors[wing]

    for wing in {_wing(m) for m in graph} - {None}:
        floor(wing or "")
    return floors


def test_the_wings_stand_on_at_most_six_floors() -> None:
    floors = _floors(_graph())
    assert floors["common"] == 1 and floors["engine"] == 2  # the engine stands on the ground floor alone
    assert floors["doors"] > floors["service"] > max(floors["engine"], floors["catalogue"], floors["text"])
    assert max(floors.values()) <= MAX_FLOORS, sorted(floors.items(), key=lambda item: item[1])
