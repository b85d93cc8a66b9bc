"""The map cannot drift: package docstrings, import directions and the numbers docs/architecture.md
quotes are checked against the source.

Pure: every file is read with `ast` or as text; nothing of swarm or sim is imported.

- Each package's `__init__.py` docstring lists every module and subpackage of the package, each at
  the start of a line (`name.py` or `name/`, optionally after `- `), and lists nothing that is gone.
- Dependencies point one way (docs/architecture.md): `FORBIDDEN` names what each package must not
  import. Every import counts, also one inside a function; and whatever a module imports at module
  level must not lead (transitively, within swarm/ and sim/) to a forbidden module either.
- docs/architecture.md quotes a number that lives in code as `` `NAME` (VALUE UNIT) ``, e.g.
  `` `INLINE_MAX_MS` (10 ms) ``: NAME is a module-level constant or a `Class.field` default, named by
  the shortest dotted suffix that is unique in swarm/ and sim/ (`FailoverPolicy.max_failovers`,
  `scheduler.INLINE_MAX_MS`); VALUE is in the constant's own unit (thousands may be written
  `16,384`), except `%` (20% is 0.2) and KiB/MiB/GiB (bytes).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("swarm", "sim")
ARCHITECTURE = ROOT / "docs" / "architecture.md"

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "swarm.route": ("swarm.client", "swarm.peer", "swarm.dht", "swarm.p2p"),
    "swarm.kv": ("swarm.dht", "swarm.ggml_bridge"),
    "sim": ("swarm.dht", "swarm.p2p", "hivemind", "libtorrent", "llama_cpp"),
    "swarm.client": ("swarm.peer",),
    "swarm.spec": ("swarm.client", "swarm.peer", "swarm.dht", "swarm.p2p", "swarm.ggml_bridge"),
}
"""Package → module prefixes it must not import (see docs/architecture.md and sim/__init__.py)."""

QUOTED_AT_LEAST = (
    "INLINE_MAX_MS",
    "MAX_CONTEXT_TOKENS",
    "MAX_FORWARD_TOKENS",
    "UBATCH_TOKENS",
    "MIN_GAIN",
    "ServeConfig.cache_tokens",
    "ServeConfig.max_sessions",
    "FailoverPolicy.max_failovers",
    "FailoverPolicy.exclusion_s",
    "FailoverPolicy.step_timeout_floor_s",
    "FailoverPolicy.step_timeout_slack",
)
"""Constants docs/architecture.md quotes; each must stay quoted in the checked form."""

UNIT_SCALE = {"%": 0.01, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


# -- the source tree, read as text and syntax trees ----------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> dict[str, Path]:
    """Dotted module name → file, for every .py under swarm/ and sim/."""
    return {
        _module_name(p): p
        for root in SOURCE_ROOTS
        for p in sorted((ROOT / root).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _packages() -> list[Path]:
    return sorted(p.parent for root in SOURCE_ROOTS for p in (ROOT / root).rglob("__init__.py"))


def _imports(tree: ast.Module, module: str, is_package: bool, *, top_level_only: bool) -> set[str]:
    """Modules a file imports, absolute, with `from m import n` as both `m` and `m.n`.

    With `top_level_only`, imports inside functions (deliberately lazy) are left out, and the
    parent packages that importing `module` loads are added.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def add(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)

    if not top_level_only:
        for node in ast.walk(tree):
            add(node)
        return found
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        add(node)
        pending.extend(ast.iter_child_nodes(node))
    parts = module.split(".")
    found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return found


def _hits(names: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def _import_chain(graph: dict[str, set[str]], start: str, forbidden: tuple[str, ...]) -> list[str] | None:
    """Shortest chain of module-level imports from `start` to a forbidden module, or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for name in sorted(graph.get(current, ())):
            if name in previous:
                continue
            previous[name] = current
            if _hits({name}, forbidden):
                chain = [name]
                while previous[chain[-1]] is not None:
                    chain.append(previous[chain[-1]])
                return chain[::-1]
            if name in graph:
                queue.append(name)
    return None


# -- package docstrings ---------------------------------------------------------------------------

_ENTRY = re.compile(r"^[ \t]*(?:[-*][ \t]*)?`?([A-Za-z_]\w*(?:\.py|/))", re.MULTILINE)


def _members(package: Path) -> set[str]:
    """`name.py` for each module and `name/` for each subpackage of `package` (not `__init__.py`)."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    subpackages = {p.parent.name + "/" for p in package.glob("*/__init__.py")}
    return modules | subpackages


def _listed(docstring: str) -> set[str]:
    """Files a package docstring lists: a `name.py` or `name/` that starts a line."""
    return set(_ENTRY.findall(docstring))


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_package_docstring_lists_every_file(package: Path):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    members, listed = _members(package), _listed(docstring)
    init = f"{package.relative_to(ROOT)}/__init__.py"
    assert not members - listed, f"{init} does not list {sorted(members - listed)}"
    gone = listed - members - {"__init__.py"}  # a package that has code in __init__.py may say so
    assert not gone, f"{init} lists files that are not there: {sorted(gone)}"


# -- import directions -----------------------------------------------------------------------------


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_imports(package: str):
    files = _source_files()
    trees = {m: ast.parse(p.read_text()) for m, p in files.items()}
    graph = {
        m: _imports(trees[m], m, files[m].name == "__init__.py", top_level_only=True) for m in files
    }
    forbidden = FORBIDDEN[package]
    problems = []
    for module in sorted(m for m in files if m == package or m.startswith(package + ".")):
        direct = _hits(_imports(trees[module], module, files[module].name == "__init__.py",
                                top_level_only=False), forbidden)
        if direct:
            problems.append(f"{files[module].relative_to(ROOT)} imports {direct}")
        chain = _import_chain(graph, module, forbidden)
        if chain:
            problems.append("import chain " + " -> ".join(chain))
    assert not problems, f"{package} must not import {forbidden}:\n" + "\n".join(problems)


# -- numbers quoted in docs/architecture.md -------------------------------------------------------

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.LShift: operator.lshift,
}


def _value(node: ast.AST, scope: dict[str, object]) -> object:
    """A constant expression: literals, + - * / // ** <<, and names bound earlier in `scope`.

    Raises:
        ValueError: anything else (a call, a name from another module).
    """
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand, scope)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left, scope), _value(node.right, scope))
    if isinstance(node, ast.Name) and node.id in scope:
        return scope[node.id]
    raise ValueError(ast.dump(node))


def _bindings(body: list[ast.stmt]) -> Iterator[tuple[str, ast.AST]]:
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value


def _constants() -> dict[str, list[object]]:
    """Qualified name (`swarm.peer.scheduler.INLINE_MAX_MS`, `swarm.x.Class.field`) → [value].

    A value that is not a constant expression is stored as ValueError (found, but not checkable).
    """
    found: dict[str, list[object]] = {}
    for module, path in _source_files().items():
        tree = ast.parse(path.read_text())
        scope: dict[str, object] = {}
        for name, node in _bindings(tree.body):
            try:
                scope[name] = _value(node, scope)
            except ValueError as e:
                scope.pop(name, None)
                found.setdefault(f"{module}.{name}", []).append(e)
            else:
                found.setdefault(f"{module}.{name}", []).append(scope[name])
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for name, node in _bindings(cls.body):
                try:
                    value: object = _value(node, scope)
                except ValueError as e:
                    value = e
                found.setdefault(f"{module}.{cls.name}.{name}", []).append(value)
    return found


_QUOTE_START = re.compile(r"`([A-Za-z_][\w.]*)` \((?=[-+\d])")
_QUOTE = re.compile(r"`([A-Za-z_][\w.]*)` \(([-+]?\d[\d,_]*(?:\.\d+)?) ?(%|[A-Za-z]+)?\)")


def _doc_quotes(text: str) -> list[tuple[str, str, str]]:
    """Every `` `NAME` (VALUE UNIT) `` in `text` as (name, value, unit).

    Raises:
        AssertionError: a `` `NAME` ( `` followed by a digit that is not in that form.
    """
    quotes = [m.groups("") for m in _QUOTE.finditer(text)]
    starts = [m.start() for m in _QUOTE_START.finditer(text)]
    loose = [text[s : text.find(")", s) + 1] for s in starts if not _QUOTE.match(text, s)]
    assert not loose, f"quotes not in the form `NAME` (VALUE UNIT): {loose}"
    return quotes


def _quote_problem(name: str, number: str, unit: str, constants: dict[str, list[object]]) -> str | None:
    """Why the quote `name` (number unit) is wrong, or None when it matches the code."""
    matches = [k for k in constants if k == name or k.endswith("." + name)]
    if not matches:
        return f"`{name}`: no such constant in swarm/ or sim/"
    if len(matches) > 1 or len(constants[matches[0]]) > 1:
        return f"`{name}` is ambiguous ({matches}); quote a longer dotted suffix"
    (actual,) = constants[matches[0]]
    if isinstance(actual, ValueError) or isinstance(actual, bool) or not isinstance(actual, (int, float)):
        return f"`{name}` = {actual!r} is not a number the test can read"
    quoted = float(number.replace(",", "").replace("_", "")) * UNIT_SCALE.get(unit, 1)
    if not math.isclose(quoted, actual, rel_tol=1e-9):
        return f"`{name}` ({number}{' ' + unit if unit else ''}) but the code says {actual!r} ({matches[0]})"
    return None


def test_architecture_numbers_match_the_code():
    constants = _constants()
    quotes = _doc_quotes(ARCHITECTURE.read_text())
    problems = [p for q in quotes if (p := _quote_problem(*q, constants))]
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)
    missing = set(QUOTED_AT_LEAST) - {name for name, _, _ in quotes}
    assert not missing, f"docs/architecture.md no longer quotes {sorted(missing)} as `NAME` (VALUE)"


# -- the checks themselves catch what they should ------------------------------------------------


def test_quote_check_catches_a_wrong_number_and_reads_units():
    constants = {"swarm.a.X_MS": [10.0], "swarm.b.Policy.gain": [0.2], "swarm.c.SIZE": [64 << 20],
                 "swarm.d.X_MS": [3.0]}
    assert _quote_problem("a.X_MS", "10", "ms", constants) is None
    assert "but the code says 10.0" in _quote_problem("a.X_MS", "2", "ms", constants)
    assert "ambiguous" in _quote_problem("X_MS", "10", "ms", constants)
    assert _quote_problem("Policy.gain", "20", "%", constants) is None
    assert _quote_problem("SIZE", "64", "MiB", constants) is None
    assert "no such constant" in _quote_problem("NOPE", "1", "", constants)
    quotes = _doc_quotes("a `A_B` (131,072 tokens) cap; `X` (2x)")
    assert quotes == [("A_B", "131,072", "tokens"), ("X", "2", "x")]
    with pytest.raises(AssertionError, match="not in the form"):
        _doc_quotes("runs inline under `INLINE_MAX_MS` (10 ms, measured)")


def test_constants_are_read_from_the_syntax_tree():
    tree = ast.parse("A = 1 << 10\nB: int = A * 2\nC = f()\nclass P:\n    x: float = 0.5\n")
    scope: dict[str, object] = {}
    values = {}
    for name, node in _bindings(tree.body):
        try:
            scope[name] = values[name] = _value(node, scope)
        except ValueError:
            values[name] = None
    assert values == {"A": 1024, "B": 2048, "C": None}
    assert [(n, _value(v, scope)) for n, v in _bindings(tree.body[3].body)] == [("x", 0.5)]


def test_import_check_sees_lazy_and_relative_imports():
    tree = ast.parse("from . import budget\nfrom ..dht import node\n"
                     "def f():\n    import swarm.dht.identity\n")
    every = _imports(tree, "swarm.kv.snapshot", False, top_level_only=False)
    top = _imports(tree, "swarm.kv.snapshot", False, top_level_only=True)
    assert _hits(every, ("swarm.dht",)) == ["swarm.dht", "swarm.dht.identity", "swarm.dht.node"]
    assert "swarm.dht.identity" not in top and {"swarm.kv.budget", "swarm", "swarm.kv"} <= top
    graph = {"sim.a": {"swarm.x"}, "swarm.x": {"swarm.dht.node"}}
    assert _import_chain(graph, "sim.a", ("swarm.dht",)) == ["sim.a", "swarm.x", "swarm.dht.node"]


def test_docstring_entries_are_files_at_line_starts():
    doc = "Files:\n    a.py  one\n    - b.py: two, see c.py\n    sub/  a package\nFlow: a.py -> b.py\n"
    assert _listed(doc) == {"a.py", "b.py", "sub/"}


ROOM_LINES = 400
"""A module past this many lines must say in its docstring why it stays one file (the house's rule)."""
ONE_FILE_REASON = "stays one file past the house's ~400 lines"


def _long_modules_without_reason(files: list[Path]) -> list[str]:
    """Names (with line counts) of the files past ROOM_LINES whose docstring gives no reason."""
    found = []
    for path in files:
        text = path.read_text()
        n_lines = len(text.splitlines())
        docstring = " ".join((ast.get_docstring(ast.parse(text)) or "").split())
        if n_lines > ROOM_LINES and ONE_FILE_REASON not in docstring:
            found.append(f"{path.name} ({n_lines} lines)")
    return found


def test_a_long_module_says_why_it_is_one_file():
    files = list(_source_files().values())
    assert any(len(p.read_text().splitlines()) > ROOM_LINES for p in files), "no long module: nothing checked"
    offenders = _long_modules_without_reason(files)
    assert not offenders, (f"split these by concern, or say in the module docstring why each "
                           f"{ONE_FILE_REASON} (one concern): {offenders}")


def test_the_long_module_check_catches_a_module_without_reason(tmp_path: Path):
    body = "x = 1\n" * (ROOM_LINES + 1)
    (tmp_path / "long.py").write_text('"""A module of many concerns."""\n' + body)
    (tmp_path / "reasoned.py").write_text(f'"""One concern; it {ONE_FILE_REASON}."""\n' + body)
    (tmp_path / "short.py").write_text('"""Short."""\n')
    found = _long_modules_without_reason(sorted(tmp_path.glob("*.py")))
    assert found == [f"long.py ({ROOM_LINES + 2} lines)"]
