"""The shape of the code, read from its syntax trees: who may import whom, and where.

Layers, bottom up: p2p and tasks, then verify, inference, trainer, swarm. Nothing imports upward; the libraries
never import the network (p2p) or the swarm; p2p and tasks never import a model library; there is no import cycle
(an import inside a function counts, one under `if TYPE_CHECKING:` does not: it never runs); an import sits at
module top unless what it imports is heavy: a heavy dependency (HEAVY), or a project module that imports one at its
own top, directly or through others. Those a module imports inside the function that needs them, so that `swarm
--help`, a seed-only peer and every command that never uses them never load them. No code file is longer than 450
lines (tests/test_import_circles.py adds: no circle anywhere, even through TYPE_CHECKING).

Why from the syntax trees: nothing of the project is imported, so the checks take a fraction of a second and see
every import, also those inside functions that a test run may never reach. Each check returns its offenders, and
the tests at the bottom show each one catching a hand-built violation.

What the checks cannot see: an import built at run time from a computed name (`importlib.import_module(name)`).
A call of `importlib.import_module` or `__import__` with a literal name, or an f-string whose literal start names
a module, counts as an import of that module.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"p2p": 0, "tasks": 0, "verify": 1, "inference": 2, "trainer": 3, "swarm": 4}
LIBRARIES = ("verify", "tasks", "inference", "trainer")
NO_MODELS_IN = ("p2p", "tasks")
MODEL_LIBRARIES = frozenset({"torch", "transformers", "vllm"})
HEAVY = frozenset({"torch", "safetensors.torch", "vllm", "transformers", "reasoning_gym", "math_verify", "gguf",
                   "wandb", "tensorboard", "pyarrow", "matplotlib", "libp2p"})
"""Dependencies imported inside the function that needs them (a name here covers its submodules). torch and the
model libraries take seconds and hundreds of MB, and a seed-only peer never needs them. pyarrow (user parquet
files) and matplotlib (plots) are optional: a missing one is one clear sentence when that file or plot is asked
for, never an error on import. libp2p is not optional but takes seconds to import: swarm.events quiets its loggers
without making `swarm train` load it."""
P2P_ROOMS = {"": 0, "pieces": 1, "channel": 1, "reach": 1, "host": 2, "gossip": 3, "dht": 4}
"""p2p's rooms, bottom up: its foundation at the top of the package (errors, identity, rate limits, budgets,
scores), then pieces, the data channel and reachability side by side, the host that opens them, gossip over the
host, and the DHT, which paces its publishing as gossip does."""
MAX_LINES = 450
CODE_DIRS = (*LAYERS, "tests")


@dataclass(frozen=True)
class Import:
    """One imported name as the importing module wrote it (absolute), and where."""

    path: str  # of the importing file, relative to the root, e.g. "p2p/host/p2p_host.py"
    module: str  # the importing module, e.g. "p2p.host"
    target: str  # e.g. "torch.distributed" or "p2p.identity.Identity"
    line: int
    in_function: bool
    type_checking: bool

    @property
    def top(self) -> str:
        return self.target.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.target}"


@dataclass(frozen=True)
class Tree:
    modules: dict[str, str]  # module name -> path relative to the root
    imports: list[Import]
    lines: dict[str, int]  # path of every code file (tests included) -> its line count

    def resolve(self, target: str) -> str | None:
        """The project module `target` names (the longest known prefix: `p2p.identity.Identity` -> p2p.identity)."""
        while target and target not in self.modules:
            target = target.rpartition(".")[0]
        return target or None


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan(root: Path) -> Tree:
    modules, imports, lines = {}, [], {}
    for top in CODE_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            text = path.read_text(encoding="utf-8")
            lines[rel.as_posix()] = len(text.splitlines())
            if top in LAYERS:
                modules[module_name(rel)] = rel.as_posix()
                imports += _ImportVisitor(rel, text).imports
    return Tree(modules, imports, lines)


class _ImportVisitor(ast.NodeVisitor):
    """Every import of one file, with whether it runs inside a function and whether only a type checker sees it."""

    def __init__(self, rel: Path, text: str) -> None:
        self.rel, self.module = rel, module_name(rel)
        self.package = self.module if rel.name == "__init__.py" else self.module.rpartition(".")[0]
        self.imports: list[Import] = []
        self.depth = 0
        self.type_only = 0
        tree = ast.parse(text, filename=str(rel))
        self.checking_names, self.typing_names = _type_checking_names(tree)
        self.visit(tree)

    def _add(self, node: ast.AST, targets: list[str]) -> None:
        for target in targets:
            self.imports.append(Import(self.rel.as_posix(), self.module, target, node.lineno, self.depth > 0,
                                       self.type_only > 0))

    def _in_function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        if not self._is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.type_only += 1
        for child in node.body:
            self.visit(child)
        self.type_only -= 1
        for child in node.orelse:  # the else branch runs
            self.visit(child)

    def _is_type_checking(self, test: ast.expr) -> bool:
        if isinstance(test, ast.Name):
            return test.id in self.checking_names
        return (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                and isinstance(test.value, ast.Name) and test.value.id in self.typing_names)

    def visit_Import(self, node: ast.Import) -> None:
        self._add(node, [alias.name for alias in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")
            anchor = anchor[:len(anchor) - (node.level - 1)] if node.level > 1 else anchor
            base = ".".join([*anchor, *([base] if base else [])])
        self._add(node, [f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names])

    def visit_Call(self, node: ast.Call) -> None:
        name = _dynamic_import_name(node)
        if name:
            self._add(node, [name])
        self.generic_visit(node)


def _type_checking_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound to typing.TYPE_CHECKING and to the typing module; a name the module also assigns itself (a
    `TYPE_CHECKING = True` that would make a guarded import real) is none of them."""
    checking, typing_names, assigned = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "typing" and not node.level:
            checking |= {a.asname or a.name for a in node.names if a.name == "TYPE_CHECKING"}
        elif isinstance(node, ast.Import):
            typing_names |= {a.asname or a.name for a in node.names if a.name == "typing"}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            assigned.add(node.id)
    return checking - assigned, typing_names - assigned


def _dynamic_import_name(node: ast.Call) -> str | None:
    """The module a literal `importlib.import_module(...)` or `__import__(...)` call imports, else None."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value.strip(".") or None
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rpartition(".")[0] or None  # f"trainer.{name}" -> trainer
    return None


# ---- the checks: each returns its offenders ----------------------------------------------------------------------


def model_imports_in_the_bottom(tree: Tree) -> list[str]:
    """(a) p2p and tasks never import torch, transformers or vllm, anywhere."""
    return [str(i) for i in tree.imports if i.module.split(".")[0] in NO_MODELS_IN and i.top in MODEL_LIBRARIES]


def network_imports_in_libraries(tree: Tree) -> list[str]:
    """(b) verify, tasks, inference and trainer never import p2p or swarm: they take and return plain data."""
    return [str(i) for i in tree.imports if i.module.split(".")[0] in LIBRARIES and i.top in ("p2p", "swarm")]


def upward_imports(tree: Tree) -> list[str]:
    """(c) No module imports one of a higher layer."""
    return [str(i) for i in tree.imports
            if i.top in LAYERS and LAYERS[i.top] > LAYERS[i.module.split(".")[0]]]


def _p2p_room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in P2P_ROOMS else ""


def upward_imports_in_p2p(tree: Tree) -> list[str]:
    """(c') Inside p2p, no room imports a higher room or a sibling of its own rank, not even for a type checker."""
    offenders = []
    for i in tree.imports:
        target = tree.resolve(i.target) if i.top == "p2p" else None
        if not target or i.module.split(".")[0] != "p2p":
            continue
        mine, theirs = _p2p_room(i.module), _p2p_room(target)
        if P2P_ROOMS[theirs] > P2P_ROOMS[mine] or (theirs != mine and theirs and P2P_ROOMS[theirs] == P2P_ROOMS[mine]):
            offenders.append(str(i))
    return offenders


def import_cycles(tree: Tree) -> list[str]:
    """(d) Strongly connected sets of project modules, each sorted, over every import that runs."""
    edges: dict[str, set[str]] = {m: set() for m in tree.modules}
    for i in tree.imports:
        target = tree.resolve(i.target) if i.top in LAYERS else None
        if target and target != i.module and not i.type_checking:
            edges[i.module].add(target)
    return [" <-> ".join(sorted(component)) for component in _components(edges) if len(component) > 1]


def _components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iterative (no recursion limit on a long import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


def _heavy_library(target: str) -> bool:
    return any(target == name or target.startswith(name + ".") for name in HEAVY)


def _with_packages(tree: Tree, target: str) -> list[str]:
    """The project module `target` names and every package above it: importing it runs each one."""
    module = tree.resolve(target)
    parts = module.split(".") if module else []
    return [m for m in (".".join(parts[:n]) for n in range(1, len(parts) + 1)) if m in tree.modules]


def heavy_modules(tree: Tree) -> set[str]:
    """Project modules whose import loads a HEAVY dependency: one at their top, or a heavy module imported there."""
    top_level = [i for i in tree.imports if not i.in_function and not i.type_checking]
    heavy = {i.module for i in top_level if _heavy_library(i.target)}
    while True:
        more = {i.module for i in top_level if i.module not in heavy and i.top in LAYERS
                and any(m in heavy for m in _with_packages(tree, i.target))}
        if not more:
            return heavy
        heavy |= more


def function_level_imports(tree: Tree) -> list[str]:
    """(e) An import inside a function only of something heavy (a HEAVY dependency or a heavy project module)."""
    heavy = heavy_modules(tree)

    def is_heavy(i: Import) -> bool:
        return _heavy_library(i.target) or any(m in heavy for m in _with_packages(tree, i.target))

    return [str(i) for i in tree.imports if i.in_function and not i.type_checking
            and not is_heavy(i)]


def long_files(tree: Tree) -> list[str]:
    """(f) No code file (tests included) over MAX_LINES lines."""
    return [f"{path} has {n} lines" for path, n in sorted(tree.lines.items()) if n > MAX_LINES]


CHECKS = [model_imports_in_the_bottom, network_imports_in_libraries, upward_imports, upward_imports_in_p2p,
import_cycles,
          function_level_imports, long_files]


@pytest.fixture(scope="module")
def repository() -> Tree:
    return scan(ROOT)


def test_the_scan_sees_the_packages_and_their_imports(repository):
    """A scan that found nothing would pass every check: it must see the known modules and imports."""
    assert {"p2p.pieces.engine", "verify.quorum", "trainer.grpo", "swarm"} <= set(repository.modules)
    assert any(i.module == "trainer.grpo" and i.target == "torch" for i in repository.imports)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_repository_keeps_the_contract(repository, check):
    offenders = check(repository)
    assert not offenders, f"{check.__doc__.splitlines()[0]}\n" + "\n".join(offenders)


# ---- each check catches what it is for ---------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Tree:
    for top in CODE_DIRS:
        (tmp_path / top).mkdir(exist_ok=True)
        (tmp_path / top / "__init__.py").touch()
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return scan(tmp_path)


def test_a_model_library_in_p2p_or_tasks_is_caught_wherever_it_hides(tmp_path):
    tree = _tree(tmp_path, {
        "p2p/a.py": "import torch.nn\n",
        "p2p/b.py": "def f():\n    from transformers import AutoModel\n",
        "tasks/c.py": "import importlib\nvllm = importlib.import_module('vllm')\n",
        "verify/d.py": "import torch\n",  # allowed above the bottom layer
    })
    assert sorted(model_imports_in_the_bottom(tree)) == [
        "p2p/a.py:1 imports torch.nn", "p2p/b.py:2 imports transformers.AutoModel", "tasks/c.py:2 imports vllm"]


def test_a_library_that_imports_the_network_or_the_swarm_is_caught(tmp_path):
    tree = _tree(tmp_path, {
        "verify/a.py": "from p2p.host.p2p_host import open_host\n",
        "trainer/b.py": "def f():\n    import swarm.cli\n",
        "swarm/c.py": "import p2p\n",
    })
    assert sorted(network_imports_in_libraries(tree)) == [
        "trainer/b.py:2 imports swarm.cli", "verify/a.py:1 imports p2p.host.p2p_host.open_host"]


def test_an_upward_import_is_caught_and_a_sideways_or_downward_one_is_not(tmp_path):
    tree = _tree(tmp_path, {
        "verify/a.py": "from inference import backend\n",
        "tasks/b.py": "from . import c\nimport verify.rollout\n",
        "tasks/c.py": "import p2p.pieces.wire\n",
        "trainer/d.py": "import inference.models, verify.votes, tasks\n",
    })
    assert sorted(upward_imports(tree)) == [
        "tasks/b.py:2 imports verify.rollout", "verify/a.py:1 imports inference.backend"]


def test_a_p2p_room_that_imports_a_higher_or_sibling_room_is_caught(tmp_path):
    tree = _tree(tmp_path, {
        "p2p/errors.py": "",
        "p2p/pieces/wire.py": "from p2p.errors import E\nimport p2p.channel.records\n",
        "p2p/channel/records.py": "from p2p.errors import E\n",
        "p2p/host/p2p_host.py": "from p2p.reach import probe\nimport p2p.channel.records\n",
        "p2p/reach/probe.py": "import typing\nif typing.TYPE_CHECKING:\n    from p2p.host.p2p_host import H\n",
        "p2p/gossip/service.py": "from p2p.host.p2p_host import H\n",
    })
    assert sorted(upward_imports_in_p2p(tree)) == [
        "p2p/pieces/wire.py:2 imports p2p.channel.records", "p2p/reach/probe.py:3 imports p2p.host.p2p_host.H"]


def test_a_cycle_is_caught_through_functions_and_relative_imports_but_not_through_type_checking(tmp_path):
    tree = _tree(tmp_path, {
        "p2p/a.py": "from p2p.b import x\n",
        "p2p/b.py": "def x():\n    from .c import y\n",
        "p2p/c.py": "import p2p.a\n",
        "verify/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verify.e import E\n",
        "verify/e.py": "from verify.d import D\n",
    })
    assert import_cycles(tree) == ["p2p.a <-> p2p.b <-> p2p.c"]


def test_a_type_checking_guard_that_runs_hides_nothing(tmp_path):
    tree = _tree(tmp_path, {
        "verify/d.py": "from typing import TYPE_CHECKING\nTYPE_CHECKING = True\n"
                       "if TYPE_CHECKING:\n    import verify.e\n",
        "verify/e.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import verify.d\n",
    })
    assert import_cycles(tree) == ["verify.d <-> verify.e"]


def test_a_function_level_import_of_a_light_module_is_caught_and_of_a_heavy_one_is_not(tmp_path):
    tree = _tree(tmp_path, {
        "p2p/a.py": "class A:\n    def f(self):\n        import socket\n",
        "swarm/node/b.py": "async def f():\n    from p2p.host import p2p_host\n",
        "trainer/c.py": "import importlib\ndef get(name):\n    return importlib.import_module(f'trainer.{name}')\n",
        "verify/d.py": "def f():\n    import math_verify\n    import reasoning_gym.factory\n",  # heavy: allowed
        "swarm/cli/e.py": "def f():\n    import torch\n    from safetensors.torch import save_file\n",
        "swarm/roles/f.py": "def f():\n    from trainer.k import step\n",  # heavy through trainer.h: allowed
        "swarm/bench/g.py": "def f():\n    import numpy\n    from safetensors.numpy import load_file\n",
        "trainer/h.py": "import torch\n",
        "trainer/k.py": "from trainer.h import step\n",  # heavy through trainer.h
        "inference/m/__init__.py": "import vllm\n",
        "inference/light.py": "import json\ndef f():\n    import torch\n",  # heavy only when f runs
        "swarm/cli/i.py": "def f():\n    import trainer.k\n    from inference.m.n import x\n"
                          "    from inference.light import f\n",
    })
    assert heavy_modules(tree) == {"trainer.h", "trainer.k", "inference.m"}
    assert sorted(function_level_imports(tree)) == [
        "p2p/a.py:3 imports socket", "swarm/bench/g.py:2 imports numpy",
        "swarm/bench/g.py:3 imports safetensors.numpy.load_file", "swarm/cli/i.py:4 imports inference.light.f",
        "swarm/node/b.py:2 imports p2p.host.p2p_host", "trainer/c.py:3 imports trainer"]


def test_a_file_over_the_limit_is_caught(tmp_path):
    tree = _tree(tmp_path, {"p2p/a.py": "x = 1\n" * MAX_LINES, "tests/test_b.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_files(tree) == [f"tests/test_b.py has {MAX_LINES + 1} lines"]
