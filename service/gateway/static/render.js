// Renders a chat's events — live (start/delta/end) or replayed from history (snapshots) —
// into the page. Events arrive flat, as the adapter sends them:
// {seq, type, timestamp, chatId, runId, taskId?, parentToolId?, ...payload fields}.
// The events of a nested run (a subagent called as a tool, `parentToolId` naming the
// call) render in a view of their own inside the calling tool's card.
//
// Answers render as Markdown (markdown.js). A tool call is one folded line — its name,
// its arguments in short, ✓ or ✗, how long it took — that unfolds on a click to its
// arguments and its result (a key/value table when the result is an object of plain
// values). While the run waits for the user (a frontend tool, a question, a permission,
// a plan approval), its status line says so.

import { askHandlers } from './asks.js';
import { h, pretty } from './dom.js';
import { schemaForm, viewFrame } from './forms.js';
import { icon } from './icons.js';
import { MarkdownBlock } from './markdown.js';
import { planHandlers } from './plan.js';

/** Tools of the plan machinery: one folded line each, inside the plan card (which shows
 *  what they did). */
const INTERNAL_TOOL = /^_plan_/;
/** Backend tools whose arguments the page shows as a question card of its own. */
const ASKS_USER = new Set(['ask_user']);
/** What the status line of a run that waits for the user says. */
export const WAITING = 'Waiting for your answer';

/** "city: Lyon, date: 2030-01-02": an object's fields in short; other values as JSON. */
function summaryOf(args) {
  let value;
  try {
    value = JSON.parse(args || '{}');
  } catch {
    return args || '';
  }
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    return Object.entries(value).map(([key, v]) => `${key}: ${
      v !== null && typeof v === 'object' ? JSON.stringify(v) : v}`).join(', ');
  }
  return JSON.stringify(value);
}

/** "12 ms", "1.4 s". */
function duration(ms) {
  return ms < 1000 ? `${Math.max(0, Math.round(ms))} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** Whether `value` is an object of plain values (strings, numbers, booleans, null). */
function isFlat(value) {
  return !!value && typeof value === 'object' && !Array.isArray(value)
    && Object.keys(value).length > 0
    && Object.values(value).every((v) => v === null || ['string', 'number', 'boolean'].includes(typeof v));
}

/** A tool's result as read: a key/value table for an object of plain values, else its
 *  JSON indented (or its text). */
function resultView(result, error) {
  let value = result;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch { /* text: shown as it is */ }
  }
  if (!error && isFlat(value)) {
    return h('table', { class: 'result kv' }, h('tbody', {}, ...Object.entries(value).map(
      ([key, v]) => h('tr', {}, h('th', { scope: 'row' }, key), h('td', {}, String(v))),
    )));
  }
  return h('pre', { class: 'result' }, pretty(result ?? null));
}

/** "_plan_update_task_" → "plan: update task". */
function internalLabel(name) {
  const words = name.replace(/^_+|_+$/g, '').split('_');
  return `${words[0]}: ${words.slice(1).join(' ')}`;
}

/** Client-side actions the page knows how to perform. */
function perform(name, param) {
  if (name === 'switch_theme' && (param.theme === 'dark' || param.theme === 'light')) {
    document.documentElement.dataset.theme = param.theme;
  } else if (name === 'launch_fireworks') {
    const seconds = Math.min(Math.max(Number(param.seconds) || 2, 1), 10);
    const show = h('div', { class: 'fireworks', 'aria-hidden': 'true' },
      icon('burst'), icon('burst'), icon('burst'));
    show.style.animationDuration = `${seconds}s`;
    document.body.append(show);
    setTimeout(() => show.remove(), seconds * 1000);
  }
}

/** Tells a tool's view (if `form` holds one) whether its answer was taken, so that it can
 *  let the user try again when it was not. */
function tellView(form, accepted, detail) {
  form.querySelector('iframe')?.contentWindow?.postMessage(
    { type: 'agw.answered', accepted, detail }, '*');
}

/** The whole conversation: user messages and one RunView per run. */
export class ChatView {
  constructor(container, { submit, onTitle }) {
    this.container = container;
    this.submit = submit; // (event, toolId, payload) => Promise<SubmitResponse>
    this.onTitle = onTitle;
    this.runs = new Map();
    this.replaying = false; // history: client-side actions are shown, not performed again
  }

  clear() {
    this.container.replaceChildren();
    this.runs.clear();
  }

  handle(ev) {
    if (ev.type === 'request.query') {
      this.container.append(h('div', { class: 'user' }, ev.message || ''));
      return;
    }
    if (ev.type === 'chat.start' || ev.type === 'chat.update') { // a rename: the new name
      this.onTitle(ev.chatName || 'Chat');
      return;
    }
    if (ev.type === 'heartbeat' || !ev.runId) return;
    let run = this.runs.get(ev.runId);
    if (!run) {
      run = new RunView(ev.runId, this);
      this.runs.set(ev.runId, run);
      this.container.append(run.el);
    }
    run.handle(ev);
  }
}

/** One run: its reasoning, answer, tools, actions, plan and outcome.
 *  With `parentToolId`: the nested run of that tool call, inside the call's card. */
export class RunView {
  constructor(runId, chat, parent = null, parentToolId = '') {
    this.runId = runId;
    this.chat = chat;
    this.submit = chat.submit;
    this.parentToolId = parentToolId;
    this.root = parent ? parent.root : this;
    this.status = h('div', { class: 'run-status' }, 'running…');
    this.body = h('div', { class: 'run-body' });
    this.el = parentToolId
      ? h('div', { class: 'nested-run', 'data-parent-tool-id': parentToolId }, this.body)
      : h('div', { class: 'run', 'data-run-id': runId, 'data-status': 'running' },
        this.body, this.status);
    this.blocks = new Map(); // reasoningId / contentId / toolId / actionId -> state
    this.tasks = new Map(); // taskId -> output container
    this.plan = null;
    this.usage = '';
    if (!parent) {
      this.owners = new Map(); // toolId -> the view whose card it is (nested runs included)
      this.nested = new Map(); // toolId -> the view of the nested run that call started
      this.waits = new Set(); // ids of what waits for the user now (nested runs' included)
    }
  }

  /** `id` waits for the user (`on`), or no longer does: the status line says so. */
  waiting(id, on) {
    const root = this.root;
    if (on) root.waits.add(id);
    else root.waits.delete(id);
    if (root.el.dataset.status !== 'running') return;
    const waits = root.waits.size > 0;
    root.el.dataset.waiting = waits ? 'true' : 'false';
    root.status.replaceChildren(...(waits ? [icon('wait'), WAITING] : ['running…']));
  }

  /** The view of the nested run under tool call `toolId`, made inside its card. */
  nestedView(toolId) {
    const root = this.root;
    let view = root.nested.get(toolId);
    if (!view) {
      const owner = root.owners.get(toolId);
      const tool = owner?.blocks.get(toolId);
      if (!tool) return null;
      view = new RunView(this.runId, this.chat, owner, toolId);
      tool.el.append(view.el);
      root.nested.set(toolId, view);
      owner.unfold(tool); // the nested run is what the call does: in sight
    }
    return view;
  }

  /** Where an event's output goes: its task's container inside a plan, else the run. */
  place(ev) {
    if (!ev.taskId) return this.body;
    let box = this.tasks.get(ev.taskId);
    if (!box) {
      const planned = this.plan?.items.get(ev.taskId)?.textContent;
      box = h('div', { class: 'task-output', 'data-task-id': ev.taskId },
        h('div', { class: 'task-title' }, planned || `Task ${ev.taskId}`));
      this.tasks.set(ev.taskId, box);
      this.body.append(box);
    }
    return box;
  }

  handle(ev) {
    if ((ev.parentToolId || '') !== this.parentToolId) {
      this.root.nestedView(ev.parentToolId)?.handle(ev);
      return;
    }
    const handler = this[`on_${ev.type.replace('.', '_')}`];
    if (handler) handler.call(this, ev);
  }

  // Reasoning and content ------------------------------------------------------------

  /** A reasoning block (plain text), or an answer (Markdown). */
  textBlock(ev, id, kind, text = '') {
    let block;
    if (kind === 'reasoning') {
      const node = document.createTextNode(text);
      const el = h('details', { class: 'reasoning', open: true },
        h('summary', {}, 'Reasoning'), h('div', { class: 'reasoning-text' }, node));
      block = { el, node };
    } else {
      const el = h('div', { class: 'content markdown', 'data-content-id': id });
      block = { el, markdown: new MarkdownBlock(el) };
    }
    this.place(ev).append(block.el);
    this.blocks.set(id, block);
    return block;
  }

  appendText(id, delta) {
    const block = this.blocks.get(id);
    if (block?.markdown) block.markdown.append(delta);
    else if (block) block.node.appendData(delta);
  }

  on_reasoning_start(ev) { this.textBlock(ev, ev.reasoningId, 'reasoning'); }
  on_reasoning_delta(ev) { this.appendText(ev.reasoningId, ev.delta || ''); }
  on_reasoning_end(ev) {
    const block = this.blocks.get(ev.reasoningId);
    if (block) block.el.open = false;
  }
  on_reasoning_snapshot(ev) {
    this.textBlock(ev, ev.reasoningId, 'reasoning', ev.text || '').el.open = false;
  }
  on_content_start(ev) { this.textBlock(ev, ev.contentId, 'content'); }
  on_content_delta(ev) { this.appendText(ev.contentId, ev.delta || ''); }
  on_content_end(ev) { this.blocks.get(ev.contentId)?.markdown?.finish(); }
  on_content_snapshot(ev) {
    this.textBlock(ev, ev.contentId, 'content').markdown.finish(ev.text || '');
  }

  // Tools and actions ------------------------------------------------------------------

  /** A tool or action card: one folded line (name, arguments in short, ✓/✗, time) that
   *  a click unfolds. A frontend tool starts unfolded (its view or form waits there); the
   *  plan's own tools go into the plan card; the arguments of a frontend tool or
   *  `ask_user` are folded under its form. */
  card(ev, id, { kind, name, type, description }) {
    const args = document.createTextNode('');
    const internal = kind === 'tool' && INTERNAL_TOOL.test(name || '');
    const frontend = kind === 'tool' && !!type && type !== 'backend';
    const asks = frontend || (kind === 'tool' && ASKS_USER.has(name));
    const summary = h('span', { class: 'summary' });
    const state = h('span', { class: 'state', title: 'running' }, icon('pending'));
    const time = h('span', { class: 'time' });
    const title = h('button', { type: 'button', class: 'card-title', 'aria-expanded': 'true' },
      icon('chevron', 'chevron'),
      h('span', { class: 'tool-name' }, internal ? internalLabel(name) : name || kind),
      summary, state, time);
    const argsLabel = h('span', { class: 'label' }, 'arguments');
    const argsBox = asks
      ? h('details', { class: 'args-box' }, h('summary', {}, argsLabel), h('pre', { class: 'args' }, args))
      : h('div', { class: 'args-box' }, argsLabel, h('pre', { class: 'args' }, args));
    const el = h('div', {
      class: `card ${kind}${internal ? ' internal' : ''}`,
      'data-id': id,
      'data-name': name || '',
      'data-type': type || kind,
      'data-state': 'running',
    }, title, description && !internal ? h('div', { class: 'note' }, description) : null, argsBox);
    const block = {
      el, args, argsLabel, type, name, summary, state, time, started: Number(ev.timestamp || 0),
    };
    title.addEventListener('click', () => {
      block.toggled = true; // the reader's choice stands from now on
      this.fold(el, el.dataset.collapsed !== 'true');
    });
    this.fold(el, !frontend);
    (internal ? this.planCalls(ev) : this.place(ev)).append(el);
    this.blocks.set(id, block);
    this.root.owners.set(id, this);
    return block;
  }

  fold(el, collapsed) {
    el.dataset.collapsed = collapsed ? 'true' : 'false';
    el.querySelector(':scope > .card-title').setAttribute('aria-expanded', collapsed ? 'false' : 'true');
  }

  /** Unfolds the card of `block` (a call waiting, a nested run), unless the reader chose. */
  unfold(block) {
    if (!block.toggled) this.fold(block.el, false);
  }

  /** The arguments are whole: shown indented, and in short on the card's line. */
  setArguments(block, text) {
    block.args.data = pretty(text || '{}');
    block.summary.textContent = summaryOf(text);
  }

  /** The call ended (`error`: failed) at `timestamp`: ✓ or ✗, and how long it took. */
  ended(block, error, timestamp) {
    block.el.dataset.state = error ? 'error' : 'done';
    block.state.replaceChildren(icon(error ? 'cross' : 'check'));
    block.state.title = error ? 'failed' : 'done';
    const took = Number(timestamp || 0) - block.started;
    if (!block.timed && block.started && took >= 0) block.time.textContent = duration(took);
  }

  on_tool_start(ev) {
    Object.assign(this.card(ev, ev.toolId, {
      kind: 'tool', name: ev.toolName, type: ev.toolType, description: ev.description,
    }), { params: ev.toolParams, viewHtml: ev.viewHtml, answerSchema: ev.answerSchema });
  }
  on_tool_args(ev) { this.blocks.get(ev.toolId)?.args.appendData(ev.delta || ''); }
  on_tool_end(ev) {
    const tool = this.blocks.get(ev.toolId);
    if (!tool) return;
    this.setArguments(tool, tool.args.data);
    if (tool.type && tool.type !== 'backend' && !tool.answered) {
      this.toolForm(ev, tool);
      this.waiting(ev.toolId, true);
    }
  }
  on_tool_snapshot(ev) {
    const tool = this.card(ev, ev.toolId, {
      kind: 'tool', name: ev.toolName, type: ev.toolType, description: ev.description,
    });
    this.setArguments(tool, ev.arguments);
  }
  on_tool_result(ev) {
    const tool = this.blocks.get(ev.toolId);
    if (!tool) return;
    tool.answered = true;
    tool.form?.remove();
    this.waiting(ev.toolId, false);
    if (ev.renderedArguments) { // the arguments as the tool got them, templates filled in
      tool.el.dataset.template = tool.args.data;
      this.setArguments(tool, ev.renderedArguments);
      tool.argsLabel.textContent = 'arguments (templates filled in)';
    }
    this.ended(tool, ev.error, ev.timestamp);
    if (tool.type && tool.type !== 'backend' && !tool.toggled) this.fold(tool.el, true);
    tool.el.append(h('div', { class: 'label' }, ev.error ? 'error' : 'result'),
      resultView(ev.result, ev.error));
  }
  on_tool_timing(ev) {
    const tool = this.blocks.get(ev.toolId);
    if (!tool) return;
    tool.timed = true; // the service's own measure
    tool.time.textContent = duration(Number(ev.durationMs || 0));
  }

  /** A frontend tool waits for the user: its view (sandboxed), else a form built from its
   *  answer schema, else a free answer; what the user sends is the tool's result. */
  toolForm(ev, tool) {
    let args = {};
    try {
      args = JSON.parse(tool.args.data || '{}') || {};
    } catch { /* arguments that are not JSON: the plain form below */ }
    const answer = (payload) => this.answer(ev, ev.toolId, payload, tool.form);
    if (tool.viewHtml) {
      tool.form = h('form', { class: 'tool-form' }, viewFrame({
        toolId: ev.toolId, toolName: tool.name, html: tool.viewHtml, args, params: tool.params,
      }, answer));
    } else if (tool.answerSchema && typeof tool.answerSchema === 'object') {
      tool.form = schemaForm(tool.answerSchema, answer, tool.params?.submitLabel || 'Submit');
      if (typeof args.question === 'string') {
        tool.form.prepend(h('div', { class: 'question' }, args.question));
      }
    } else {
      this.freeForm(ev, tool, args);
    }
    tool.el.append(tool.form);
  }

  /** A tool with neither view nor schema: its options as buttons, or an answer typed as
   *  JSON or plain text (never an empty one). */
  freeForm(ev, tool, args) {
    const input = h('textarea', {
      name: 'payload', 'aria-label': `Answer for ${tool.name}`, placeholder: 'JSON or plain text',
    });
    const note = h('div', { class: 'note' }, 'answer as JSON (or plain text)');
    const button = h('button', { type: 'submit', class: 'primary' }, 'Submit');
    const form = h('form', { class: 'tool-form' });
    if (typeof args.question === 'string') form.append(h('div', { class: 'question' }, args.question));
    if (Array.isArray(args.options) && args.options.length) {
      // A choice among options (e.g. a confirmation dialog): one button per option.
      form.append(h('div', { class: 'buttons options' }, ...args.options.map((option) => h('button', {
        type: 'button',
        'data-option': String(option),
        onclick: () => this.answer(ev, ev.toolId, { choice: option }, form),
      }, String(option)))));
    }
    form.append(note, input, h('div', { class: 'buttons' }, button));
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      if (!input.value.trim()) {
        note.textContent = 'Type an answer first.';
        note.classList.add('bad');
        input.focus();
        return;
      }
      let payload;
      try {
        payload = JSON.parse(input.value);
      } catch {
        payload = input.value;
      }
      this.answer(ev, ev.toolId, payload, form);
    });
    tool.form = form;
  }

  /** Sends `payload` to the waiting `toolId` and reports the outcome inside `form`. */
  async answer(ev, toolId, payload, form) {
    const buttons = form.querySelectorAll('button, textarea, input, select');
    buttons.forEach((b) => { b.disabled = true; });
    const note = h('div', { class: 'note' }, 'sending…');
    form.append(note);
    try {
      const reply = await this.submit(ev, toolId, payload);
      note.textContent = reply.accepted ? 'sent' : `not accepted: ${reply.detail || reply.outcome}`;
      if (reply.accepted) form.querySelector('iframe')?.remove();
      if (!reply.accepted) buttons.forEach((b) => { b.disabled = false; });
      tellView(form, reply.accepted, reply.detail || '');
    } catch (error) {
      note.textContent = `failed: ${error.message}`;
      note.classList.add('bad');
      buttons.forEach((b) => { b.disabled = false; });
      tellView(form, false, error.message);
    }
  }

  on_action_start(ev) {
    this.card(ev, ev.actionId, { kind: 'action', name: ev.actionName, type: 'action',
      description: ev.description });
  }
  on_action_args(ev) { this.blocks.get(ev.actionId)?.args.appendData(ev.delta || ''); }
  on_action_end(ev) {
    const action = this.blocks.get(ev.actionId);
    if (action) this.setArguments(action, action.args.data);
  }
  on_action_snapshot(ev) {
    const action = this.card(ev, ev.actionId, { kind: 'action', name: ev.actionName,
      type: 'action', description: ev.description });
    this.setArguments(action, ev.arguments);
  }
  on_action_param(ev) {
    const action = this.blocks.get(ev.actionId);
    if (!this.chat.replaying) perform(action?.name, ev.param || {});
    action?.el.append(h('div', { class: 'label' }, 'parameters'), h('pre', {}, pretty(ev.param)));
  }
  on_action_result(ev) {
    const action = this.blocks.get(ev.actionId);
    if (!action) return;
    this.ended(action, false, ev.timestamp);
    action.el.append(h('div', { class: 'label' }, 'result'), resultView(ev.result, false));
  }

  // Everything else ----------------------------------------------------------------------

  on_request_submit(ev) {
    const block = this.blocks.get(ev.toolId);
    block?.el.append(h('div', { class: 'note' }, 'answered'));
    this.waiting(ev.toolId, false);
  }
  on_source_snapshot(ev) {
    // A source with no address (an MCP server run as a local command) is named, not
    // linked: a link to '#' would open this page again in a new tab.
    const name = ev.title || ev.url || 'source';
    const label = ev.url
      ? h('a', { href: ev.url, target: '_blank', rel: 'noopener' }, name)
      : h('span', { class: 'source-name' }, name);
    this.place(ev).append(h('div', { class: 'sources' }, label));
  }
  on_usage_update(ev) {
    const usage = ev.runUsage || {};
    this.usage = `${usage.totalTokens || 0} tokens`;
    if (ev.runCost) this.usage += ` · ${ev.runCost.toFixed(4)} ${ev.currency || ''}`;
  }
  on_loop_detect(ev) {
    this.place(ev).append(h('div', { class: 'note' },
      `loop detected: ${ev.toolName} repeated ${ev.repeatCount}×`));
  }
  on_context_compress(ev) {
    this.place(ev).append(h('div', { class: 'note' },
      `context compressed (${ev.strategy}): ${ev.messagesBefore} → ${ev.messagesAfter} messages`));
  }

  finish(status, text) {
    this.waits.clear();
    this.el.dataset.status = status;
    this.el.dataset.waiting = 'false';
    this.status.textContent = this.usage ? `${text} · ${this.usage}` : text;
    for (const view of [this, ...this.nested.values()]) {
      for (const block of view.blocks.values()) block.form?.remove();
    }
  }

  on_run_complete(ev) {
    const usage = ev.usage;
    if (usage && !this.usage) this.usage = `${usage.totalTokens || 0} tokens`;
    this.finish('complete', `completed${ev.finishReason ? ` (${ev.finishReason})` : ''}`);
  }
  on_run_cancel(ev) { this.finish('cancel', `cancelled (${ev.reason || 'cancel'})`); }
  on_run_error(ev) {
    const error = ev.error || {};
    this.body.append(h('div', { class: 'error-box' }, `${error.reason || 'ERROR'}: ${error.message || ''}`));
    this.finish('error', 'failed');
  }
}

Object.assign(RunView.prototype, planHandlers, askHandlers);
