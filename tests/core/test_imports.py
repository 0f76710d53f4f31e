"""The package's imports, read from the source (ast): no module imports one that imports it back, directly or
through others; the RL core (minirl/*.py) imports only the two rooms beneath it, minirl/engines (how rollouts
are generated) and minirl/models (how models are built), never a subsystem built on it (judge, sessions,
agentic, toy, httpd). Imports inside functions count: a lazy import that closes a circle is still a circle to a
reader."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "minirl"
SUBSYSTEMS = ("minirl.judge", "minirl.sessions", "minirl.agentic", "minirl.toy", "minirl.httpd")
BENEATH_THE_CORE = ("minirl.engines", "minirl.models")


def module_names() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (`from a import b`: a.b when that is a module, else a)."""
    modules = module_names()
    graph = {m: set() for m in modules}
    for m, f in modules.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in modules and t != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                out.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_and_the_rooms_beneath_it_import_no_subsystem():
    """One documented exception: minirl.models.resolve_model_path builds the built-in models ("tiny",
    "tiny-code", "smollm2-135m") from minirl.toy, by name, when asked for one."""
    graph, modules = import_graph(), module_names()
    core = [m for m in graph if m.count(".") == 1 and modules[m].name != "__init__.py"]
    assert len(core) > 10 and "minirl.rollout" in core and "minirl.models" not in core
    below = [m for m in graph if m.startswith(BENEATH_THE_CORE)]
    assert {"minirl.engines.decode", "minirl.engines.hf_generate", "minirl.models.lora"} <= set(below)
    found = {m: sorted(t for t in graph[m] if t.startswith(SUBSYSTEMS)) for m in core + below}
    found["minirl.models"] = [t for t in found["minirl.models"] if not t.startswith("minirl.toy.")]
    assert {m: t for m, t in found.items() if t} == {}


def test_the_rollout_chooses_between_the_engines_and_no_engine_imports_it_back_but_vllm():
    """rollout.sample hands a batch to engines.decode or engines.hf_generate; those import the sampler (and
    logprobs' model facts), never rollout, so the core reads without an engine's internals. The vLLM client
    makes Rollouts of what its server returns, so it is the one engine that imports rollout."""
    graph = import_graph()
    assert {"minirl.engines.decode", "minirl.engines.hf_generate"} <= graph["minirl.rollout"]
    assert {"minirl.sampler"} <= graph["minirl.engines.decode"] & graph["minirl.engines.hf_generate"]
    assert [m for m in graph if m.startswith("minirl.engines") and "minirl.rollout" in graph[m]] == [
        "minirl.engines.vllm_engine"]
