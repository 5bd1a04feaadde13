"""The type stubs (python/ringreduce/**/*.pyi) and py.typed agree with the built package: each stub
parses; it names every public name of its module and no other; each class has the stub's public
members; and every method of Communicator and Work, and ringreduce.init, has the stub's
parameters in the same order with the same defaults (read from pybind11's signature line)."""

import ast
import importlib
import inspect
import sys
import types

import pytest

from conftest import BUILD, PYDIR, REPO, have_module

if not have_module("_ringreduce"):
    pytest.skip(f"ringreduce not built in {BUILD}", allow_module_level=True)
sys.path.insert(0, str(PYDIR))

SRC = REPO / "python" / "ringreduce"
# module -> its stub, relative to the package
STUBS = {
    "ringreduce": "__init__.pyi",
    "ringreduce._ringreduce": "_ringreduce.pyi",
    "ringreduce.torch": "torch/__init__.pyi",
    "ringreduce.torch._torch_backend": "torch/_torch_backend.pyi",
}


def needs(module):
    if module.startswith("ringreduce.torch"):
        pytest.importorskip("torch")
        if not have_module("_torch_backend"):
            pytest.skip("the torch backend was not built")
    return importlib.import_module(module)


def stub(module):
    return ast.parse((PYDIR / "ringreduce" / STUBS[module]).read_text(), STUBS[module])


def top_names(tree):
    """The names a stub defines at its top level (import-as re-exports included)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level > 0:
            names.update(a.asname for a in node.names if a.asname == a.name)
    return names


def public(names):
    return {n for n in names if not n.startswith("_") or n == "__version__"}


def test_py_typed_and_every_stub_is_in_the_build_and_the_source():
    assert (PYDIR / "ringreduce" / "py.typed").exists()
    for rel in STUBS.values():
        built = PYDIR / "ringreduce" / rel
        assert built.read_text() == (SRC / rel).read_text(), f"{built} is stale"
        ast.parse(built.read_text(), rel)


@pytest.mark.parametrize("module", sorted(STUBS))
def test_the_stub_names_every_public_name_of_its_module(module):
    mod = needs(module)
    runtime = public(n for n in dir(mod) if not isinstance(getattr(mod, n), types.ModuleType))
    # The stub's own aliases (_Buffer, _Op) are private: they name no runtime object.
    assert public(top_names(stub(module))) == runtime


def test_the_stubs_all_is_the_packages():
    import ringreduce

    tree = stub("ringreduce")
    (node,) = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"]
    assert ast.literal_eval(node.value) == ringreduce.__all__


def stub_classes(module):
    return {n.name: n for n in stub(module).body if isinstance(n, ast.ClassDef)}


def members(cls_node):
    out = {}
    for node in cls_node.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = node
    return out


@pytest.mark.parametrize("name", sorted(stub_classes("ringreduce._ringreduce")))
def test_each_class_has_the_stubs_members_and_bases(name):
    mod = needs("ringreduce._ringreduce")
    node = stub_classes("ringreduce._ringreduce")[name]
    cls = getattr(mod, name)
    if issubclass(cls, BaseException):
        # Exceptions: the same bases; code and peer are set on each raised instance
        # (test_api.py::test_timeout_error_is_pythons_timeout_error reads them).
        assert [ast.unparse(b) for b in node.bases] == [
            ("builtins." if b.__module__ == "builtins" and b.__name__ == name else "")
            + b.__name__ for b in cls.__bases__]
        return
    runtime = public(n for n in vars(cls) if n != "__version__")
    assert public(members(node)) == runtime
    for n, m in members(node).items():
        if isinstance(vars(cls).get(n), property) and not n.startswith("__"):
            assert isinstance(m, ast.FunctionDef) and any(
                ast.unparse(d) == "property" for d in m.decorator_list), f"{name}.{n}"


def split_params(text):
    """pybind11's "a: T = d, b: Dict[str, str] = {}" into its parameters (commas at depth 0)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def runtime_params(fn, name):
    """(name, default or None) of each parameter but self and **kwargs, from pybind11's line."""
    line = fn.__doc__.splitlines()[0]
    assert line.startswith(name + "("), line
    inner = line[len(name) + 1:line.rindex(") ->")]
    out = []
    for p in split_params(inner)[1:]:  # self
        if p.startswith("*"):
            continue  # the **kwargs that catches arguments a call does not take
        head, _, default = p.partition(" = ")
        out.append((head.split(":")[0].strip(), default or None))
    return out


def stub_params(fn_node):
    args = fn_node.args
    plain = args.posonlyargs + args.args
    defaults = [None] * (len(plain) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    out = [(a.arg, d) for a, d in zip(plain, defaults)][1:]  # self
    out += [(a.arg, ast.unparse(d) if d else None)
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return out


@pytest.mark.parametrize("cls_name", ["Communicator", "Work"])
def test_every_method_has_the_stubs_parameters(cls_name):
    mod = needs("ringreduce._ringreduce")
    cls = getattr(mod, cls_name)
    checked = 0
    for name, node in members(stub_classes("ringreduce._ringreduce")[cls_name]).items():
        if not isinstance(node, ast.FunctionDef) or isinstance(vars(cls).get(name), property):
            continue
        if name.startswith("__") and name != "__init__":
            continue  # __enter__/__exit__: pybind11's *args, the stub's exact protocol
        assert runtime_params(getattr(cls, name), name) == stub_params(node), name
        checked += 1
    assert checked >= (33 if cls_name == "Communicator" else 3)


def test_init_has_the_stubs_parameters():
    import ringreduce

    (node,) = [n for n in stub("ringreduce").body
               if isinstance(n, ast.FunctionDef) and n.name == "init"]
    sig = inspect.signature(ringreduce.init)
    runtime = [(p.name, repr(p.default) if p.default is not p.empty else None)
               for p in sig.parameters.values()]
    assert not node.args.args and all(p.kind is p.KEYWORD_ONLY for p in sig.parameters.values())
    assert runtime == [(a.arg, ast.unparse(d) if d else None)
                       for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults)]
