"""Hooks registered while a model is being traced, which the traced graph would drop.

torch.fx calls a traced submodule's ``forward`` directly, so no hook runs during tracing, and a
hook that ``forward`` itself registers and removes (transformers' ``capture_outputs``, which
collects every stage's output through forward hooks to build ``hidden_states``) is gone before
the graph ever runs: the graph would compute something else (an empty ``hidden_states``).
The same holds for hooks such a forward installs on its first call and keeps (transformers
installs its recorders lazily, so fxmobile's reference run on the example inputs installs them):
traced, the module that reads what they collect would read it at trace time, empty.
``watch_hook_registration`` lists every forward hook registered in its block, and with
``refuse`` fails at the first one, so fxmobile takes a route that runs the hooks
(``torch.jit.trace`` calls modules as Python does).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.nn.modules import module as module_mod

_REGISTRARS = ("register_forward_hook", "register_forward_pre_hook")
_GLOBAL = ("register_module_forward_hook", "register_module_forward_pre_hook")


class HookRegistrationError(RuntimeError):
    """A forward hook was registered while the model was being traced."""


@contextlib.contextmanager
def watch_hook_registration(refuse: bool = True) -> Iterator[list[str]]:
    """Yield the list of forward hooks registered in the block (``"register_forward_hook on
    SegformerLayer"``); with ``refuse``, raise ``HookRegistrationError`` at the first one."""
    saved: list[tuple[Any, str, Any]] = []
    registered: list[str] = []

    def watched(owner: str, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def registering(*args: Any, **kwargs: Any) -> Any:
            target = type(args[0]).__name__ if owner == "module" and args else "every module"
            registered.append(f"{name} on {target}")
            if refuse:
                raise HookRegistrationError(
                    f"forward registers a hook ({name} on {target}) while it runs: torch.fx "
                    "does not run hooks, so the graph would drop what it computes"
                )
            return original(*args, **kwargs)

        return registering

    try:
        for name in _REGISTRARS:
            original = getattr(nn.Module, name)
            saved.append((nn.Module, name, original))
            setattr(nn.Module, name, watched("module", name, original))
        for name in _GLOBAL:
            original = getattr(module_mod, name)
            saved.append((module_mod, name, original))
            setattr(module_mod, name, watched("global", name, original))
        yield registered
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
