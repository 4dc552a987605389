"""A regression or a broken strategy planted into every Python process a test starts: the text of a
``sitecustomize.py`` (put on PYTHONPATH) whose import hook patches one module as it is loaded
(tests/test_slow_paths.py, tests/test_reproduce_planted.py)."""

HOOK = '''

import importlib.abc as _abc, importlib.machinery as _machinery, sys as _sys


class _Finder(_abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            plant(module)

        spec.loader.exec_module = exec_module
        return spec


_sys.meta_path.insert(0, _Finder())
'''


def sitecustomize(body: str) -> str:
    """``body`` (defining ``TARGET``, the module's name, and ``plant(module)``), then the hook that calls ``plant``
    on ``TARGET`` once it is loaded, in every process that starts with it."""
    return body.rstrip("\n") + "\n" + HOOK
