"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a child process of its own (its globals, event loop, OpenTelemetry providers
and gc settings stay its own), in a fresh directory holding what a reader of the docs has:

- ``ASYNCSUBS_BASE_URL`` and ``ASYNCSUBS_TOKEN``: a fake admin server (``asyncsubs.testing``)
  with the stores "acme" and "globex", the rate limits ``asyncsubs fake-server`` enforces and a
  few dozen records per resource, the token being acme's;
- ``stores.toml`` naming both stores, their tokens in ``ACME_SUBS_TOKEN`` and
  ``GLOBEX_SUBS_TOKEN`` (as docs/cli.md's example names them);
- ``WEBHOOK_SECRET``, and ``PORT=0`` for a receiver that listens on ``PORT``;
- ``REDIS_URL``: the suite's redis-server, for a block that names Redis;
- the OTLP exporters (``opentelemetry-exporter-otlp``, not a dependency of the project): small
  stand-ins of the same module paths and class names that keep what they are given in memory,
  on ``PYTHONPATH``.

A block that defines ``test_*`` functions is a reader's test file: it runs under pytest, and
must pass. A block that cannot run must say so in the doc, on the line before its fence:
``<!-- snippet: not runnable: REASON -->``; nothing else is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from redis_fixtures import redis_server_fixture  # noqa: F401 - registers ``redis_server``

from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: How long one block may take (the slowest, a dlt load, takes a few seconds).
TIMEOUT = 120.0
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)$")
_NOT_RUNNABLE = re.compile(r"<!--\s*snippet:\s*not runnable:\s*(?P<reason>.*?)\s*-->")
_TEST_FUNCTION = re.compile(r"^(async\s+)?def test_", re.MULTILINE)


@attrs.frozen
class Snippet:
    doc: Path
    line: int  # of the opening fence, 1-based
    code: str
    not_runnable: str | None  # the reason the doc gives, if it marks the block

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def is_test_file(self) -> bool:
        return _TEST_FUNCTION.search(self.code) is not None


def python_blocks(doc: Path) -> Iterator[Snippet]:
    """The ```python blocks of a Markdown file, indented ones (in a list item) included."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, info = fence["indent"], fence["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if info.split(" ", 1)[0] in ("python", "py"):
            body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
            before = lines[i - 1] if i > 0 else ""
            mark = _NOT_RUNNABLE.search(before)
            yield Snippet(doc, i + 1, body + "\n", mark["reason"] if mark else None)
        i = end + 1


SNIPPETS = [snippet for doc in DOCS for snippet in python_blocks(doc)]

# Stand-ins for opentelemetry-exporter-otlp: same modules, same classes, nothing sent.
_OTLP_STUBS = {
    "metric_exporter.py": """
        from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

        class OTLPMetricExporter(MetricExporter):
            def __init__(self, *args, **kwargs):
                super().__init__()
                self.exported = []

            def export(self, metrics_data, timeout_millis=10_000, **kwargs):
                self.exported.append(metrics_data)
                return MetricExportResult.SUCCESS

            def force_flush(self, timeout_millis=10_000):
                return True

            def shutdown(self, timeout_millis=30_000, **kwargs):
                pass
    """,
    "trace_exporter.py": """
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        class OTLPSpanExporter(InMemorySpanExporter):
            def __init__(self, *args, **kwargs):
                super().__init__()
    """,
}


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeAdminServer]:
    """The stores the snippets read: few records, so that a pull at the default heavy rate
    (1 request/s) takes a page or two."""
    stores = [FakeStoreConfig("acme", records=60), FakeStoreConfig("globex", records=40)]
    with serve_in_thread(stores=stores, max_page_size=250) as server:
        yield server


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stubs")
    package = root / "opentelemetry" / "exporter" / "otlp" / "proto" / "grpc"
    package.mkdir(parents=True)
    for name, source in _OTLP_STUBS.items():
        (package / name).write_text(textwrap.dedent(source))
    return root


def reader_environment(
    server: FakeAdminServer, stubs: Path, home: Path, redis_url: str | None
) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(
        ASYNCSUBS_BASE_URL=server.base_url,
        ASYNCSUBS_TOKEN=server.store("acme").token,
        ACME_SUBS_TOKEN=server.store("acme").token,
        GLOBEX_SUBS_TOKEN=server.store("globex").token,
        WEBHOOK_SECRET="snippet-test-secret",
        PORT="0",
        HOME=str(home),
        DLT_DATA_DIR=str(home / ".dlt"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(stubs), env.get("PYTHONPATH")])),
    )
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


def write_stores_toml(directory: Path, server: FakeAdminServer) -> None:
    (directory / "stores.toml").write_text(
        textwrap.dedent(f"""\
            [defaults]
            page_size = {server.max_page_size}

            [stores.acme]
            base_url = "{server.base_url}"
            token_env = "ACME_SUBS_TOKEN"

            [stores.globex]
            base_url = "{server.base_url}"
            token_env = "GLOBEX_SUBS_TOKEN"
        """)
    )


def test_the_docs_have_snippets() -> None:
    """The extraction finds the blocks (an empty list would pass every test below)."""
    found = {snippet.doc.name for snippet in SNIPPETS}
    assert {"README.md", "cli.md", "dlt.md", "webhooks.md"} <= found
    assert len(SNIPPETS) >= 10


def test_extraction_reads_indented_blocks_and_marks(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n```python\nprint(1)\n```\n\n- item\n\n  ```python\n  x = 1\n  print(x)\n  ```\n"
        "\n<!-- snippet: not runnable: needs a real store -->\n```python\nboom()\n```\n"
        "```bash\necho no\n```\n"
    )
    blocks = list(python_blocks(doc))
    assert [(b.line, b.code, b.not_runnable) for b in blocks] == [
        (3, "print(1)\n", None),
        (9, "x = 1\nprint(x)\n", None),
        (15, "boom()\n", "needs a real store"),
    ]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda snippet: snippet.id)
def test_snippet_runs(
    snippet: Snippet,
    fake_server: FakeAdminServer,
    stubs: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if snippet.not_runnable is not None:
        assert snippet.not_runnable, f"{snippet.id}: a not-runnable mark must give its reason"
        pytest.skip(f"marked not runnable: {snippet.not_runnable}")
    redis_url = None
    if "redis" in snippet.code.lower():
        redis_url = request.getfixturevalue("redis_server").url
    work = tmp_path / "work"
    work.mkdir()
    write_stores_toml(work, fake_server)
    env = reader_environment(fake_server, stubs, tmp_path / "home", redis_url)
    if snippet.is_test_file:
        script = work / "test_snippet.py"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
    else:
        script = work / "snippet.py"
        command = [sys.executable, script.name]
    script.write_text(snippet.code)
    result = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert result.returncode == 0, (
        f"{snippet.id} failed (exit {result.returncode}):\n{snippet.code}\n"
        f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    if snippet.is_test_file:
        assert " passed" in result.stdout, result.stdout
        assert "failed" not in result.stdout, result.stdout
