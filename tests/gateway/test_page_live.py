"""The web page joins a chat's run in progress again: after a reload, or from another tab.

Same set-up as `test_page.py` (whose fixtures these tests use): the page served by the
adapter of a whole in-process service, in Debian's chromium; the run waits for the
user, the page is reloaded (or the chat opened elsewhere), and the answer given there
lets the run finish.
"""

from __future__ import annotations

import pytest

from service.testing import Harness
from tests.gateway import test_page
from tests.gateway.test_page import DESKTOP, PHONE, TOOL_VIEW, WAITING, OpenPage, result_of, shot

# The browser and the service, as test_page.py sets them up (module-scoped fixtures).
pytestmark = test_page.pytestmark
browser = test_page.browser
contexts = test_page.contexts
open_page = test_page.open_page
quick_demo = test_page.quick_demo


@pytest.mark.parametrize(
    "viewport", [pytest.param(PHONE, id="phone"), pytest.param(DESKTOP, id="desktop")]
)
async def test_a_reload_while_a_frontend_tool_waits_joins_the_run_again(
    open_page: OpenPage, quick_demo: Harness, viewport: dict[str, int]
) -> None:
    page, errors = await open_page(quick_demo.http_url, viewport)
    await page.select_option("#agent", "demo_frontend")
    await page.fill("#message", "Book a table for two tonight")
    await page.click("#send")
    await page.frame_locator(TOOL_VIEW).locator("#options button").first.wait_for()
    chat_id = page.url.partition("#chat=")[2]
    assert chat_id  # the open chat is in the address

    async with page.expect_request("**/api/runs/*/events?afterSeq=0") as attach:
        await page.reload()
    assert (await attach.value).url.endswith("?afterSeq=0")
    view = page.frame_locator(TOOL_VIEW)
    await view.locator("#options button").first.wait_for()
    assert await page.locator("#chat-title").inner_text() != "New chat"
    assert await page.locator(".user").all_inner_texts() == ["Book a table for two tonight"]
    assert await page.locator(".run").count() == 1  # the run once: not history and live
    assert await page.locator(".run .run-status").inner_text() == WAITING  # said once, by the run
    assert await page.locator("#status").inner_text() == ""
    assert await page.locator("#send").is_disabled() and await page.locator("#cancel").is_enabled()
    await page.screenshot(path=shot("live-rejoined", viewport))

    await view.locator("#options button", has_text="Yes").click()
    await view.locator("#send").click()
    await page.locator('.run[data-status="complete"]').wait_for()
    tool = page.locator('.card.tool[data-name="confirm_dialog"]')
    assert await result_of(tool) == {"choice": "Yes"}
    assert await page.locator(".tool-form, iframe").count() == 0
    assert await page.locator("#send").is_enabled()
    assert page.url.endswith(f"#chat={chat_id}")
    assert errors == []


async def test_a_question_waiting_in_one_tab_is_answered_in_another(
    open_page: OpenPage, quick_demo: Harness
) -> None:
    first, first_errors = await open_page(quick_demo.http_url)
    await first.select_option("#agent", "demo_question")
    await first.fill("#message", "A trip in spring")
    await first.click("#send")
    await first.locator(".question-form").wait_for()

    second, errors = await open_page(quick_demo.http_url, PHONE)
    await second.click("#menu")
    await second.locator("#chats li button").first.click()
    form = second.locator(".question-form")
    await form.wait_for()
    assert await form.locator(".choice-label").all_inner_texts() == ["Paris", "Rome", "Oslo"]
    assert await second.locator(".run .run-status").inner_text() == WAITING
    await form.locator('input[value="Rome"]').check()
    await form.locator('button[type="submit"]').click()

    # Both tabs follow the run to its end; the first one's form is gone, answered.
    for page in (second, first):
        await page.locator('.run[data-status="complete"]').wait_for()
        asked = page.locator('.card.tool[data-name="ask_user"]')
        assert await result_of(asked) == ["Paris", "Rome"]
    assert await second.locator(".question-form").count() == 0
    assert errors == [] and first_errors == []
