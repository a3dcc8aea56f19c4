"""The seam to pysyncobj: the only module touching it, its declared names, its import check."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pysyncobj
import pytest

from raftq.cluster.raft import _seam
from raftq.cluster.raft._seam import (
    DECLARED,
    IMPLEMENTED,
    IMPORTED,
    PINNED,
    READ,
    Declared,
    PysyncobjMismatch,
    check_built,
    check_pysyncobj,
    code_names,
    missing_names,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cluster" / "raftq" / "cluster" / "raft"
SEAM = PACKAGE / "_seam.py"
# Every other source of the project's own code (tests aside).
SOURCES = [ROOT / "cluster", ROOT / "node", ROOT / "client", ROOT / "chaos", ROOT / "bench"]
# Single-underscore names pysyncobj also uses that raftq code outside the seam may use: its own.
OWN = {
    "_destroy": "journal.Journal's (the journal interface pysyncobj calls)",
    "_id": "_Snapshots' own field",
    "_exit": "os._exit",
}


def _pysyncobj_classes() -> list[type]:
    classes = []
    for info in pkgutil.walk_packages(pysyncobj.__path__, "pysyncobj."):
        mod = importlib.import_module(info.name)
        classes += [
            c
            for c in vars(mod).values()
            if isinstance(c, type) and c.__module__.startswith("pysyncobj")
        ]
    return classes


CLASSES = _pysyncobj_classes()
_NAMES = "|".join(sorted({c.__name__.lstrip("_") for c in CLASSES}))
MANGLED = re.compile(rf"\b_(?:{_NAMES})__\w+")


def _private_universe() -> set[str]:
    """Single-underscore names of pysyncobj: module globals, class attributes, attributes its
    code uses."""
    names: set[str] = set()
    for info in pkgutil.walk_packages(pysyncobj.__path__, "pysyncobj."):
        names |= set(vars(importlib.import_module(info.name)))
    for c in CLASSES:
        names |= set(vars(c)) | code_names(c)
    return {
        n
        for n in names
        if n.startswith("_") and not n.startswith("__") and not MANGLED.fullmatch(n)
    }


PRIVATE = _private_universe()


def _python_files(*roots: Path) -> list[Path]:
    return sorted(p for r in roots for p in r.rglob("*.py") if ".venv" not in p.parts)


def _imports_pysyncobj(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "pysyncobj" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pysyncobj":
            return True
    return False


def _names_used(tree: ast.AST) -> set[str]:
    """Attribute names and function names in a module (not string constants)."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            used.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            used |= {a.name for a in node.names}
    return used


# ---------------------------------------------------------------------------- (a) one seam


def test_only_the_seam_imports_pysyncobj_or_names_its_privates() -> None:
    others = [p for p in _python_files(PACKAGE) if p != SEAM]
    assert len(others) >= 10  # the package's modules are all looked at
    for path in others:
        text = path.read_text()
        tree = ast.parse(text)
        assert not _imports_pysyncobj(tree), f"{path.name} imports pysyncobj"
        assert not MANGLED.findall(text), f"{path.name}: {MANGLED.findall(text)}"
        private = {n for n in _names_used(tree) if n in PRIVATE and n not in OWN}
        assert not private, f"{path.name} uses pysyncobj's {sorted(private)}"


def test_nothing_else_in_raftq_imports_pysyncobj() -> None:
    files = [p for p in _python_files(*SOURCES) if p.parent != PACKAGE]
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        assert not _imports_pysyncobj(ast.parse(text)), f"{path} imports pysyncobj"
        assert not MANGLED.findall(text), f"{path}: {MANGLED.findall(text)}"


def test_the_raft_tests_use_the_seam_not_pysyncobj_privates() -> None:
    for path in _python_files(Path(__file__).parent):
        if path.name != Path(__file__).name:
            assert not MANGLED.findall(path.read_text()), path.name


# ---------------------------------------------------------------------------- (b) declared


def _declared(kinds: tuple[str, ...]) -> set[str]:
    return {n for kind in kinds for names in DECLARED[kind].values() for n in names}


def test_every_private_name_the_seam_uses_is_declared() -> None:
    text = SEAM.read_text()
    tree = ast.parse(text)
    used = set(MANGLED.findall(text)) | (_names_used(tree) & PRIVATE)
    declared = _declared(("overridden", "read", "written", "called", "implemented"))
    assert used, "nothing found: the scan is broken"
    assert not used - declared, f"used, not declared: {sorted(used - declared)}"


def test_every_declared_name_is_used_by_the_seam() -> None:
    used = _names_used(ast.parse(SEAM.read_text()))
    declared = _declared(("overridden", "read", "written", "called", "imported"))
    assert not declared - used, f"declared, not used: {sorted(declared - used)}"


def test_every_declared_name_exists_in_the_installed_pysyncobj() -> None:
    assert missing_names() == []
    check_pysyncobj()  # (as at import)


def test_raftq_implements_the_interfaces_it_stands_in_for() -> None:
    from raftq.cluster.journal import Journal
    from raftq.cluster.raft._snapshots import _Snapshots
    from raftq.cluster.raft._wire import _Sealer

    for cls, path in (
        (Journal, "pysyncobj.journal.Journal"),
        (_Snapshots, "pysyncobj.serializer.Serializer"),
        (_Sealer, "pysyncobj.tcp_connection.TcpConnection"),
    ):
        missing = [n for n in IMPLEMENTED[path] if not callable(getattr(cls, n, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"


def test_the_built_objects_are_checked_too() -> None:
    with pytest.raises(PysyncobjMismatch, match="_SyncObj__raftState"):
        check_built("pysyncobj.syncobj.SyncObj", object())


# ---------------------------------------------------------------------------- (c) loud failures


def _fake(monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A module holding a class ``SyncObj`` built from ``source`` (its privates mangle as
    pysyncobj's do); returns the class's dotted path."""
    mod = types.ModuleType("fake_pysyncobj")
    exec(compile(source, "fake_pysyncobj.py", "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "fake_pysyncobj", mod)
    return "fake_pysyncobj.SyncObj"


FAKE = """
class SyncObj:
    def __init__(self):
        self.__raftState = 0

    def __sendAppendEntries(self):
        def later():
            return self.__raftLog
        return later
"""


def test_instance_attributes_and_methods_are_found_in_the_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _fake(monkeypatch, FAKE)
    declared: Declared = {
        "read": {path: ("_SyncObj__raftState", "_SyncObj__raftLog")},  # (nested code too)
        "called": {path: ("_SyncObj__sendAppendEntries",)},
    }
    assert missing_names(declared) == []
    check_pysyncobj(PINNED, declared)


def test_a_renamed_private_fails_the_check_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    path = _fake(monkeypatch, FAKE.replace("__raftState", "__state").replace("__send", "__post"))
    declared: Declared = {
        "read": {path: ("_SyncObj__raftState", "_SyncObj__raftLog")},
        "called": {path: ("_SyncObj__sendAppendEntries",)},
    }
    with pytest.raises(PysyncobjMismatch) as e:
        check_pysyncobj(PINNED, declared)
    message = str(e.value)
    assert "SyncObj._SyncObj__raftState (read)" in message
    assert "SyncObj._SyncObj__sendAppendEntries (called)" in message
    assert "_SyncObj__raftLog" not in message


def test_a_name_missing_from_the_real_pysyncobj_fails_the_check() -> None:
    path = "pysyncobj.syncobj.SyncObj"
    declared: Declared = {**DECLARED, "read": {**READ, path: (*READ[path], "_SyncObj__raftBogus")}}
    with pytest.raises(PysyncobjMismatch, match=r"SyncObj\._SyncObj__raftBogus \(read\)"):
        check_pysyncobj(PINNED, declared)
    gone: Declared = {**DECLARED, "imported": {**IMPORTED, "pysyncobj.renamed": ("SyncObj",)}}
    with pytest.raises(PysyncobjMismatch, match=r"pysyncobj\.renamed"):
        check_pysyncobj(PINNED, gone)


def test_another_version_fails_the_check_naming_both() -> None:
    with pytest.raises(PysyncobjMismatch, match=r"against pysyncobj 0\.3\.17.*0\.3\.18 is"):
        check_pysyncobj("0.3.18")


def test_another_installed_version_fails_the_import() -> None:
    code = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '0.4.0' if name == 'pysyncobj' else real(name)\n"
        "import raftq.cluster.raft\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode != 0
    assert "PysyncobjMismatch" in done.stderr and "pysyncobj 0.4.0 is installed" in done.stderr


# ---------------------------------------------------------------------------- (d) the pin


def test_the_pinned_version_is_the_pin_in_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["server"]  # (a node's)
    pins = [d for d in deps if re.match(r"pysyncobj\b", d)]
    assert pins == [f"pysyncobj=={PINNED}"]
    assert _seam.PINNED == PINNED


def test_last_log_read_from_another_thread_during_an_install_keeps_the_last_pair() -> None:
    """A snapshot install empties the journal for a moment; ``status()`` on another thread must
    not raise then (it did: IndexError from pysyncobj's ``__raftLog[-1]``)."""
    log: list[tuple[bytes, int, int]] = [(b"", 7, 3)]

    class Fake:
        def _SyncObj__getCurrentLogIndex(self) -> int:
            return log[-1][1]

        def _SyncObj__getCurrentLogTerm(self) -> int:
            return log[-1][2]

    raft = _seam.Raft()
    raft._b = Fake()
    assert (raft.last_log_index, raft.last_log_term) == (7, 3)
    log.clear()  # mid-install
    assert (raft.last_log_index, raft.last_log_term) == (7, 3)
    log.append((b"", 9, 4))
    assert (raft.last_log_index, raft.last_log_term) == (9, 4)


def test_the_snapshot_writer_module_loads_the_executor_before_any_fork() -> None:
    """Its at-fork hooks must exist before the first fork (see raft/_snapshots.py)."""
    code = (
        "import sys; import raftq.cluster.raft._snapshots; "
        "sys.exit(0 if 'concurrent.futures.thread' in sys.modules else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_the_append_send_passes_over_a_connection_holding_send_ahead() -> None:
    """pysyncobj's send loop (``members | readonly``) sees the members less those whose
    connection holds more than SEND_AHEAD unsent, whose queue is pushed on instead; a send
    to chosen nodes (``only``) keeps its choice less those; both are restored after."""
    from types import SimpleNamespace

    from raftq.cluster.raft._seam import Raft, _Members
    from raftq.cluster.raft._tuning import SEND_AHEAD

    pushed: list[str] = []

    def conn(name: str, unsent: int) -> SimpleNamespace:
        return SimpleNamespace(
            getSendBufferSize=lambda: unsent,
            _TcpConnection__trySendBuffer=lambda: pushed.append(name),
        )

    raft = Raft.__new__(Raft)
    members = _Members({"n2", "n3", "n4"})
    raft._b = SimpleNamespace(_SyncObj__otherNodes=members)
    raft._transport = SimpleNamespace(
        _connections={
            "n2": conn("n2", SEND_AHEAD + 1),
            "n3": conn("n3", SEND_AHEAD),
            "n4": conn("n4", 0),
        }
    )
    seen: list[set[str]] = []
    send = raft._send_appends(lambda: seen.append(members | {"r1"}))
    send()
    assert seen == [{"n3", "n4", "r1"}] and pushed == ["n2"] and members.only is None
    members.only = {"n2", "n4"}
    send()
    assert seen[-1] == {"n4", "r1"} and members.only == {"n2", "n4"}
    members.only = None
    raft._transport._connections["n2"] = conn("n2", 0)
    send()
    assert seen[-1] == {"n2", "n3", "n4", "r1"} and pushed == ["n2", "n2"]
