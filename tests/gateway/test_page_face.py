"""The page a newcomer meets: an empty chat that shows its agent, answers in Markdown that
nothing can run script through, tool calls folded to one line, waiting said, and a page
that stays usable while a run waits.

Same set-up as `test_page.py` (whose fixtures these tests use): the page served by the
adapter of a whole in-process service, in Debian's chromium at 390 and 1280 px wide;
screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw
from playwright.async_api import Browser, BrowserContext, Page

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools
from tests.gateway import test_page
from tests.gateway.test_page import (
    PHONE,
    TOOL_VIEW,
    WAITING,
    WIDTHS,
    OpenPage,
    _goto,
    result_of,
    shot,
)

ROOT = Path(__file__).resolve().parents[2]

# The browser and the services, as test_page.py sets them up (module-scoped fixtures).
pytestmark = test_page.pytestmark
browser = test_page.browser
contexts = test_page.contexts
open_page = test_page.open_page
quick_demo = test_page.quick_demo
provider = test_page.provider


async def send(page: Page, message: str, agent: str = "", *, done: bool = False) -> None:
    """Send `message` (to `agent` when given) from the composer; `done`: wait for the run's end."""
    if agent:
        await page.select_option("#agent", agent)
    await page.fill("#message", message)
    await page.click("#send")
    if done:
        await page.locator('.run[data-status="complete"]').last.wait_for()


async def agent_of(harness: Harness, key: str) -> gw.Agent:
    return (await harness.stub.GetAgent(gw.GetAgentRequest(agent_key=key))).agent


# -- the empty chat ----------------------------------------------------------------------


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_an_empty_chat_shows_its_agent_and_example_prompts(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    react = await agent_of(quick_demo, "demo_react")
    empty = page.locator("#log > .empty-state")
    await empty.wait_for()
    assert await empty.locator("h2").inner_text() == react.name
    assert await empty.locator("p").first.inner_text() == react.description
    assert await empty.locator(".example").all_inner_texts() == list(react.examples)
    assert await empty.locator("svg.icon-agent").count() == 1
    await page.screenshot(path=shot("empty-state", viewport))

    # Another agent: its own name and examples.
    if viewport is PHONE:
        await page.click("#menu")
    await page.select_option("#agent", "demo_plan")
    plan = await agent_of(quick_demo, "demo_plan")
    await empty.locator("h2", has_text=plan.name).wait_for()
    assert await empty.locator(".example").all_inner_texts() == list(plan.examples)
    if viewport is PHONE:
        await page.click("#scrim", position={"x": 370, "y": 400})

    # An example is a click away: it is sent, and the chat is no longer empty.
    async with page.expect_request("**/api/query") as sent:
        await empty.locator(".example").first.click()
    body = json.loads((await sent.value).post_data or "{}")
    assert (body["agentKey"], body["message"]) == ("demo_plan", plan.examples[0])
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await page.locator(".empty-state").count() == 0
    assert await page.locator(".user").inner_text() == plan.examples[0]

    # A new chat is empty again, and says so with the agent.
    if viewport is PHONE:
        await page.click("#menu")
    await page.click("#new-chat")
    await empty.locator("h2", has_text=plan.name).wait_for()
    assert errors == []


# -- answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_a_react_answer_reads_as_markdown_with_its_calls_folded_to_one_line(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    await send(page, "What's the weather in Lyon?", done=True)

    answer = page.locator(".run .content")
    assert await answer.locator("p > em").first.inner_text() == (
        "Demo answer: agw's built-in demo model, not a real LLM."
    )
    local_time, weather = await answer.locator("ul > li").all_inner_texts()
    assert local_time.startswith("Local time in Lyon: ")
    assert weather.startswith("Weather in Lyon on ") and weather.endswith("(made-up demo data)")
    assert await answer.locator("li > strong").first.inner_text() == "Local time in Lyon"
    assert "**" not in await answer.inner_text()  # Markdown, not its marks

    # Each call is one line: its name, its arguments in short, ✓, how long it took.
    cards = page.locator(".run > .run-body > .card.tool")
    assert await cards.evaluate_all("cs => cs.map(c => c.dataset.name)") == [
        "city_datetime",
        "mock_city_weather",
    ]
    local = cards.first
    title = local.locator(".card-title")
    assert await local.get_attribute("data-collapsed") == "true"
    assert await title.locator(".tool-name").inner_text() == "city_datetime"
    assert await title.locator(".summary").inner_text() == "city: Lyon"
    assert await title.locator(".state svg.icon-check").count() == 1
    assert (await title.locator(".time").inner_text()).endswith(" ms")
    line = await title.evaluate("t => parseFloat(getComputedStyle(t).lineHeight)")
    box = await local.bounding_box()
    assert box is not None and box["height"] < 2.5 * line  # one line (and the card's padding)
    assert not await local.locator(".result").is_visible()
    await page.screenshot(path=shot("react-answer-markdown", viewport))

    # A click unfolds it: the result reads as a key/value table, not raw JSON.
    await title.click()
    result = local.locator(":scope > table.result.kv")
    assert await result.is_visible()
    shown = await result_of(local)
    assert (shown["city"], shown["timezone"]) == ("Lyon", "Europe/Paris")
    await page.screenshot(path=shot("tool-card-unfolded", viewport))
    assert errors == []


MARKDOWN = [
    "## Plan\n\n- one\n- two **bold**\n\n| city | temp |\n|---|---|\n| Lyon | 21 |\n\n",
    "```python\ndef area(r):\n    return 3.14 * r * r\n```\n\n",
    "See [the docs](https://example.com/docs).\n\n",
    '<img src="x" onerror="window.pwned = 1">\n\n<script>window.pwned = 2</script>\n\n',
    "[click me](javascript:window.pwned=3) and ",
    '<a href="javascript:window.pwned=4">me</a> ',
    '<svg onload="window.pwned=5"></svg><iframe src="javascript:window.pwned=6"></iframe>\n',
    '<form action="https://evil.example"><input name="x"></form>',
]


async def test_markdown_renders_and_nothing_a_model_writes_can_run_script(
    open_page: OpenPage, agents_dir: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue([*(content(piece) for piece in MARKDOWN), finish("stop"), DONE])
    async with Harness.start(agents_dir, provider) as gateway:
        page, errors = await open_page(gateway.http_url)
        await send(page, "Show me everything", "plain", done=True)
        answer = page.locator(".run .content")
        assert await answer.locator("h2").inner_text() == "Plan"
        assert await answer.locator("ul > li").all_inner_texts() == ["one", "two bold"]
        assert await answer.locator("table td").all_inner_texts() == ["Lyon", "21"]
        code = answer.locator("pre > code.hljs")
        assert "def area(r):" in await code.inner_text()
        assert await code.locator(".hljs-keyword").all_inner_texts() == ["def", "return"]
        link = answer.locator('a[href="https://example.com/docs"]')
        assert (await link.get_attribute("target"), await link.get_attribute("rel")) == (
            "_blank",
            "noopener noreferrer",
        )

        # Inert: no script, no handlers, no javascript: links, no frames or forms.
        assert await answer.locator("script, iframe, form, input, svg").count() == 0
        assert await answer.locator("img").get_attribute("onerror") is None
        hrefs = await answer.locator("a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
        assert not [h for h in hrefs if h and h.strip().lower().startswith("javascript:")]
        for text in ("click me", "me"):
            await answer.locator("a", has_text=text).last.click()
        await page.wait_for_timeout(300)
        assert await page.evaluate("window.pwned") is None
        assert len(page.context.pages) == 1  # the links without an address opened nothing
        assert [e for e in errors if "404" not in e] == []  # the image's src="x" is not found


COUNT_RENDERS = """
window.renders = 0;
new MutationObserver((changes) => {
  for (const change of changes) {
    if (change.target.matches && change.target.matches('.content') && change.addedNodes.length) {
      window.renders += 1;
    }
  }
}).observe(document, { subtree: true, childList: true });
"""


async def test_a_streamed_answer_is_rendered_at_most_once_a_frame(
    browser: Browser, contexts: list[BrowserContext], agents_dir: Path, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    burst = [content(f"word{n} ") for n in range(300)]
    provider.enqueue(
        [content("First. "), Gate(gate), *burst, content("\n\n- done"), finish("stop"), DONE]
    )
    async with Harness.start(agents_dir, provider) as gateway:
        context = await browser.new_context()
        contexts.append(context)
        await context.add_init_script(COUNT_RENDERS)
        page, errors = await _goto(await context.new_page(), gateway.http_url)
        await send(page, "Go on", "plain")
        await page.locator(
            ".run .content", has_text="First."
        ).wait_for()  # rendered while streaming
        gate.set()
        await page.locator('.run[data-status="complete"]').wait_for()
        answer = page.locator(".run .content")
        assert (await answer.locator("p").inner_text()).endswith("word299")
        assert await answer.locator("li").inner_text() == "done"
        renders = await page.evaluate("window.renders")
        assert 2 <= renders < 60  # 302 deltas: a render per frame, not one per delta
        assert errors == []


# -- waiting -----------------------------------------------------------------------------


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_waiting_is_said_and_one_answer_among_options_is_one_click(
    open_page: OpenPage, tmp_path: Path, provider: LoopbackProvider, viewport: dict[str, int]
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "asker", agent(toolConfig=tools("ask_user")))
    question = {
        "question": "Which city for the weekend?",
        "options": [
            {"label": "Lyon", "description": "Food and old streets", "recommended": True},
            {"label": "Oslo", "description": "Fjords and museums"},
        ],
    }
    provider.enqueue(
        call_turn(("call_q", "ask_user", json.dumps(question))), answer_turn("Oslo it is.")
    )
    async with Harness.start(agents, provider) as gateway:
        page, errors = await open_page(gateway.http_url, viewport)
        await send(page, "A weekend away")
        ask = page.locator(".card.ask")
        await ask.locator(".option").first.wait_for()
        status = page.locator(".run .run-status")
        assert await status.inner_text() == WAITING
        assert await status.locator("svg.icon-wait").count() == 1
        assert await page.locator('.run[data-waiting="true"]').count() == 1
        options = ask.locator(".option")
        assert await options.locator(".choice-label").all_inner_texts() == ["Lyon", "Oslo"]
        assert "Fjords and museums" in await options.nth(1).inner_text()
        assert await ask.locator(".option.recommended .choice-label").inner_text() == "Lyon"
        assert await ask.locator('input[type="radio"]').count() == 0  # buttons, not a form
        await page.screenshot(path=shot("waiting-question", viewport))

        await options.nth(1).click()  # one click answers
        await page.locator('.run[data-status="complete"]').wait_for()
        assert provider.requests[1]["messages"][-1]["content"] == "Oslo"
        assert (await status.inner_text()).startswith("completed")
        assert await page.locator('.run[data-waiting="true"]').count() == 0
        assert errors == []


async def test_new_chat_and_another_agent_work_while_a_run_waits(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    page, errors = await open_page(quick_demo.http_url)
    await send(page, "Shall we start?", "demo_frontend")
    await page.frame_locator(TOOL_VIEW).locator("#options button").first.wait_for()
    assert await page.locator(".run .run-status").inner_text() == WAITING
    waiting_chat = page.url.partition("#chat=")[2]

    # New chat: at once, an empty chat ready for a message; the run goes on waiting.
    await page.click("#new-chat")
    await page.locator("#log > .empty-state").wait_for()
    assert await page.locator(".run").count() == 0
    assert await page.locator("#chat-title").inner_text() == "New chat"
    assert await page.locator("#send").is_enabled() and await page.locator("#cancel").is_disabled()
    run = next(iter(quick_demo.app.frontdoor.runs.values()))
    assert run.chat_id == waiting_chat and not run.log[-1].type.startswith("run.")

    # Another agent: its empty chat, and a message goes to it.
    await page.select_option("#agent", "demo_oneshot")
    await page.locator(".empty-state h2", has_text="Friendly assistant").wait_for()
    await send(page, "Hello", done=True)

    # Switching agents during a waiting run leaves it waiting too.
    await page.click("#new-chat")
    await send(page, "Ready?", "demo_frontend")
    await page.frame_locator(TOOL_VIEW).locator("#options button").first.wait_for()
    await page.select_option("#agent", "demo_plain")
    await page.locator(".empty-state h2", has_text="Plain assistant").wait_for()
    assert await page.locator("#send").is_enabled()

    # The first waiting run is still there to be answered: its chat joins it again.
    await page.locator(f'#chats li button[data-chat-id="{waiting_chat}"]').click()
    view = page.frame_locator(TOOL_VIEW)
    await view.locator("#options button", has_text="Yes").click()
    await view.locator("#send").click()
    await page.locator('.run[data-status="complete"]').wait_for()
    assert await result_of(page.locator('.card.tool[data-name="confirm_dialog"]')) == {
        "choice": "Yes"
    }
    assert errors == []


# -- details -----------------------------------------------------------------------------

#: Pictographs, arrows (↻ ↓), symbols and dingbats (☰ ✓ ✗ ✕): glyphs fonts may lack.
EMOJI = r"[\p{Extended_Pictographic}\u2190-\u21FF\u2600-\u27BF]"


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_icons_are_inline_svg_never_emoji(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    for button in ("#menu", "#close-menu", "#refresh-chats"):
        assert await page.locator(f"{button} > svg.icon").count() == 1, button
    await page.evaluate(
        """() => new MutationObserver(() => {
             if (document.querySelector('.fireworks svg.icon-burst')) window.burst = true;
           }).observe(document.body, { childList: true })"""
    )
    if viewport is PHONE:
        await page.click("#menu")
    await page.select_option("#agent", "demo_action")
    if viewport is PHONE:
        await page.click("#scrim", position={"x": 370, "y": 400})
    await send(page, "Make it dark, then celebrate!", done=True)
    await page.wait_for_function("() => window.burst === true")  # fireworks, drawn in SVG
    shown = await page.evaluate("document.body.innerText")
    options = await page.locator("#agent option").all_inner_texts()
    pattern = EMOJI
    assert await page.evaluate("([t, p]) => !new RegExp(p, 'u').test(t)", [shown, pattern])
    assert await page.evaluate(
        "([t, p]) => !new RegExp(p, 'u').test(t)", ["".join(options), pattern]
    )
    assert errors == []


LONG = "Goes on and on about everything it does " * 6 + "and-an-unbroken-" * 12 + "word."


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_long_descriptions_wrap_inside_the_sidebar(
    open_page: OpenPage, tmp_path: Path, provider: LoopbackProvider, viewport: dict[str, int]
) -> None:
    agents = tmp_path / "agents"
    long_name = "An agent with a name far longer than the sidebar is wide, honestly"
    write_agent(agents, "wordy", oneshot_agent("W.", name=long_name, description=LONG))
    async with Harness.start(agents, provider) as gateway:
        page, errors = await open_page(gateway.http_url, viewport)
        if viewport is PHONE:
            await page.click("#menu")
            await page.wait_for_function(
                "() => document.getElementById('sidebar').getBoundingClientRect().left >= 0"
            )
        sidebar = await page.locator("#sidebar").bounding_box()
        assert sidebar is not None
        right = sidebar["x"] + sidebar["width"]
        for part in ("#agent-description", "#agent", "#new-chat"):
            box = await page.locator(part).bounding_box()
            assert box is not None and box["x"] + box["width"] <= right + 0.5, part
        assert await page.locator("#sidebar").evaluate("s => s.scrollWidth <= s.clientWidth")
        description = await page.locator("#agent-description").bounding_box()
        assert description is not None and description["height"] > 100  # wrapped, whole
        await page.screenshot(path=shot("sidebar-long-description", viewport))
        assert errors == []


async def test_an_error_says_what_is_wrong_in_one_sentence(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    """demo_mcp where no MCP server is configured (the harness sets none)."""
    page, errors = await open_page(quick_demo.http_url, PHONE)
    await send(page, "What time is it in Paris?", "demo_mcp")
    note = page.locator("#composer-note")
    await note.wait_for()
    assert await note.inner_text() == (
        "Not sent: stage 'react': mcp: 'clock' is not a configured MCP server"
    )
    await page.screenshot(path=shot("error-one-sentence", PHONE))
    assert len(errors) == 1 and "404" in errors[0]  # the refused query's HTTP status


@pytest.mark.parametrize("viewport", WIDTHS)
async def test_a_plan_run_keeps_the_plan_s_own_calls_in_its_card(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    await send(page, "Plan a day in Lyon", "demo_plan", done=True)
    plan = page.locator(".run .plan")
    assert await plan.locator("li").all_inner_texts() == [
        "Find the local date and time in Lyon",
        "Get the weather in Lyon on that date",
    ]
    calls = plan.locator(".plan-calls > .card.tool")
    assert await calls.evaluate_all("cs => cs.map(c => c.dataset.name)") == [
        "_plan_add_tasks_",
        "_plan_update_task_",
        "_plan_update_task_",
    ]
    assert await calls.evaluate_all("cs => cs.every(c => c.dataset.collapsed === 'true')")
    await page.locator("#log").evaluate("log => { log.scrollTop = 0; }")  # the plan first
    await page.screenshot(path=shot("plan-run", viewport))
    assert errors == []
