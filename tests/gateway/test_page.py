"""The web page, end to end in a real headless browser (Debian's chromium via Playwright).

The page is served by the adapter of a whole in-process service; screenshots
are saved under `test-artifacts/` at the repository root.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (`make install` installs it)"
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Harness]:
    """The service as `make run` serves it: the example agents on the built-in demo model."""
    async with Harness.start(
        ROOT / "agents", None, tools_dir=ROOT / "tools", data_dir=tmp_path / "data"
    ) as harness:
        yield harness


@pytest.fixture
async def quick_demo(tmp_path: Path) -> AsyncIterator[Harness]:
    """The same, with the demo model streaming without pauses."""
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        data_dir=tmp_path / "data",
        demo_delay_ms=0,
    ) as harness:
        yield harness


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    await page.goto(url)
    await page.wait_for_selector("#agent option", state="attached")
    return page, errors


STREAMING = """() => {
  const run = document.querySelector('.run:last-of-type');
  const answer = run && run.querySelector('.content');
  return !!answer && answer.textContent.length > 0 && run.dataset.status === 'running';
}"""


async def test_chat_with_a_frontend_tool_in_the_browser(browser: Browser, demo: Harness) -> None:
    page, errors = await open_page(browser, demo.http_url)
    await page.select_option("#agent", "demo_frontend")
    await page.fill("#message", "Book a table for two tonight")
    await page.click("#send")

    # The model calls the frontend tool: its card shows the streamed arguments and a form.
    tool = page.locator('.card.tool[data-name="confirm_dialog"]')
    await tool.locator(".tool-form").wait_for()
    assert '"question"' in await tool.locator("pre.args").inner_text()
    assert await page.locator("#cancel").is_enabled()
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "gateway-page-waiting-tool.png"), full_page=True)

    # Answering it (Submit) lets the run go on: the answer streams, then the run completes.
    option = tool.locator(".tool-form .options button").first
    choice = await option.inner_text()
    await option.click()
    await page.wait_for_function(STREAMING, polling="raf")
    await page.locator('.run[data-status="complete"]').wait_for()
    assert choice in await tool.locator("pre.result").inner_text()
    assert await page.locator(".tool-form").count() == 0
    assert "completed" in await page.locator(".run .run-status").inner_text()
    await page.screenshot(path=str(ARTIFACTS / "gateway-page-frontend-tool.png"), full_page=True)

    # The chat is in the history, and opening it replays the same run from GetChat.
    live_answer = await page.locator(".run .content").last.inner_text()
    await page.click("#new-chat")
    assert await page.locator(".run").count() == 0
    await page.locator("#chats li button").first.click()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator(".run .content").last.inner_text() == live_answer
    assert await page.locator('.card.tool[data-name="confirm_dialog"] pre.result').count() == 1
    assert errors == []


async def test_streamed_reasoning_and_answer(browser: Browser, demo: Harness) -> None:
    page, errors = await open_page(browser, demo.http_url)
    await page.select_option("#agent", "demo_oneshot")
    await page.fill("#message", "Hello from the browser")
    await page.press("#message", "Enter")
    await page.wait_for_function(STREAMING, polling="raf")
    await page.locator('.run[data-status="complete"]').wait_for()
    assert "Hello from the browser" in await page.locator(".run .content").inner_text()
    assert "The user wrote" in (await page.locator(".run .reasoning-text").text_content() or "")
    assert await page.locator(".user").inner_text() == "Hello from the browser"
    assert errors == []


RECORD_TASK_STATUSES = """
window.taskStatuses = new Set();
new MutationObserver((changes) => {
  for (const change of changes) {
    if (change.target.matches && change.target.matches('.plan li')) {
      // Every value the attribute took: the old value of each change, and the last one.
      if (change.oldValue) window.taskStatuses.add(change.oldValue);
      window.taskStatuses.add(change.target.dataset.status);
    }
  }
}).observe(document, {
  subtree: true, attributes: true, attributeOldValue: true, attributeFilter: ['data-status'],
});
"""


async def test_plan_tasks_and_actions_live(browser: Browser, quick_demo: Harness) -> None:
    page = await browser.new_page()
    await page.add_init_script(RECORD_TASK_STATUSES)
    await page.goto(quick_demo.http_url)
    await page.wait_for_selector("#agent option", state="attached")
    await page.select_option("#agent", "demo_plan")
    await page.fill("#message", "Time and weather in Paris")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    tasks = page.locator(".plan li")
    assert await tasks.count() == 2
    statuses = await page.evaluate("[...window.taskStatuses]")
    assert {"TASK_STATUS_IN_PROGRESS", "TASK_STATUS_COMPLETED"} <= set(statuses)
    assert await page.locator('.plan li[data-status="TASK_STATUS_COMPLETED"]').count() == 2
    assert await page.locator(".task-output").count() == 2  # each task's own output
    assert await page.locator('.card.tool[data-name="city_datetime"] pre.result').count() >= 1

    await page.click("#new-chat")
    await page.select_option("#agent", "demo_action")
    await page.fill("#message", "Make it dark")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator('.card.action[data-name="switch_theme"]').count() == 1
    assert await page.evaluate("document.documentElement.dataset.theme") == "dark"


async def test_a_dropped_stream_resumes_from_the_last_event(
    browser: Browser, gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("one "), Gate(gate), content("two"), finish("stop"), DONE])
    page, errors = await open_page(browser, gateway.http_url)
    await page.select_option("#agent", "plain")
    await page.fill("#message", "Keep going")
    await page.click("#send")
    await page.wait_for_function(STREAMING, polling="raf")
    assert gateway.app.http is not None
    async with page.expect_request("**/api/runs/*/events") as attach:
        for stream in list(gateway.app.http.streams):  # the network drops the connection
            assert stream.request.transport is not None
            stream.request.transport.abort()
    assert (await attach.value).headers["last-event-id"] == "5"  # content.delta "one "
    gate.set()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator(".run .content").inner_text() == "one two"  # no gap, no repeat
    assert errors == ["Failed to load resource: net::ERR_INCOMPLETE_CHUNKED_ENCODING"]  # the drop


async def test_cancel_a_run_from_the_page(
    browser: Browser, gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Working on it"), Gate(asyncio.Event()), DONE])
    page, errors = await open_page(browser, gateway.http_url)
    await page.select_option("#agent", "plain")
    await page.fill("#message", "Take your time")
    await page.click("#send")
    await page.wait_for_function(STREAMING, polling="raf")
    await page.click("#cancel")
    await page.locator('.run[data-status="cancel"]').wait_for()
    assert "cancelled (cancel)" in await page.locator(".run .run-status").inner_text()
    assert await page.locator("#send").is_enabled()

    # The next message continues the same chat.
    provider.enqueue([content("Done."), finish("stop"), DONE])
    await page.fill("#message", "Now quickly")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    runs = list(gateway.app.frontdoor.runs.values())
    assert len({run.chat_id for run in runs}) == 1 and len(runs) == 2
    assert errors == []


async def test_a_structured_question_in_the_browser(browser: Browser, quick_demo: Harness) -> None:
    page, errors = await open_page(browser, quick_demo.http_url)
    await page.select_option("#agent", "demo_question")
    await page.fill("#message", "A trip in spring")
    await page.click("#send")

    # Typed options: a checkbox each (several may be chosen), the recommended one
    # marked and preselected, the descriptions shown, and a field for one's own words.
    form = page.locator(".question-form")
    await form.wait_for()
    assert await form.locator(".choice-label").all_inner_texts() == ["Paris", "Rome", "Oslo"]
    assert await form.locator('input[type="checkbox"]').count() == 3
    assert await form.locator('input[value="Paris"]').is_checked()
    assert not await form.locator('input[value="Rome"]').is_checked()
    assert await form.locator(".recommended").count() == 1
    assert "Ruins and long lunches" in await form.inner_text()
    await form.locator('input[value="Rome"]').check()
    await form.locator('input[name="answer"]').fill("Lisbon")
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "gateway-page-question.png"), full_page=True)
    await form.locator('button[type="submit"]').click()
    await page.locator('.run[data-status="complete"]').wait_for()
    result = page.locator('.card.tool[data-name="ask_user"] pre.result')
    assert json.loads(await result.inner_text()) == ["Paris", "Rome", "Lisbon"]
    assert await page.locator(".question-form").count() == 0
    assert 'answer: [ "Paris", "Rome", "Lisbon" ]' in await page.locator(".card.ask").inner_text()
    assert errors == []


async def test_a_subagents_run_nested_in_its_callers_card(
    browser: Browser, quick_demo: Harness
) -> None:
    page, errors = await open_page(browser, quick_demo.http_url)
    await page.select_option("#agent", "demo_team")
    await page.fill("#message", "Weather in Paris tomorrow?")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    call = page.locator('.run > .run-body > .card.tool[data-name="demo_researcher"]')
    nested = call.locator(".nested-run")
    assert await nested.locator(".card.tool").evaluate_all(
        "cards => cards.map(c => c.dataset.name)"
    ) == ["city_datetime", "mock_city_weather"]
    assert await nested.locator(".content").count() == 1
    assert await call.locator(":scope > pre.result").count() == 1  # after its nested run
    assert await page.locator(".run > .run-body > .content").count() == 1
    await page.screenshot(path=str(ARTIFACTS / "gateway-page-subagent.png"), full_page=True)

    # Replayed from history, the nested run sits in the same place.
    await page.click("#new-chat")
    await page.locator("#chats li button").first.click()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await nested.locator(".card.tool").count() == 2
    assert await nested.locator(".content").count() == 1
    assert errors == []
