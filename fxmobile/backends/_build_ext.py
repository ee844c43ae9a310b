"""setuptools ``build_ext`` command that compiles ``fxmobile._C`` against the installed torch.

Why: ``pyproject.toml`` can declare the extension (``[tool.setuptools] ext-modules``) but not
torch's include and library paths, which depend on where torch is installed. This command adds
exactly what ``torch.utils.cpp_extension.CppExtension`` would (torch's include paths, library
paths, the ``c10``/``torch``/``torch_cpu``/``torch_python`` libraries, C++ language) and
inherits ``BuildExtension`` for the compiler flags (C++ standard, ``TORCH_EXTENSION_NAME``,
ABI checks) and the ninja backend. It is named in ``pyproject.toml`` as ``cmdclass``, so the
ordinary ``pip install --no-build-isolation -e .`` builds the library, in place for an editable
install. It imports nothing from fxmobile.
"""

from __future__ import annotations

import os
import shutil
import sys

from torch.utils import cpp_extension

# Libraries CppExtension links (torch_python too: the module is a CPython extension).
_TORCH_LIBRARIES = ("c10", "torch", "torch_cpu", "torch_python")


class BuildExtension(cpp_extension.BuildExtension):
    """``torch.utils.cpp_extension.BuildExtension`` plus what ``CppExtension`` adds."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        # The `ninja` build requirement installs its binary next to this interpreter, which
        # need not be on PATH (the Makefile runs .venv/bin/python without activating the venv).
        bin_dir = os.path.dirname(sys.executable)
        path = os.environ.get("PATH", "")
        if bin_dir not in path.split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
        # Ninja's default is #CPUs + 2 parallel compilers; each one compiling torch headers
        # takes about 1 GB, so default to one per CPU unless the caller chose (MAX_JOBS).
        os.environ.setdefault("MAX_JOBS", str(max(1, os.cpu_count() or 1)))
        super().__init__(*args, **kwargs)

    def build_extensions(self) -> None:
        compiler = getattr(self.compiler, "compiler_so", None) or ["c++"]
        if shutil.which(compiler[0]) is None:
            raise RuntimeError(
                f"building fxmobile._C needs a C++ compiler, and {compiler[0]!r} was not found; "
                "install g++ (or clang++), or point CC/CXX at one, then run `make install` again"
            )
        for ext in self.extensions:
            _add_unique(ext.include_dirs, cpp_extension.include_paths())
            _add_unique(ext.library_dirs, cpp_extension.library_paths())
            _add_unique(ext.libraries, _TORCH_LIBRARIES)
            ext.language = "c++"
        super().build_extensions()

    def copy_file(
        self, infile: str, outfile: str, *args: object, **kwargs: object
    ) -> tuple[str, bool]:
        """Put the built library in place atomically (an editable install copies it into the
        source tree). Copying over the old file rewrites pages that running processes, a test
        run say, have mapped, and crashes them; a rename leaves them the old file."""
        partial = f"{outfile}.partial"
        _, copied = super().copy_file(infile, partial, *args, **kwargs)
        os.replace(partial, outfile)
        return outfile, copied


def _add_unique(target: list[str], values: list[str] | tuple[str, ...]) -> None:
    target.extend(v for v in values if v not in target)
