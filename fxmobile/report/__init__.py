"""The summary of what fxmobile did: data records and their renderings."""

from fxmobile.report.records import HookRecord, OutputCheck, PassRecord, Report, Stage, Status

__all__ = ["HookRecord", "OutputCheck", "PassRecord", "Report", "Stage", "Status"]
