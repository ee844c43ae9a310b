"""The summary of what fxmobile did: data records and their renderings."""

from fxmobile.report.records import (
    FileFacts,
    HookRecord,
    OutputCheck,
    PassRecord,
    PortableOp,
    ProgramFacts,
    Report,
    Stage,
    Status,
)

__all__ = [
    "FileFacts",
    "HookRecord",
    "OutputCheck",
    "PassRecord",
    "PortableOp",
    "ProgramFacts",
    "Report",
    "Stage",
    "Status",
]
