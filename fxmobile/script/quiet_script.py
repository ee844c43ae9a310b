"""``torch.jit.script`` without the warnings torch gives about itself, and without the half-made
types a failed attempt leaves behind."""

from __future__ import annotations

import warnings

import torch


def quietly_script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` without its deprecation warning: fxmobile needs TorchScript.

    The result shares compiled types (and so method graphs) with every other scripted
    instance of the same classes: never rewrite its graphs in place before freezing, which
    gives the frozen module types of its own.
    """
    store = torch.jit._recursive.concrete_type_store
    before = {cls: list(types) for cls, types in store.type_store.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script. is deprecated")
        # about how the TorchScript frontend reads some torchvision __init__ annotations
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support")
        try:
            return torch.jit.script(module)
        except Exception:
            # torch keeps the types this attempt made, their methods half defined: scripting
            # an equal module again then fails with "Can't redefine method: forward" instead
            # of the real error (found by the fuzzer). Forget the ones it did not finish.
            for cls, types in store.type_store.items():
                kept = before.get(cls, [])
                store.type_store[cls] = [
                    t for t in types if t in kept or t in store.methods_compiled
                ]
            raise
