"""Reference-runtime tests: the ``runtime`` marker, one child process per runtime per session,
and a header and summary line saying whether they ran.

``@pytest.mark.runtime("1.13.1")`` (or ``runtime()`` for every reference runtime) skips the test
with the reason, visible in pytest's summary, when ``make runtimes`` has not installed it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fxmobile.runtime import RUNTIMES, RuntimeProcess, installed
from fxmobile.runtime.install import default_dir

_SKIPPED: dict[str, int] = {}

# parametrize("version", EACH_RUNTIME): one case per runtime, each skipped on its own
EACH_RUNTIME = [pytest.param(v, marks=pytest.mark.runtime(v), id=v) for v in RUNTIMES]


def _missing() -> list[str]:
    return [version for version in RUNTIMES if not installed(version)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "runtime(*versions): needs the reference runtimes (all when none given) that "
        "`make runtimes` installs; skipped, with the reason, when they are missing",
    )


def pytest_report_header(config: pytest.Config) -> str:
    missing = _missing()
    if not missing:
        return f"reference runtimes: {', '.join(RUNTIMES)} in {default_dir()}"
    return (
        f"reference runtimes: {', '.join(missing)} not installed in {default_dir()}: "
        f"their tests will be SKIPPED (`make runtimes` installs them)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = set(_missing())
    for item in items:
        marker = item.get_closest_marker("runtime")
        if marker is None:
            continue
        wanted = [str(v) for v in marker.args] or list(RUNTIMES)
        absent = [v for v in wanted if v in missing]
        if absent:
            reason = (
                f"reference runtime torch {', '.join(absent)} not installed: run `make runtimes`"
            )
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "make runtimes" in str(report.longrepr):
        _SKIPPED[report.nodeid] = 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED:
        terminalreporter.write_line(
            f"SKIPPED {len(_SKIPPED)} reference-runtime tests: {', '.join(_missing())} not "
            f"installed in {default_dir()}; run `make runtimes` to run them",
            yellow=True,
            bold=True,
        )


@pytest.fixture(scope="session")
def runtime() -> Iterator[Callable[[str], RuntimeProcess]]:
    """``runtime("2.12.1")``: that runtime's process, started on first use, shared by the
    session's tests (a start takes seconds), stopped at the end."""
    started: dict[str, RuntimeProcess] = {}

    def get(version: str) -> RuntimeProcess:
        process = started.get(version)
        if process is None or process._closed:
            process = started[version] = RuntimeProcess(version, threads=2)
        return process

    yield get
    for process in started.values():
        process.close()
