"""The web page, end to end in a real headless browser (Debian's chromium via Playwright).

The page is served by the adapter of a whole in-process service; screenshots are saved
under `test-artifacts/` at the repository root, named after the test and the width.
One browser serves the whole module (each test gets its own context); the tests run on
the module's event loop, so the service fixtures they use are defined here on it too.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agw.v1 import gateway_pb2 as gw
from playwright.async_api import Browser, BrowserContext, Locator, Page, Route, async_playwright

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools

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

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
WIDTHS = [pytest.param(PHONE, id="phone"), pytest.param(DESKTOP, id="desktop")]

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium (`make install` installs it)"
    ),
    pytest.mark.asyncio(loop_scope="module"),
]
module_fixture = pytest_asyncio.fixture(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


@module_fixture
async def contexts(browser: Browser) -> AsyncIterator[list[BrowserContext]]:
    """The browser contexts a test opened, closed after it."""
    opened: list[BrowserContext] = []
    yield opened
    for context in opened:
        await context.close()


@module_fixture
async def provider() -> AsyncIterator[LoopbackProvider]:
    async with LoopbackProvider() as fake:
        yield fake


@module_fixture
async def gateway(agents_dir: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with Harness.start(agents_dir, provider) as harness:
        yield harness


@module_fixture
async def demo(tmp_path: Path) -> AsyncIterator[Harness]:
    """The service as `make run` serves it: the example agents on the built-in demo model."""
    async with Harness.start(
        ROOT / "agents", None, tools_dir=ROOT / "tools", data_dir=tmp_path / "data"
    ) as harness:
        yield harness


@module_fixture
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


OpenPage = Callable[..., Awaitable[tuple[Page, list[str]]]]


@module_fixture
async def open_page(browser: Browser, contexts: list[BrowserContext]) -> OpenPage:
    """Opens the page at `url` in a context of its own: (page, errors it logged)."""

    async def open_(url: str, viewport: dict[str, int] = DESKTOP) -> tuple[Page, list[str]]:
        context = await browser.new_context(viewport=viewport)  # type: ignore[arg-type]
        contexts.append(context)
        return await _goto(await context.new_page(), url)

    return open_


def shot(name: str, viewport: dict[str, int]) -> str:
    """The path of a screenshot of test `name` at the viewport's width."""
    ARTIFACTS.mkdir(exist_ok=True)
    return str(ARTIFACTS / f"page-{name}-{viewport['width']}.png")


async def _goto(page: Page, url: str) -> tuple[Page, list[str]]:
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


TOOL_VIEW = ".card.tool[data-name='confirm_dialog'] iframe.tool-view"
#: What a run's status line says while it waits for the user.
WAITING = "Waiting for your answer"


async def result_of(card: Locator) -> Any:
    """A tool card's result as the page shows it: its key/value table as a dict of texts,
    else the JSON (or text) of its block."""
    result = card.locator(":scope > .result")
    await result.wait_for(state="attached")
    if await result.evaluate("e => e.tagName") == "TABLE":
        rows = await result.locator("tr").evaluate_all(
            "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])"
        )
        return dict(rows)
    text = await result.text_content() or ""
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_a_frontend_tool_answered_in_its_view(
    open_page: OpenPage, demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(demo.http_url, viewport)
    await page.select_option("#agent", "demo_frontend")
    await page.fill("#message", "Book a table for two tonight")
    await page.click("#send")

    # The tool's own view, sandboxed to scripts only: no `{}` answer box, no address, and
    # the question once (the arguments are folded away under the view).
    tool = page.locator('.card.tool[data-name="confirm_dialog"]')
    frame_el = page.locator(TOOL_VIEW)
    await frame_el.wait_for()
    assert await frame_el.get_attribute("sandbox") == "allow-scripts"
    view = page.frame_locator(TOOL_VIEW)
    await view.locator("#options button").first.wait_for()
    assert await view.locator("#question").inner_text() == "Book a table for two tonight"
    assert await view.locator("#options button").all_inner_texts() == ["Yes", "No"]
    assert await view.locator("#send").inner_text() == "Send"  # its toolParams.submitLabel
    # The frame takes the height the view asks for: its content's, no blank band below.
    content_height = await view.locator("html").evaluate(
        "e => Math.ceil(e.getBoundingClientRect().height)"
    )
    assert (await frame_el.bounding_box() or {})["height"] == pytest.approx(
        content_height + 2,
        abs=1,  # its 1 px border
    )
    assert '"question"' in (await tool.locator("pre.args").text_content() or "")
    assert not await tool.locator("pre.args").is_visible()
    assert await tool.locator("textarea").count() == 0
    assert "view:" not in await tool.inner_text()
    assert await page.locator("#cancel").is_enabled()
    await page.screenshot(path=shot("frontend-view-waiting", viewport))

    # Its answer goes by postMessage to Submit; when that fails, the view hears so and
    # lets the user send again.
    dropped: list[str] = []

    async def drop_once(route: Route) -> None:
        if dropped:
            await route.continue_()
        else:
            dropped.append(route.request.url)
            await route.abort()

    await page.route("**/api/submit", drop_once)
    await view.locator("#options button", has_text="No").click()
    await view.locator("#send").click()
    await tool.locator(".note.bad", has_text="failed").wait_for()
    await view.locator("#send:enabled").wait_for()
    await view.locator("#send").click()

    # Taken, it lets the run go on: the answer streams, then the run completes.
    await page.locator('.run[data-status="complete"]').wait_for()
    assert len(dropped) == 1
    assert await result_of(tool) == {"choice": "No"}  # a key/value table, not raw JSON
    assert await tool.get_attribute("data-collapsed") == "true"  # answered: one line again
    assert await page.locator(".tool-form, iframe").count() == 0
    assert "completed" in await page.locator(".run .run-status").inner_text()
    await page.screenshot(path=shot("frontend-view-answered", viewport))

    # The chat is in the history, and opening it replays the same run from GetChat.
    live_answer = await page.locator(".run .content").last.inner_text()
    await page.click("#menu") if viewport is PHONE else None
    await page.click("#new-chat")
    assert await page.locator(".run").count() == 0
    await page.click("#menu") if viewport is PHONE else None
    await page.locator("#chats li button").first.click()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator(".run .content").last.inner_text() == live_answer
    assert await page.locator('.card.tool[data-name="confirm_dialog"] > .result').count() == 1
    assert errors == ["Failed to load resource: net::ERR_FAILED"]  # the dropped Submit


async def test_streamed_reasoning_and_answer(open_page: OpenPage, demo: Harness) -> None:
    page, errors = await open_page(demo.http_url)
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


async def test_plan_tasks_and_actions_live(
    browser: Browser, contexts: list[BrowserContext], quick_demo: Harness
) -> None:
    context = await browser.new_context()
    contexts.append(context)
    await context.add_init_script(RECORD_TASK_STATUSES)
    page, errors = await _goto(await context.new_page(), quick_demo.http_url)
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
    assert await page.locator('.card.tool[data-name="city_datetime"] > .result').count() >= 1

    await page.click("#new-chat")
    await page.select_option("#agent", "demo_action")
    await page.fill("#message", "Make it dark")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator('.card.action[data-name="switch_theme"]').count() == 1
    assert await page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert errors == []


PLAN_IN_SIGHT = """() => {
  const log = document.getElementById('log').getBoundingClientRect();
  const plan = document.querySelector('.run .plan').getBoundingClientRect();
  return plan.top >= log.top - 1 && plan.bottom <= log.bottom + 1 && plan.height > 0;
}"""


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_the_plan_stays_in_sight_and_tool_cards_fold(
    open_page: OpenPage, demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(demo.http_url, viewport)
    await page.select_option("#agent", "demo_plan")
    await page.fill("#message", "Time and weather in Paris")
    await page.click("#send")

    # While the run goes on and the chat scrolls past it, the plan stays at the top (a
    # low window: the folded tool cards take little room).
    await page.set_viewport_size({"width": viewport["width"], "height": 420})
    await page.locator('.card.tool[data-name="mock_city_weather"]').wait_for()
    await page.locator("#log").evaluate("log => { log.scrollTop = log.scrollHeight; }")
    assert await page.evaluate(
        "() => { const l = document.getElementById('log'); return l.scrollTop > 0; }"
    )
    assert await page.locator('.run[data-status="running"]').count() == 1
    assert await page.evaluate(PLAN_IN_SIGHT)
    await page.screenshot(path=shot("plan-in-sight", viewport))
    await page.set_viewport_size(viewport)
    await page.locator('.run[data-status="complete"]').wait_for()

    # The plan's own tools are one folded line each, inside the plan card; a click unfolds one.
    internal = page.locator('.run .plan .plan-calls > .card.tool[data-name="_plan_update_task_"]')
    assert await internal.count() == 2
    assert await page.locator(".card.tool.internal").count() == 3  # none outside the plan
    assert await page.locator(".plan .card.tool.internal").count() == 3
    assert await internal.evaluate_all("cs => cs.map(c => c.dataset.collapsed)") == ["true"] * 2
    title = await internal.first.locator(".card-title").inner_text()
    assert title.startswith("plan: update task")
    assert not await internal.first.locator("pre.args").is_visible()
    await internal.first.locator(".card-title").click()
    assert await internal.first.locator("pre.args").is_visible()

    # Any tool card is one line, folded, and unfolds by its title.
    weather = page.locator('.card.tool[data-name="mock_city_weather"]')
    assert not await weather.locator(".result").is_visible()
    assert await weather.locator(".card-title").get_attribute("aria-expanded") == "false"
    await weather.locator(".card-title").click()
    assert await weather.locator(".result").is_visible()
    assert await weather.locator(".card-title").get_attribute("aria-expanded") == "true"

    # Templates in arguments are shown filled in, as the tool got them.
    args = json.loads(await weather.locator("pre.args").inner_text())
    dated = await result_of(page.locator('.card.tool[data-name="city_datetime"]'))
    assert args["date"] == dated["date"]
    assert "{{city_datetime.date}}" in (await weather.get_attribute("data-template") or "")
    assert "templates filled in" in await weather.locator(".label").first.inner_text()
    await page.screenshot(path=shot("plan-done", viewport), full_page=True)

    # Replayed from history, the filled-in arguments and the folding are the same.
    if viewport is PHONE:
        await page.click("#menu")
    await page.locator("#chats li button").first.click()
    await page.locator("#status", has_text="events replayed").wait_for()
    assert json.loads(await weather.locator("pre.args").inner_text()) == args
    assert await internal.evaluate_all("cs => cs.map(c => c.dataset.collapsed)") == ["true"] * 2
    assert errors == []


LONG_WORD = "https://example.com/" + "a" * 400


def overflow(page: Page) -> Awaitable[Any]:
    """How far the page or any message sticks out to the right of the window, in px."""
    return page.evaluate(
        """() => Math.max(document.documentElement.scrollWidth - innerWidth,
             ...[...document.querySelectorAll('.user, .content, .card, #send, #cancel')]
                .map(e => e.getBoundingClientRect().right - innerWidth))"""
    )


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_the_page_fits_the_window(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    sidebar = page.locator("#sidebar")
    if viewport is PHONE:
        # The sidebar is a drawer: the chat and Send take the whole width.
        assert (await sidebar.bounding_box() or {"x": 0, "width": 1})["x"] < 0
        assert await page.locator("#menu").is_visible()
        await page.click("#menu")
        await page.wait_for_function(
            "() => document.getElementById('sidebar').getBoundingClientRect().left >= 0"
        )
        assert await page.locator("#menu").get_attribute("aria-expanded") == "true"
        await page.screenshot(path=shot("fits-menu", viewport))
        await page.select_option("#agent", "demo_oneshot")
        await page.click("#scrim", position={"x": 370, "y": 400})
        await page.wait_for_function(
            "() => document.getElementById('sidebar').getBoundingClientRect().right <= 0"
        )
    else:
        assert not await page.locator("#menu").is_visible()
        assert (await sidebar.bounding_box() or {"x": -1})["x"] == 0
        await page.select_option("#agent", "demo_oneshot")
    if viewport is DESKTOP:  # the header names the agent the next message goes to
        chosen = await page.locator('#agent option[value="demo_oneshot"]').inner_text()
        assert await page.locator("#chat-agent").inner_text() == chosen

    # A long unbroken message and its echo wrap inside the window.
    await page.fill("#message", f"Look at {LONG_WORD}")
    send = await page.locator("#send").bounding_box()
    assert send is not None and send["x"] + send["width"] <= viewport["width"]
    assert send["y"] + send["height"] <= viewport["height"]
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    assert LONG_WORD in await page.locator(".run .content").inner_text()
    assert await overflow(page) <= 0
    await page.screenshot(path=shot("fits-long-text", viewport))
    assert errors == []


async def test_composer_feedback(
    open_page: OpenPage, agents_dir: Path, provider: LoopbackProvider
) -> None:
    limits = {"max_message_bytes": 64, "http_max_body_bytes": 400}
    async with Harness.start(agents_dir, provider, **limits) as small:
        page, errors = await open_page(small.http_url, PHONE)
        queries: list[str] = []
        page.on("request", lambda r: queries.append(r.url) if "/api/query" in r.url else None)

        # An empty message: a word next to the composer, and nothing sent.
        await page.click("#send")
        note = page.locator("#composer-note")
        assert await note.inner_text() == "Type a message first."
        assert await page.locator("#message").get_attribute("aria-invalid") == "true"
        await page.screenshot(path=shot("composer-empty", PHONE))
        await page.fill("#message", "   ")
        await page.press("#message", "Enter")
        assert queries == [] and await note.is_visible()

        # A message over the limit is refused, and stays in the composer to be shortened.
        text = "too long " * 10
        await page.fill("#message", text)
        assert not await note.is_visible()  # typing clears the note
        await page.click("#send")
        await page.wait_for_function("() => document.getElementById('composer-note').textContent")
        assert (await note.inner_text()).startswith("Not sent: ")
        assert "64" in await note.inner_text()
        assert await page.input_value("#message") == text
        assert await page.locator(".run").count() == 0
        assert await page.locator("#send").is_enabled()
        await page.screenshot(path=shot("composer-refused", PHONE))

        # So is a request body over the adapter's limit.
        huge = "x" * 500
        await page.fill("#message", huge)
        await page.click("#send")
        await page.wait_for_function("() => document.getElementById('composer-note').textContent")
        assert await note.inner_text() == "Not sent: Maximum request body size 400 exceeded."
        assert await page.input_value("#message") == huge
        assert await page.locator(".run").count() == 0

        # Shortened, it goes, and only then leaves the composer.
        provider.enqueue([content("Short and sweet."), finish("stop"), DONE])
        await page.fill("#message", "Short")
        await page.click("#send")
        await page.locator('.run[data-status="complete"]').wait_for()
        assert await page.input_value("#message") == ""
        assert await note.inner_text() == ""
        assert len(queries) == 3
        # The refused queries are the console's only errors (their HTTP statuses).
        assert len(errors) == 2 and "429" in errors[0] and "413" in errors[1]


async def test_chat_list_and_reopening_a_chat_keeps_its_agent(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    page, errors = await open_page(quick_demo.http_url)
    long_title = "A rather long first message that names the chat " + "and goes on " * 4
    await page.select_option("#agent", "demo_oneshot")
    await page.fill("#message", long_title)
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    await page.click("#new-chat")
    await page.select_option("#agent", "demo_action")
    await page.fill("#message", "Make it light")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()

    # Each chat: its whole name (wrapped, not cut), its agent and when it last changed.
    entries = page.locator("#chats li button")
    await page.wait_for_function("() => document.querySelectorAll('#chats li').length === 2")
    first = entries.nth(1)
    name = await first.locator(".chat-name").inner_text()
    assert name.startswith("A rather long first message")
    assert await first.locator(".chat-name").evaluate("e => e.scrollWidth <= e.clientWidth")
    assert await first.locator(".chat-agent").inner_text() == "Friendly assistant"  # its name
    assert await first.locator("time").inner_text() == "just now"
    assert await first.get_attribute("data-agent-key") == "demo_oneshot"
    await page.screenshot(path=shot("chat-list", DESKTOP))

    # Opening the older chat brings its agent back, so the next message goes to it.
    chat_id = await first.get_attribute("data-chat-id")
    await first.click()
    await page.locator("#status", has_text="events replayed").wait_for()
    assert await page.input_value("#agent") == "demo_oneshot"
    await page.fill("#message", "And one more thing")
    async with page.expect_request("**/api/query") as sent:
        await page.click("#send")
    body = json.loads((await sent.value).post_data or "{}")
    assert body["agentKey"] == "demo_oneshot"
    assert body["chatId"] == chat_id
    await page.locator('.run[data-status="complete"] >> nth=1').wait_for()
    assert errors == []


FORM_TOOLS = {
    "tools": [
        {
            "name": "book",
            "description": "Ask the user for the booking's details.",
            "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
            "answerSchema": {
                "type": "object",
                "properties": {
                    "guests": {"type": "integer", "minimum": 1, "default": 2},
                    "time": {"type": "string", "enum": ["18:00", "20:00"], "default": "20:00"},
                    "terrace": {"type": "boolean", "title": "On the terrace"},
                    "name": {"type": "string", "description": "Whose name the table is in."},
                },
                "required": ["guests", "time", "name"],
            },
            "toolParams": {"submitLabel": "Book"},
        },
        {"name": "note_it", "description": "Ask the user for a note."},
    ]
}


@module_fixture
async def form_gateway(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    """A gateway whose agent `ui` has two frontend tools: one with an answer schema, one bare."""
    agents_dir = tmp_path / "agents"
    write_agent(
        agents_dir,
        "ui",
        oneshot_agent(
            "Ask.", toolConfig={"backends": [], "frontends": ["book", "note_it"], "actions": []}
        ),
    )
    tools_dir = tmp_path / "tools"
    tools_dir.mkdir()
    (tools_dir / "forms.html").write_text(json.dumps(FORM_TOOLS))
    async with Harness.start(agents_dir, provider, tools_dir=tools_dir) as harness:
        yield harness


async def test_a_form_built_from_the_answer_schema(
    open_page: OpenPage, form_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("call_b", "book", '{"question":"Your booking?"}')),
        call_turn(("call_n", "note_it", "{}")),
        answer_turn("Booked."),
    )
    page, errors = await open_page(form_gateway.http_url, PHONE)
    await page.fill("#message", "A table please")
    await page.click("#send")
    form = page.locator('.card.tool[data-name="book"] .schema-form')
    await form.wait_for()
    assert await form.locator(".question").inner_text() == "Your booking?"
    assert await form.locator('input[name="guests"]').input_value() == "2"  # the default
    assert await form.locator('select[name="time"] option:checked').inner_text() == "20:00"
    assert await form.locator('[data-field="terrace"] .field-label').inner_text() == (
        "On the terrace"
    )
    # The fields in a stable order (a Struct keeps no key order): the required ones as
    # `required` lists them, then the others by name.
    names = await form.locator("[data-field]").evaluate_all("fs => fs.map(f => f.dataset.field)")
    assert names == ["guests", "time", "name", "terrace"]
    await page.screenshot(path=shot("schema-form", PHONE))

    # Required fields are checked, and so are whole numbers.
    await form.locator('input[name="guests"]').fill("2.5")
    await form.locator('button[type="submit"]').click()
    assert await form.locator(".note.bad").inner_text() == "guests: a whole number"
    await form.locator('input[name="guests"]').fill("4")
    await form.locator('button[type="submit"]').click()
    assert await form.locator(".note.bad").inner_text() == "name: required"
    await form.locator('input[name="name"]').fill("Ada")
    await form.locator('select[name="time"]').select_option("18:00")
    await form.locator('input[name="terrace"]').check()
    await form.locator('button[type="submit"]', has_text="Book").click()

    # The answer is typed as the schema says: 4 stays an integer.
    shown = await result_of(page.locator('.card.tool[data-name="book"]'))
    assert shown == {"guests": "4", "time": "18:00", "terrace": "true", "name": "Ada"}
    answer = {"guests": 4, "time": "18:00", "terrace": True, "name": "Ada"}
    assert json.loads(provider.requests[1]["messages"][-1]["content"]) == answer

    # A tool with neither view nor schema: an empty answer box that refuses to send nothing.
    bare = page.locator('.card.tool[data-name="note_it"] .tool-form')
    await bare.wait_for()
    assert await bare.locator("textarea").input_value() == ""
    await bare.locator('button[type="submit"]').click()
    assert "Type an answer first." in await bare.inner_text()
    assert len(provider.requests) == 2  # still waiting
    await bare.locator("textarea").fill("Window seat")
    await bare.locator('button[type="submit"]').click()
    await page.locator('.run[data-status="complete"]').wait_for()
    note_result = page.locator('.card.tool[data-name="note_it"]')
    assert await result_of(note_result) == "Window seat"  # plain text, sent as a string
    assert provider.requests[2]["messages"][-1]["content"] == "Window seat"
    assert errors == []


async def test_a_dropped_stream_resumes_from_the_last_event(
    open_page: OpenPage, gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("one "), Gate(gate), content("two"), finish("stop"), DONE])
    page, errors = await open_page(gateway.http_url)
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
    open_page: OpenPage, gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Working on it"), Gate(asyncio.Event()), DONE])
    page, errors = await open_page(gateway.http_url)
    await page.select_option("#agent", "plain")
    await page.fill("#message", "Take your time")
    await page.click("#send")
    await page.wait_for_function(STREAMING, polling="raf")
    await page.click("#cancel")
    await page.locator('.run[data-status="cancel"]').wait_for()
    assert "cancelled (cancel)" in await page.locator(".run .run-status").inner_text()
    assert await page.locator("#send").is_enabled()
    await page.wait_for_load_state("networkidle")  # the Cancel call has answered too
    assert await page.locator("#status").inner_text() == ""  # no "cancelling…" left behind

    # The next message continues the same chat.
    provider.enqueue([content("Done."), finish("stop"), DONE])
    await page.fill("#message", "Now quickly")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    runs = list(gateway.app.frontdoor.runs.values())
    assert len({run.chat_id for run in runs}) == 1 and len(runs) == 2
    assert errors == []


async def test_a_source_without_an_address_is_named_not_linked(
    open_page: OpenPage, tmp_path: Path
) -> None:
    # The example MCP server runs as a local command: its source.snapshot has no url.
    clock = {
        "name": "clock",
        "command": sys.executable,
        "args": [str(ROOT / "examples" / "mcp" / "clock_server.py")],
    }
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        data_dir=tmp_path / "data",
        demo_delay_ms=0,
        mcp_servers=[clock],
    ) as harness:
        page, errors = await open_page(harness.http_url)
        await page.select_option("#agent", "demo_mcp")
        await page.fill("#message", "What time is it in Paris?")
        await page.click("#send")
        await page.locator('.run[data-status="complete"]').wait_for()
        sources = page.locator(".sources")
        assert await sources.all_inner_texts() == ["clock"]
        assert await sources.locator("a").count() == 0  # no link back to this page
        assert await sources.locator(".source-name").inner_text() == "clock"
        assert errors == []


async def test_a_structured_question_in_the_browser(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    page, errors = await open_page(quick_demo.http_url)
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
    await page.screenshot(path=shot("question", DESKTOP), full_page=True)
    await form.locator('button[type="submit"]').click()
    await page.locator('.run[data-status="complete"]').wait_for()
    # The ask_user card's arguments are folded away: the form asks the question once.
    asked = page.locator('.card.tool[data-name="ask_user"]')
    assert '"question"' in (await asked.locator("pre.args").text_content() or "")
    assert not await asked.locator("pre.args").is_visible()
    assert await asked.get_attribute("data-collapsed") == "true"  # one line: the form asked
    assert await result_of(asked) == ["Paris", "Rome", "Lisbon"]
    assert await page.locator(".question-form").count() == 0
    assert 'answer: [ "Paris", "Rome", "Lisbon" ]' in await page.locator(".card.ask").inner_text()
    assert errors == []


async def test_a_subagents_run_nested_in_its_callers_card(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    page, errors = await open_page(quick_demo.http_url)
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
    assert await call.locator(":scope > .result").count() == 1  # after its nested run
    assert await page.locator(".run > .run-body > .content").count() == 1
    await page.screenshot(path=shot("subagent", DESKTOP), full_page=True)

    # Replayed from history, the nested run sits in the same place.
    await page.click("#new-chat")
    await page.locator("#chats li button").first.click()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await nested.locator(".card.tool").count() == 2
    assert await nested.locator(".content").count() == 1
    assert errors == []


# -- following the output ----------------------------------------------------------------

BELOW = "() => { const l = document.getElementById('log'); return l.scrollHeight - l.scrollTop - l.clientHeight; }"  # noqa: E501


def lines(tag: str, count: int) -> str:
    return "".join(f"{tag} line {n}\n" for n in range(count))


async def wait_for_text(page: Page, text: str) -> None:
    await page.wait_for_function(
        "t => document.querySelector('.run .content')?.textContent.includes(t)", arg=text
    )


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_the_log_follows_the_output_only_from_the_bottom(
    open_page: OpenPage, gateway: Harness, provider: LoopbackProvider, viewport: dict[str, int]
) -> None:
    first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
    provider.enqueue(
        [
            content(lines("early", 80)),
            Gate(first),
            content(lines("middle", 40)),
            Gate(second),
            content(lines("late", 40)),
            Gate(third),
            content("The end."),
            finish("stop"),
            DONE,
        ]
    )
    page, errors = await open_page(gateway.http_url, viewport)
    log, jump = page.locator("#log"), page.locator("#to-latest")
    await page.select_option("#agent", "plain")
    await page.fill("#message", "Tell me a long story")
    await page.click("#send")

    # At the bottom, the log follows the output as it streams.
    await wait_for_text(page, "early line 79")
    assert await page.evaluate("() => document.getElementById('log').scrollTop") > 0
    assert await page.evaluate(BELOW) <= 1
    assert not await jump.is_visible()

    # Scrolled up to read, the reader stays where they are; new output shows the button.
    await log.hover()
    await page.mouse.wheel(0, -600)
    await page.wait_for_function(f"() => ({BELOW})() > 300")
    top = await log.evaluate("l => l.scrollTop")
    first.set()
    await wait_for_text(page, "middle line 39")
    await jump.wait_for()
    assert await log.evaluate("l => l.scrollTop") == top
    assert await jump.inner_text() == "new output"
    assert await jump.locator("svg.icon-down").count() == 1
    button, area = await jump.bounding_box(), await log.bounding_box()
    assert button is not None and area is not None
    assert area["y"] < button["y"] and button["y"] + button["height"] <= area["y"] + area["height"]
    await page.screenshot(path=shot("scrolled-up-new-output", viewport))

    # The button jumps to the latest output, and the log follows again.
    await jump.click()
    assert await page.evaluate(BELOW) <= 1
    assert not await jump.is_visible()
    second.set()
    await wait_for_text(page, "late line 39")
    await page.wait_for_function(f"() => ({BELOW})() <= 1")
    assert not await jump.is_visible()

    # Scrolled up and back down by hand: following again, no button.
    await log.hover()
    await page.mouse.wheel(0, -500)
    await page.wait_for_function(f"() => ({BELOW})() > 300")
    await page.mouse.wheel(0, 5000)
    await page.wait_for_function(f"() => ({BELOW})() <= 1")
    third.set()
    await page.locator('.run[data-status="complete"]').wait_for()
    await page.wait_for_function(f"() => ({BELOW})() <= 1")
    assert not await jump.is_visible()
    await page.screenshot(path=shot("followed-to-the-end", viewport))
    assert errors == []


# -- the chat list -----------------------------------------------------------------------


async def test_a_new_chat_is_listed_when_it_starts(
    open_page: OpenPage, gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue(
        [content("Thinking it over"), Gate(gate), content("… done."), finish("stop"), DONE]
    )
    page, errors = await open_page(gateway.http_url)
    assert await page.locator("#chats li").count() == 0
    await page.select_option("#agent", "plain")
    await page.fill("#message", "Plan my week")
    await page.click("#send")

    # Listed from its chat.start, while its first run still goes on.
    entry = page.locator("#chats li button")
    await entry.wait_for()
    assert await page.locator('.run[data-status="running"]').count() == 1
    assert await entry.count() == 1
    assert await entry.locator(".chat-name").inner_text() == "Plan my week"
    assert await entry.locator(".chat-agent").inner_text() == "plain"
    assert await entry.locator("time").inner_text() == "just now"
    assert await entry.get_attribute("class") == "current"
    assert await page.locator("#chats-note").inner_text() == ""
    chat_id = await entry.get_attribute("data-chat-id")
    runs = list(gateway.app.frontdoor.runs.values())
    assert [run.chat_id for run in runs] == [chat_id]
    await page.screenshot(path=shot("chat-listed-at-start", DESKTOP))
    started = await entry.locator("time").get_attribute("datetime")

    # When the run ends, its time is the run's end (or the later one ListChats has).
    gate.set()
    await page.locator('.run[data-status="complete"]').wait_for()
    await page.wait_for_function(
        "t => document.querySelector('#chats li time').getAttribute('datetime') !== t",
        arg=started,
    )
    await gateway.app.frontdoor.flush()
    listed = (await gateway.stub.ListChats(gw.ListChatsRequest())).chats
    assert [c.chat_id for c in listed] == [chat_id]
    chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
    ended_at = next(e.timestamp for e in chat.events if e.type == "run.complete")
    when = await entry.locator("time").get_attribute("datetime")
    assert ended_at <= await page.evaluate("t => Date.parse(t)", when) <= listed[0].updated_at
    assert await entry.count() == 1
    assert await entry.get_attribute("data-agent-key") == "plain"

    # A later run of the chat moves its time on when it ends.
    provider.enqueue([content("Again."), finish("stop"), DONE])
    await page.fill("#message", "Once more")
    await page.click("#send")
    await page.locator('.run[data-status="complete"] >> nth=1').wait_for()
    await page.wait_for_function(
        "t => document.querySelector('#chats li time').getAttribute('datetime') !== t", arg=when
    )
    assert await entry.count() == 1
    assert errors == []


async def test_the_agent_offered_first_is_the_last_used_else_a_chat_agent(
    open_page: OpenPage, quick_demo: Harness, tmp_path: Path, provider: LoopbackProvider
) -> None:
    page, errors = await open_page(quick_demo.http_url)
    assert await page.input_value("#agent") == "demo_react"  # not demo_action, the first
    await page.select_option("#agent", "demo_oneshot")
    await page.reload()
    await page.wait_for_selector("#agent option", state="attached")
    assert await page.input_value("#agent") == "demo_oneshot"  # remembered
    assert errors == []

    # Without the REACT demo: the first agent without tools.
    agents_dir = tmp_path / "few-agents"
    write_agent(agents_dir, "a_ui", agent(toolConfig=tools(frontends=("pick",))))
    write_agent(agents_dir, "b_chat", oneshot_agent("Chat."))
    tools_dir = write_ui_tools(tmp_path / "few-tools")
    async with Harness.start(agents_dir, provider, tools_dir=tools_dir) as harness:
        other, errors = await open_page(harness.http_url)
        assert await other.input_value("#agent") == "b_chat"
        assert errors == []


async def test_the_header_says_what_the_log_does_not(
    open_page: OpenPage, gateway: Harness, provider: LoopbackProvider
) -> None:
    """ "N events replayed" goes when the next run starts; "running…" is said once, by the
    run's own line."""
    provider.enqueue(answer_turn("First answer."))
    page, errors = await open_page(gateway.http_url)
    await page.fill("#message", "Hello there")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    await page.click("#new-chat")
    await page.locator("#chats li button").first.click()
    await page.locator("#status", has_text="events replayed").wait_for()

    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content(", done"), finish("stop"), DONE])
    await page.fill("#message", "And then?")
    await page.click("#send")
    await page.wait_for_function(STREAMING, polling="raf")
    assert await page.locator("#status").inner_text() == ""
    assert await page.locator(".run .run-status").last.inner_text() == "running…"
    assert await page.evaluate("() => document.body.innerText.split('running…').length") == 2
    gate.set()
    await page.locator('.run[data-status="complete"] >> nth=1').wait_for()
    assert await page.locator("#status").inner_text() == ""
    assert errors == []


async def test_the_chat_title_keeps_its_room_on_a_phone(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    """At 390 px the header's agent name and status give up their room before the title."""
    page, errors = await open_page(quick_demo.http_url, PHONE)
    await page.fill("#message", "Weather in Paris")
    await page.click("#send")
    await page.locator('.run[data-status="complete"]').wait_for()
    await page.reload()  # reopens the chat: the header also says "N events replayed"
    await page.locator("#status", has_text="events replayed").wait_for()
    title = page.locator("#chat-title")
    assert await title.inner_text() == "Weather in Paris"
    await page.screenshot(path=shot("phone-title", PHONE))
    assert await title.evaluate("e => e.scrollWidth <= e.clientWidth")  # not cut
    assert await overflow(page) <= 0
    assert errors == []
