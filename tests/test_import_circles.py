"""No import circle joins the project's modules, not even one hidden under `if TYPE_CHECKING:`.

Why stricter than the project-wide rule (tests/test_import_contract.py ignores TYPE_CHECKING imports, which never
run): a circle behind the guard still makes modules that cannot be read, tested or changed apart. The node's tasks
take its state (swarm.node.state), which imports none of them; roles take their context (swarm.node.context).
"""

from __future__ import annotations

from tests.test_import_contract import LAYERS, ROOT, Tree, _components, _tree, import_cycles, scan

STRICT_PACKAGES = ("p2p.", "tasks.", "verify.", "inference.", "trainer.", "swarm.")
"""Packages with no import circle among their modules even through TYPE_CHECKING: every package of the project."""


def cycles_in_strict_packages(tree: Tree) -> list[str]:
    """No cycle among the modules of a strict package, imports under TYPE_CHECKING included: a circle hidden
    behind the guard still makes modules that cannot be read, tested or changed apart (the node's tasks take its
    state, swarm.node.state, which imports none of them)."""
    edges: dict[str, set[str]] = {m: set() for m in tree.modules if m.startswith(STRICT_PACKAGES)}
    for i in tree.imports:
        target = tree.resolve(i.target) if i.top in LAYERS and i.module in edges else None
        if target in edges and target != i.module:
            edges[i.module].add(target)
    return [" <-> ".join(sorted(component)) for component in _components(edges) if len(component) > 1]


def test_the_project_has_no_import_circle_even_through_type_checking():
    assert cycles_in_strict_packages(scan(ROOT)) == []


def test_a_cycle_in_a_strict_package_is_caught_even_through_type_checking(tmp_path):
    tree = _tree(tmp_path, {
        "swarm/node/a.py": "from swarm.node.b import B\n",
        "swarm/node/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swarm.node.a import A\n",
        "swarm/node/c.py": "from swarm.node.b import B\n",
        "swarm/other/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swarm.other.e import E\n",
        "swarm/other/e.py": "from swarm.other.d import D\n",
    })
    assert sorted(cycles_in_strict_packages(tree)) == ["swarm.node.a <-> swarm.node.b",
                                                       "swarm.other.d <-> swarm.other.e"]
    assert import_cycles(tree) == []
