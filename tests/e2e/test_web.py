"""``fleet web`` in a real browser: Debian's Chromium, headless, driven by Playwright.

Nothing downloads a browser: Playwright drives ``/usr/bin/chromium`` (``scripts/system-packages``
installs it). The fleet is the real CLI with a real supervisor and real children; the page is
the real server ``fleet web`` starts. Screenshots of each page are saved under the test's tmp
directory (``docs/images/`` holds two of them).
"""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Fleet, running_fleet

pytestmark = [pytest.mark.slow, pytest.mark.needs("chromium")]

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: How long a live fragment may take to show a change (it is re-rendered every 0.4 s).
LIVE = 3_000
#: How long an action's flash may take: what it says, not how soon (the page after the
#: redirect renders a peek; under a full suite on two cores that once took over 5 s).
ACTED = 30_000

WORKS = """
turns:
  - steps:
      - say: "Looking around"
      - wait: 1.5
      - tool: read
        args: {path: README.md}
      - tool: ask_parent
        args: {question: "Which database?"}
      - reply: "Using {{last}}"
"""
WRITER = """
turns:
  - steps:
      - tool: edit
        args: {path: src/app.py, old_text: "return 42", new_text: "return 43"}
      - tool: write
        args: {path: NOTES.md, content: "written by the worker\\n"}
      - reply: "## Summary\\nchanged app.py, added NOTES.md"
"""
#: A report that would run script, load an image and style text, were it ever parsed as HTML.
REPORT_HTML = (
    "<script>document.title='pwned';window.pwned=1</script>"
    '<img src=x onerror="window.pwned=2"><b id=bold>bold</b>'
)
HOSTILE = f"turns:\n  - steps:\n      - reply: {json.dumps(REPORT_HTML)}\n"


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[Fleet, Any, Path]]:
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - the test extra

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with running_fleet(tmp_path) as fleet:
        try:
            url = fleet.json("web")["url"]
            with sync_playwright() as playwright:
                context = playwright.chromium.launch_persistent_context(
                    str(tmp_path / "chromium-profile"),
                    executable_path=CHROMIUM,
                    args=FLAGS,
                    headless=True,
                    viewport={"width": 1280, "height": 800},
                )
                try:
                    page = context.new_page()
                    page.set_default_timeout(30_000)
                    page.goto(url)
                    yield fleet, page, shots
                finally:
                    context.close()
        finally:
            fleet.run("web", "--stop")


def _row(page: Any, key: str) -> Any:
    return page.locator(f'#fleet-rows tr[data-key="{key}"]')


def test_the_page_follows_a_child_and_answers_its_question(web):
    from playwright.sync_api import expect  # noqa: PLC0415

    fleet, page, shots = web
    expect(page.locator("h1")).to_have_text("Fleet")
    assert page.url.endswith("/")  # the one-time token is gone from the address bar
    model = fleet.script("works", WORKS)
    spawned = fleet.json("spawn", "--model", model, "pick a database")
    began = time.monotonic()
    [agent] = spawned["agents"]
    row = _row(page, agent["key"])
    expect(row).to_be_visible(timeout=LIVE)
    shown_after = time.monotonic() - began
    assert shown_after < LIVE / 1000, shown_after
    # It updates as the child works, without a reload.
    expect(row.locator(".state")).to_have_text("working", timeout=LIVE)
    page.screenshot(path=str(shots / "fleet.png"), full_page=True)
    expect(row.locator(".state")).to_have_text("waiting", timeout=30_000)
    expect(row.locator(".activity")).to_contain_text("asks: Which database?")

    page.click("text=Questions")
    question = page.locator('section.question[data-question="q1"]')
    expect(question).to_contain_text("Which database?")
    page.screenshot(path=str(shots / "questions.png"), full_page=True)
    question.locator('input[name="text"]').fill("postgres")
    question.locator("button").click()
    expect(page.locator(".flash.ok")).to_contain_text("answered q1 (a1)", timeout=ACTED)

    origin = page.url.rsplit("/", 1)[0]
    page.goto(f"{origin}/child/a1")
    expect(page.locator(".report-text").first).to_have_text("Using postgres", timeout=30_000)
    expect(page.locator("#child-live .state")).not_to_have_text("waiting")
    page.reload()  # the whole report (fleet report) is read when the page loads
    expect(page.locator(".full-report pre")).to_have_text("Using postgres")
    page.screenshot(path=str(shots / "child.png"), full_page=True)
    for name in ("paper", "usage"):
        page.goto(f"{origin}/{name}")
        expect(page.locator("h1").first).to_be_visible()
        if name == "usage":  # drawn from the journal's spend records, not the page's samples
            expect(page.locator("svg.chart.line polyline")).to_be_visible()
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)


def test_the_page_stops_a_worker_and_reviews_its_diff_file_by_file(web):
    from playwright.sync_api import expect  # noqa: PLC0415

    fleet, page, shots = web
    model = fleet.script("writer", WRITER)
    fleet.json("spawn", "--agent", "worker", "--model", model, "bump the answer")
    [note] = fleet.json("wait", "a1", "--timeout", "30")["settled"]
    assert note["error"] == ""
    page.goto(page.url.rstrip("/") + "/child/a1")
    # Its tool calls are in its timeline, though no page looked while it made them.
    activities = page.locator("ol.timeline li.kind-activity")
    expect(activities.filter(has_text="edit")).to_have_count(1)
    expect(activities.filter(has_text="write")).to_have_count(1)
    page.locator("form.act", has=page.locator('button[value="stop"]')).locator("button").click()
    expect(page.locator(".flash.ok")).to_contain_text("a1 stopped", timeout=60_000)
    app = fleet.repo / "src" / "app.py"
    notes = fleet.repo / "NOTES.md"
    assert app.read_text() == "def main():\n    return 43\n"
    assert notes.exists()
    files = page.locator("article.file")
    expect(files).to_have_count(2)
    app_file = page.locator(f'article.file[data-path="{app}"]')
    expect(app_file.locator("pre.diff")).to_contain_text("+    return 43")
    assert app_file.locator("pre.diff span").count() > 0  # highlighted, as spans
    page.screenshot(path=str(shots / "diff.png"), full_page=True)
    app_file.locator("button", has_text="Revert this file").click()
    expect(page.locator(".flash.ok")).to_contain_text("reverted", timeout=ACTED)
    assert app.read_text() == "def main():\n    return 42\n"
    page.locator(f'article.file[data-path="{notes}"]').locator(
        "button", has_text="Accept this file"
    ).click()
    expect(page.locator(".flash.ok")).to_contain_text("accepted", timeout=ACTED)
    assert notes.read_text() == "written by the worker\n"
    expect(page.locator("article.file")).to_have_count(0)
    assert fleet.json("diff")["files"] == []


def test_a_hostile_report_is_shown_as_text_and_runs_nothing(web):
    from playwright.sync_api import expect  # noqa: PLC0415

    fleet, page, shots = web
    model = fleet.script("hostile", HOSTILE)
    fleet.json("spawn", "--model", model, "say something")
    fleet.json("wait", "a1", "--timeout", "30")
    page.goto(page.url.rstrip("/") + "/child/a1")
    report = page.locator(".report-text").first
    expect(report).to_contain_text("<script>document.title='pwned'")
    expect(report).to_contain_text("<b id=bold>bold</b>")
    # Let the live fragment re-render it at least once, then look for any effect.
    page.wait_for_timeout(1500)
    assert page.evaluate("window.pwned") is None
    assert "pwned" not in page.title()
    assert page.locator("#bold").count() == 0
    assert page.locator("img[src=x]").count() == 0
    page.screenshot(path=str(shots / "hostile.png"), full_page=True)


HOLDS = """
turns:
  - steps:
      - tool: edit
        args: {path: src/app.py, old_text: "return 42", new_text: "return 43"}
      - tool: write
        args: {path: .mcp.json, content: "{\\"mcpServers\\": {}}\\n"}
      - reply: "## Summary\\nbumped the answer, added an MCP config"
"""


def test_a_held_change_lands_from_the_page_one_named_file_at_a_time(web):
    from playwright.sync_api import expect  # noqa: PLC0415

    fleet, page, shots = web
    model = fleet.script("holds", HOLDS)
    fleet.json("spawn", "--agent", "worker", "--model", model, "bump the answer")
    fleet.json("wait", "a1", "--timeout", "30")
    page.goto(page.url.rstrip("/") + "/child/a1")
    app = fleet.repo / "src" / "app.py"
    config = fleet.repo / ".mcp.json"
    # The live worker's change, before anything lands: shown, marked, not yet appliable.
    expect(page.locator("article.file.pending")).to_have_count(2)
    held = page.locator(f'article.file[data-path="{config}"]')
    expect(held.locator(".status-held")).to_contain_text("held:")
    assert page.locator('form[action="/act/apply"]').count() == 0
    page.locator("button", has_text="Stop and hold its change").click()
    expect(page.locator(".flash.ok")).to_contain_text("a1 stopped", timeout=60_000)
    assert app.read_text() == "def main():\n    return 42\n"  # held: nothing landed
    assert not config.exists()
    page.screenshot(path=str(shots / "held.png"), full_page=True)
    # One button per file, none for everything.
    expect(page.locator('form[action="/act/apply"]')).to_have_count(2)
    page.locator(f'article.file[data-path="{app}"]').locator(
        "button", has_text="Apply this file"
    ).click()
    expect(page.locator(".flash.ok")).to_contain_text("applied: src/app.py", timeout=ACTED)
    assert app.read_text() == "def main():\n    return 43\n"
    assert not config.exists()
    page.locator(f'article.file[data-path="{config}"]').locator(
        "button", has_text="Apply this held file"
    ).click()
    expect(page.locator(".flash.ok")).to_contain_text(".mcp.json", timeout=ACTED)
    assert config.read_text() == '{"mcpServers": {}}\n'
