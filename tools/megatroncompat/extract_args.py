#!/usr/bin/env python3
"""Writes Megatron-LM's training arguments as a TSV table.

Usage: extract_args.py MEGATRON_CHECKOUT > cmd/gotron/testdata/megatron/arguments.tsv

It builds Megatron's own argparse parser (megatron.training.arguments.
add_megatron_arguments) and reads every option back from it, so the list is
Megatron's, not a transcription. Megatron imports packages that are not needed
to build the parser (transformer_engine, packaging, ...); any module that is
missing is replaced by an empty stand-in, which only ever affects defaults that
Megatron computes from such a package (none of those we check).

Columns: group, option strings (comma-separated), type, default, nargs, choices.
"""
import typing
import argparse
import importlib.abc
import importlib.machinery
import sys
import types


# torch is stubbed too: building the parser needs no tensor, and Debian's torch 1.13
# does not import under Python 3.11 inside Megatron (a dataclass default error).
_STUB = {"torch"}


class _StubMeta(type(typing.Protocol)):
    """Every attribute of a stand-in is another stand-in class, so stand-ins
    can be used where Python wants a type (annotations, Union[...],
    isinstance), called, subscripted and used as decorators."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)

    def __getitem__(cls, key):
        return cls

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return cls

    def __iter__(cls):
        return iter(())

    def __or__(cls, other):
        return cls

    __ror__ = __or__
    __add__ = __radd__ = __sub__ = __rsub__ = __or__
    __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __floordiv__ = __or__

    def __lt__(cls, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __len__(cls):
        return 0


def _stub(name):
    return _StubMeta(name, (), {"__module__": "stub",
                                "__init_subclass__": classmethod(lambda cls, **kw: None)})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Supplies a MagicMock module for every import that cannot be found."""

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in _STUB:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if top == "megatron" or top.startswith("_") or top in sys.stdlib_module_names:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                spec = None
            if spec is not None:
                return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.__spec__ = spec
        m.__version__ = "2.6.0"
        return m

    def exec_module(self, module):
        pass


def type_name(a):
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "bool"
    if isinstance(a, argparse._StoreConstAction):
        return "const"
    t = a.type
    if t is None:
        return "str"
    return getattr(t, "__name__", type(t).__name__)


def main():
    sys.path.insert(0, sys.argv[1])
    sys.meta_path.insert(0, _StubFinder())
    if not hasattr(typing, "override"):  # Python 3.12's; Debian has 3.11
        typing.override = lambda f: f
    # megatron/training/__init__.py imports the whole trainer (RL servers,
    # pydantic models, ...); arguments.py needs none of it, so the package is
    # entered without running its __init__.
    import megatron
    import os
    pkg = _StubModule("megatron.training")
    pkg.__path__ = [os.path.join(sys.argv[1], "megatron", "training")]
    sys.modules["megatron.training"] = pkg
    from megatron.training.arguments import add_megatron_arguments

    p = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(p)
    print("group\toptions\tdest\ttype\tdefault\tnargs\tchoices")
    for g in p._action_groups:
        for a in g._group_actions:
            if not a.option_strings or a.option_strings[0] in ("-h", "--help"):
                continue
            default = a.default
            if isinstance(default, _StubMeta):
                default = "<computed>"
            choices = ",".join(str(c) for c in a.choices) if a.choices else ""
            cells = [g.title, ",".join(a.option_strings), a.dest, type_name(a),
                     repr(default), str(a.nargs or ""), choices]
            print("\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells))


if __name__ == "__main__":
    main()
