"""torch's own TorchScript passes that fxmobile calls.

torch's type stubs omit most ``torch._C._jit_pass_*`` bindings, so they are reached through this
one ``Any``-typed handle instead of scattering ``type: ignore`` comments.
"""

from typing import Any

import torch

jit: Any = torch._C
