"""Reference runtimes: real torch releases that run fxmobile's files as apps do.

See the README's "Reference runtimes". ``make runtimes`` installs them under ``.runtimes/``.
"""

from fxmobile.runtime.install import RUNTIMES, RuntimeSpec

__all__ = ["RUNTIMES", "RuntimeSpec"]
