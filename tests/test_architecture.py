"""The package's shape (issue 45, docs/architecture.md): no import cycle among kvstudy's modules (function-level imports
included), vidur imported by the latency adapter alone, both memory models implementing the written memory interface,
and every iteration row of both conventions in the columns records.py declares."""
import ast
from pathlib import Path

import numpy as np
import pytest

from kvstudy.engine import records
from kvstudy.engine.loop import Batch
from kvstudy.policies.step import Decision
from kvstudy.memory import PagedMemory
from kvstudy.memory.base import MemoryModel
from kvstudy.memory.paper import PaperMemory

PACKAGE = Path(__file__).resolve().parents[1] / "kvstudy"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict, name: str) -> set:
    """kvstudy modules ``path`` imports anywhere in it (module level or inside a function): ``from a.b import c``
    names the module a.b.c when c is one, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kvstudy"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("kvstudy"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def _with_packages(name: str, imported: set, modules: dict) -> set:
    """``imported`` and the packages whose ``__init__`` importing each runs first (``kvstudy.engine`` for
    ``kvstudy.engine.states``), except the root (``kvstudy/__init__.py`` registers resolvers and imports
    running/paths.py alone) and the importer's own packages (already running when it is imported)."""
    out = set(imported)
    for m in imported:
        parts = m.split(".")
        for k in range(2, len(parts)):
            package = ".".join(parts[:k])
            if package in modules and not name.startswith(package + "."):
                out.add(package)
    return out - {name}


def test_no_import_cycle():
    """No cycle, counting what a package's ``__init__`` imports (issue 56: policies/admission.py importing from
    kvstudy.engine ran engine/__init__.py, which imports loop.py, which imports admission.py)."""
    modules = _modules()
    graph = {name: _with_packages(name, _imports(path, modules, name), modules) for name, path in modules.items()}
    # Tarjan's strongly connected components: any component of two or more modules is a cycle
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles among kvstudy modules: {cycles}"


def test_the_cycle_check_sees_function_level_imports(tmp_path):
    """The check itself: a function-level import that closes a loop is found (the shape of the old api -> ... ->
    preemption_cost -> api loop)."""
    (tmp_path / "kvstudy").mkdir()
    a = tmp_path / "kvstudy" / "a.py"
    a.write_text("def f():\n    from kvstudy import b\n")
    modules = {"kvstudy.a": a, "kvstudy.b": tmp_path / "kvstudy" / "b.py"}
    assert _imports(a, modules, "kvstudy.a") == {"kvstudy.b"}


def test_the_cycle_check_counts_a_package_init(tmp_path):
    """The check itself: importing a.b.c runs a.b's ``__init__``; one that imports back closes a loop."""
    modules = {"kvstudy.p": None, "kvstudy.p.x": None, "kvstudy.q": None}
    assert _with_packages("kvstudy.q", {"kvstudy.p.x"}, modules) == {"kvstudy.p.x", "kvstudy.p"}
    assert _with_packages("kvstudy.p.y", {"kvstudy.p.x"}, modules) == {"kvstudy.p.x"}  # its own package


def test_only_the_latency_adapter_imports_vidur():
    importers = sorted(name for name, path in _modules().items()
                       if any(isinstance(n, (ast.Import, ast.ImportFrom)) and (
                           (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vidur")
                           or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "vidur" for a in n.names)))
                           for n in ast.walk(ast.parse(path.read_text()))))
    assert importers == ["kvstudy.latency.vidur_adapter"]


@pytest.mark.parametrize("memory", [PaperMemory(100), PagedMemory(64, block_size=4),
                                    PagedMemory(64, block_size=4, prefix_caching=True)])
def test_both_memory_models_implement_the_interface(memory):
    assert isinstance(memory, MemoryModel)
    memory.bind(1024)
    assert memory.convention in ("paper", "vllm") and set(memory.modes) <= {"recompute", "swap"}
    assert memory.cache_stats() == (0, 0) and memory.release_gain([]) == (0, set())
    assert memory.start(0, 8) == 0  # nothing cached yet: no tokens skipped
    assert memory.held(0) == (memory.blocks(8) if memory.tracks_blocks else 0)


@pytest.mark.parametrize("memory", [PaperMemory(100), PagedMemory(64, block_size=4)])
def test_iteration_rows_are_in_the_declared_columns(memory):
    """A decode-only row and a general row with the same values are the same row, and each value lands in the
    column named for it."""
    memory.bind(1024)
    rows = records.row_log(memory)
    rows.decode_only(1.5, 0.25, 3, 40)
    batch = Batch(0)
    batch.decodes, batch.decode_ctx, batch.kv_in_use = 3, 37, 40
    rows.iteration(1.5, 0.25, batch, Decision(decode_all=True))
    rows.clearing(start=2.0, duration=0.0, decodes=2, decode_kv=30, cleared=1, blocks_used=memory.used)
    table = records._iterations(rows)
    assert list(table.columns) == list(records.ITERATION_COLUMNS[:rows.width])
    assert table.iloc[0].equals(table.iloc[1])
    first, last = table.iloc[0], table.iloc[2]
    assert (first.start, first.duration, first.batch_size, first.decode_tokens, first.kv_tokens_in_use) == \
        (1.5, 0.25, 3, 3, 40)
    assert bool(last.overflow) and last.cleared == 1 and last.kv_tokens_in_use == 30 and last.capacity == \
        memory.capacity_tokens
    assert np.issubdtype(table["overflow"].dtype, np.bool_)


#: where implementations are chosen (issue 56): the only modules outside kvstudy/memory/ that may name them
ASSEMBLY = {"kvstudy.running.assemble", "kvstudy.engine.assembly"}
IMPLEMENTATIONS = {"kvstudy.memory.paged", "kvstudy.memory.prefix", "kvstudy.memory.offload"}


def _outside_memory() -> dict:
    return {name: path for name, path in _modules().items()
            if not (name == "kvstudy.memory" or name.startswith("kvstudy.memory.")) and name not in ASSEMBLY}


def test_nothing_outside_memory_imports_a_memory_implementation():
    """Policies, cacheopt/, the engine, records and the driver see the memory through kvstudy/memory/base.py and
    connector.py alone (issue 56); ``from kvstudy.memory import PagedMemory`` counts (the package re-exports them)."""
    modules = _modules()
    bad = {name: sorted(found) for name, path in _outside_memory().items()
           if (found := _imports(path, modules, name) & (IMPLEMENTATIONS | {"kvstudy.memory"}))}
    assert not bad, f"modules outside kvstudy/memory/ importing a memory implementation: {bad}"


def _protocol_members() -> set:
    from kvstudy.memory.base import MemoryModel, PrefixIndex
    from kvstudy.memory.connector import KVConnector

    out = set()
    for proto in (MemoryModel, PrefixIndex, KVConnector):
        for part in proto.__mro__:  # MemoryModel: BlockAllocator, HostSwap, Loans and its own
            if part.__module__.startswith("kvstudy."):
                out |= set(getattr(part, "__annotations__", {})) | {k for k in vars(part) if not k.startswith("_")}
    return out


def test_the_memory_protocol_is_its_parts_and_their_sizes_are_documented():
    """docs/architecture.md gives each part's member count; a change to a protocol changes the page with it."""
    from kvstudy.memory.base import BlockAllocator, HostSwap, Loans, MemoryModel, PrefixIndex
    from kvstudy.memory.connector import KVConnector

    def members(proto):
        return {k for part in proto.__mro__ if part.__module__.startswith("kvstudy.")
                for k in set(getattr(part, "__annotations__", {})) | {k for k in vars(part) if not k.startswith("_")}}

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for proto in (BlockAllocator, HostSwap, Loans, MemoryModel, PrefixIndex, KVConnector):
        assert f"`{proto.__name__}`, {len(members(proto))} members" in page, proto.__name__


def _implementation_attributes() -> set:
    """Every public attribute a built-in memory, prefix cache or connector has during a run."""
    from kvstudy.memory.connector import NoConnector
    from kvstudy.memory.offload import OffloadConnector, OffloadTiers, Tier
    from kvstudy.memory.prefix import NoPrefixIndex, PrefixCache

    mem = PagedMemory(64, block_size=4, prefix_caching=True, offload={"host_gb": 1.0, "host_read_gbps": 1.0,
                                                                      "host_write_gbps": 1.0})
    mem.bind(2)
    names = set(vars(mem)) | set(vars(mem.cache)) | set(vars(mem.connector)) | set(vars(mem.connector.pool))
    for cls in (PagedMemory, type(mem), PaperMemory, OffloadConnector, OffloadTiers, Tier, PrefixCache, NoPrefixIndex,
                NoConnector):
        names |= {k for k in dir(cls) if not k.startswith("_")}
    return {n for n in names if not n.startswith("_")}


def test_nothing_outside_memory_reads_what_the_protocols_do_not_document():
    """No ``<...memory>.x``, ``<...mem>.x``, ``<...connector>.x`` or ``<...cache>.x`` outside kvstudy/memory/ names an
    attribute the built-in implementations have but kvstudy/memory/base.py's ``MemoryModel`` and ``PrefixIndex`` and
    connector.py's ``KVConnector`` do not document (``memory.offload``, ``memory.host[i]``, ``mem.loaded`` were)."""
    private = _implementation_attributes() - _protocol_members()
    bad = []
    for name, path in _outside_memory().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = ast.unparse(node.value)
                if owner.rsplit(".", 1)[-1] in ("memory", "mem", "connector", "cache"):
                    bad.append(f"{name}:{node.lineno} {owner}.{node.attr}")
    assert not bad, f"implementation attributes read outside kvstudy/memory/: {bad}"


def test_the_memory_s_block_table_is_written_by_the_memory_alone():
    """``memory.gpu`` (request -> blocks held: ``BlockAllocator``) is owned by the memory model: the decode clock and
    the policies hold a reference to read it (``held`` in kvstudy/engine/decode_clock.py), and nothing outside
    kvstudy/memory/ assigns into it, deletes from it or rebinds it."""
    names = {"gpu", "held"}
    bad = []
    for name, path in _outside_memory().items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("pop", "clear", "update", "setdefault", "popitem"):
                targets = [node.func.value]
            for target in targets:
                for sub in ast.walk(target):
                    base = sub.value if isinstance(sub, ast.Subscript) else sub
                    if isinstance(sub, ast.Subscript) or isinstance(node, ast.Call):
                        if isinstance(base, ast.Attribute) and base.attr in names:  # x.gpu[...], clock.held.pop()
                            bad.append(f"{name}:{node.lineno} {ast.unparse(target)}")
    assert not bad, f"the memory's block table changed outside kvstudy/memory/: {bad}"
