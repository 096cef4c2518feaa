// The page: pick an agent, chat, watch runs stream, answer waiting tools, cancel,
// and browse past chats. Everything goes through the adapter's HTTP API.

import { ApiError, call, stream } from './api.js';
import { h } from './dom.js';
import { ChatView } from './render.js';

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(['run.complete', 'run.error', 'run.cancel']);
const RESUME_ATTEMPTS = 5;

const state = {
  chatId: '',
  run: null, // {runId, lastSeq, ended, abort}
  agents: [],
};

const view = new ChatView($('log'), {
  submit: (ev, toolId, payload) => call('/api/submit', {
    method: 'POST',
    body: { chatId: ev.chatId, runId: ev.runId, toolId, payload },
  }),
  onTitle: (title) => { $('chat-title').textContent = title; },
});

function setStatus(text) { $('status').textContent = text; }

function setBusy(busy) {
  $('send').disabled = busy;
  $('cancel').disabled = !busy;
  document.body.dataset.busy = busy ? 'true' : 'false';
}

// Agents -------------------------------------------------------------------------------

async function loadAgents() {
  try {
    const data = await call('/api/agents');
    state.agents = data.agents || [];
  } catch (error) {
    setStatus(`agents unavailable: ${error.message}`);
    return;
  }
  const select = $('agent');
  select.replaceChildren(...state.agents.map((agent) => h('option', { value: agent.key },
    `${iconOf(agent.icon)}${agent.name || agent.key}`)));
  const saved = localStorage.getItem('agw.agent');
  if (saved && state.agents.some((a) => a.key === saved)) select.value = saved;
  describeAgent();
}

function iconOf(icon) {
  return icon && icon.startsWith('emoji:') ? `${icon.slice(6)} ` : '';
}

function describeAgent() {
  const agent = state.agents.find((a) => a.key === $('agent').value);
  const mode = (agent?.mode || '').replace('AGENT_MODE_', '');
  $('agent-description').textContent = agent ? `${mode} — ${agent.description || ''}` : '';
  if (agent) localStorage.setItem('agw.agent', agent.key);
}

// Chats ----------------------------------------------------------------------------------

async function loadChats() {
  const list = $('chats');
  try {
    const data = await call('/api/chats', { query: { pageSize: 50 } });
    $('chats-note').textContent = data.chats?.length ? '' : 'No chats yet.';
    list.replaceChildren(...(data.chats || []).map((chat) => h('li', {},
      h('button', {
        type: 'button',
        class: chat.chatId === state.chatId ? 'current' : '',
        title: new Date(chat.updatedAt || 0).toLocaleString(),
        'data-chat-id': chat.chatId,
        onclick: () => openChat(chat.chatId),
      }, chat.chatName || chat.chatId))));
  } catch (error) {
    $('chats-note').textContent = `History unavailable: ${error.message}`;
  }
}

async function openChat(chatId) {
  if (state.run && !state.run.ended) return;
  try {
    const data = await call('/api/chat', { query: { chatId } });
    state.chatId = chatId;
    view.clear();
    $('chat-title').textContent = data.chatName || chatId;
    view.replaying = true;
    try {
      for (const ev of data.events || []) view.handle(ev);
    } finally {
      view.replaying = false;
    }
    setStatus(`${(data.events || []).length} events replayed`);
    loadChats();
  } catch (error) {
    setStatus(`cannot open chat: ${error.message}`);
  }
}

function newChat() {
  if (state.run && !state.run.ended) return;
  state.chatId = '';
  view.clear();
  $('chat-title').textContent = 'New chat';
  setStatus('');
  loadChats();
}

// Runs -----------------------------------------------------------------------------------

function onEvent(run, message) {
  if (message.event === 'error') { // the stream failed after it had started
    throw new ApiError(message.data, 0);
  }
  const ev = message.data;
  if (ev.seq && ev.seq <= run.lastSeq) return; // already seen (after a resume)
  if (ev.seq) run.lastSeq = ev.seq;
  if (!run.runId && ev.runId) run.runId = ev.runId;
  if (ev.chatId) state.chatId = ev.chatId;
  view.handle(ev);
  if (TERMINAL.has(ev.type)) run.ended = true;
}

async function send(text) {
  const agentKey = $('agent').value;
  if (!text.trim() || !agentKey || (state.run && !state.run.ended)) return;
  const run = { runId: '', lastSeq: 0, ended: false, abort: new AbortController() };
  state.run = run;
  setBusy(true);
  setStatus('running…');
  try {
    await stream('/api/query', {
      method: 'POST',
      body: { agentKey, message: text, chatId: state.chatId || undefined },
      signal: run.abort.signal,
    }, (m) => onEvent(run, m));
    await resume(run);
    setStatus(run.ended ? '' : 'the stream ended early');
  } catch (error) {
    if (error.name !== 'AbortError') {
      try {
        await resume(run, error);
        setStatus('');
      } catch (final) {
        setStatus(`error: ${final.message}`);
      }
    }
  } finally {
    run.ended = true;
    setBusy(false);
    loadChats();
  }
}

/** Re-joins the run after a dropped connection, from the last seq seen (Last-Event-ID). */
async function resume(run, error) {
  for (let attempt = 1; !run.ended && attempt <= RESUME_ATTEMPTS; attempt++) {
    if (!run.runId) throw error || new Error('the stream ended before the run started');
    if (error instanceof ApiError && error.httpStatus) throw error; // refused, not dropped
    setStatus(`reconnecting (${attempt})…`);
    await new Promise((done) => { setTimeout(done, 300 * attempt); });
    try {
      await stream(`/api/runs/${encodeURIComponent(run.runId)}/events`, {
        lastEventId: run.lastSeq, signal: run.abort.signal,
      }, (m) => onEvent(run, m));
      error = null;
    } catch (failure) {
      if (failure.name === 'AbortError') return;
      error = failure;
    }
  }
  if (!run.ended && error) throw error;
}

async function cancel() {
  const run = state.run;
  if (!run || run.ended || !run.runId) return;
  try {
    const reply = await call('/api/cancel', { method: 'POST', body: { runId: run.runId } });
    setStatus(reply.cancelled ? 'cancelling…' : reply.detail);
  } catch (error) {
    setStatus(`cancel failed: ${error.message}`);
  }
}

// Wiring ---------------------------------------------------------------------------------

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('message').value;
  $('message').value = '';
  send(text);
});
$('message').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('cancel').addEventListener('click', cancel);
$('agent').addEventListener('change', describeAgent);
$('new-chat').addEventListener('click', newChat);
$('refresh-chats').addEventListener('click', loadChats);

setBusy(false);
loadAgents();
loadChats();
