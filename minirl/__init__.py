"""minirl: RL for LLM reasoning in plain PyTorch. The RL core is this folder; the subsystems are packages
beside it (judge/, sessions/, agentic/, toy/) that import the core, never the other way round.

Modules that moved keep working under their old names (`minirl.policy`, `minirl.session`, ...): importing one
gives the module at its new place, and a name that is in neither place raises an ImportError naming both.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# old module -> the module(s) that now hold its names
MOVED = {
    "minirl.policy": ("minirl.models", "minirl.logprobs"),
    "minirl.reference": ("minirl.models",),
    "minirl.verdict": ("minirl.judge.verdict",),
    "minirl.compile": ("minirl.judge.compile",),
    "minirl.sandbox": ("minirl.judge.sandbox",),
    "minirl.sandbox_host": ("minirl.judge.host",),
    "minirl.cgroup": ("minirl.judge.cgroup",),
    "minirl.session": ("minirl.sessions.client", "minirl.sessions.types"),
    "minirl.session_core": ("minirl.sessions.types",),
    "minirl.serve": ("minirl.sessions.serve",),
    "minirl.env": ("minirl.agentic.env",),
    "minirl.episodes": ("minirl.agentic.episodes",),
    "minirl.overlap": ("minirl.agentic.overlap",),
    "minirl.tiny": ("minirl.toy.tiny",),
    "minirl.smollm2": ("minirl.toy.smollm2",),
}


class _Moved(types.ModuleType):
    """An old module that now lives in several: each name is looked up in the new modules, in order."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for new in MOVED[self.__name__]:
            module = importlib.import_module(new)
            if hasattr(module, name):
                return getattr(module, name)
        raise ImportError(f"{self.__name__}.{name} is gone: {self.__name__} moved to "
                          f"{' and '.join(MOVED[self.__name__])}")


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=importlib.util.find_spec(MOVED[fullname][0]).origin)

    def create_module(self, spec):
        return _Moved(spec.name)

    def get_code(self, fullname):
        """`python -m <old name>` runs the new module (a package's __main__)."""
        spec = importlib.util.find_spec(MOVED[fullname][0])
        if spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(spec.name + ".__main__")
        return spec.loader.get_code(spec.name)

    def exec_module(self, module):
        new = MOVED[module.__name__]
        if len(new) == 1:  # the old name is the new module itself, so patching one patches the other
            sys.modules[module.__name__] = importlib.import_module(new[0])


sys.meta_path.append(_MovedFinder())
