"""The export stage's side of the pass contract: FX passes on the exported ATen graph.

The unit is ``export.unlifted(program)``: a ``GraphModule`` of ATen operators whose parameters
are attributes, so the FX stage's adapter serves (lint, recompile, shapes from the example
inputs); only the stage the report names differs.
"""

from __future__ import annotations

from fxmobile.passes.stage import FxStage
from fxmobile.report.records import Stage


class ExportStage(FxStage):
    """``FxStage`` for the exported graph: records say ``export``."""

    stage = Stage.EXPORT
