"""The summary of what fxmobile did: data records and their renderings."""

from fxmobile.report.records import OutputCheck, PassRecord, Report, Stage, Status

__all__ = ["OutputCheck", "PassRecord", "Report", "Stage", "Status"]
