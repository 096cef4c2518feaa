// The page: pick an agent, chat, watch runs stream, answer waiting tools, cancel,
// and browse past chats. Everything goes through the adapter's HTTP API.
//
// An empty chat shows the agent: its name, what it does and its example prompts, to
// click. Leaving a run that waits for the user (New chat, another agent, another chat)
// leaves it waiting on the service: opening its chat again joins it (live.js).

import { ApiError, call, stream } from './api.js';
import { h } from './dom.js';
import { icon, placeIcons } from './icons.js';
import {
  follow, liveRunOf, rememberChat, rememberedChat, settledEvents,
} from './live.js';
import { ChatView } from './render.js';
import { ScrollFollower } from './scroll.js';

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(['run.complete', 'run.error', 'run.cancel']);
const RESUME_ATTEMPTS = 5;
const PREFERRED_AGENT = 'demo_react'; // the first agent offered when none was used here

const state = {
  chatId: '',
  run: null, // {runId, lastSeq, ended, abort}: the run this page follows
  agents: [],
  chats: [], // as ListChats last answered
  newChat: null, // a chat started since, listed before its first run is recorded
  ended: null, // {chatId, at}: the run that ended last, newer than ListChats may know yet
};

const view = new ChatView($('log'), {
  submit: (ev, toolId, payload) => call('/api/submit', {
    method: 'POST',
    body: { chatId: ev.chatId, runId: ev.runId, toolId, payload },
  }),
  onTitle: (title) => { $('chat-title').textContent = title; },
});
const follower = new ScrollFollower($('log'), $('to-latest'));

function setStatus(text) { $('status').textContent = text; }

/** Feedback about the message being written (empty, refused), next to the composer. */
function setNote(text) {
  $('composer-note').textContent = text;
  $('message').setAttribute('aria-invalid', text ? 'true' : 'false');
}

/** The sidebar is a drawer on narrow screens: the menu button opens it. */
function setMenu(open) {
  document.body.dataset.menu = open ? 'open' : 'closed';
  $('menu').setAttribute('aria-expanded', open ? 'true' : 'false');
  $('scrim').hidden = !open;
}

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
    loadChats();
    return;
  }
  const select = $('agent');
  select.replaceChildren(...state.agents.map((agent) => h('option', { value: agent.key },
    agent.name || agent.key)));
  select.value = defaultAgent(localStorage.getItem('agw.agent'));
  describeAgent();
  loadChats(); // their agents' names are known now
}

/** The agent picked at first: the one last used here, else a plain chat agent — the
 *  REACT demo when loaded, else the first without tools — else the first. */
function defaultAgent(saved) {
  const keys = state.agents.map((a) => a.key);
  if (saved && keys.includes(saved)) return saved;
  if (keys.includes(PREFERRED_AGENT)) return PREFERRED_AGENT;
  const plain = state.agents.find((a) => !(a.tools || []).length);
  return (plain || state.agents[0])?.key || '';
}

function agentName(key) {
  const agent = state.agents.find((a) => a.key === key);
  return agent ? agent.name || agent.key : key;
}

/** Picks `key` as the agent the next message goes to (when it is loaded). */
function selectAgent(key) {
  if (!key || !state.agents.some((a) => a.key === key)) return false;
  $('agent').value = key;
  describeAgent();
  return true;
}

function describeAgent() {
  const agent = state.agents.find((a) => a.key === $('agent').value);
  const mode = (agent?.mode || '').replace('AGENT_MODE_', '');
  $('agent-description').textContent = agent ? `${mode} — ${agent.description || ''}` : '';
  $('chat-agent').textContent = agent ? agent.name || agent.key : '';
  if (agent) localStorage.setItem('agw.agent', agent.key);
  showEmptyState();
}

/** A chat with nothing in it yet shows its agent: name, what it does, example prompts. */
function showEmptyState() {
  const log = $('log');
  log.querySelector(':scope > .empty-state')?.remove();
  if (state.chatId || log.childElementCount) return;
  const agent = state.agents.find((a) => a.key === $('agent').value);
  if (!agent) return;
  const examples = (agent.examples || []).map((text) => h('button', {
    type: 'button',
    class: 'example',
    onclick: () => {
      $('message').value = text;
      send();
    },
  }, text));
  log.append(h('div', { class: 'empty-state', 'data-agent-key': agent.key },
    h('div', { class: 'agent-mark' }, icon('agent')),
    h('h2', {}, agent.name || agent.key),
    h('p', { class: 'muted' }, agent.description || ''),
    examples.length ? h('p', { class: 'examples-title muted' }, 'Try one of these:') : null,
    examples.length ? h('div', { class: 'examples' }, ...examples) : null));
}

/** Stops following the run this page follows, if any: the run goes on (or keeps
 *  waiting) on the service, where opening its chat finds it again. */
function leaveRun() {
  const run = state.run;
  if (run && !run.ended) {
    run.left = true;
    run.abort.abort();
  }
  state.run = null;
  setBusy(false);
}

/** "just now", "5 min ago", "3 h ago", else the date (and the time when it is this year). */
function whenText(ms, now = Date.now()) {
  if (!ms) return '';
  const seconds = Math.max(0, (now - ms) / 1000);
  if (seconds < 60) return 'just now';
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  const date = new Date(ms);
  return date.getFullYear() === new Date(now).getFullYear()
    ? date.toLocaleString([], { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' })
    : date.toLocaleDateString();
}

// Chats ----------------------------------------------------------------------------------

async function loadChats() {
  try {
    const data = await call('/api/chats', { query: { pageSize: 50 } });
    state.chats = data.chats || [];
  } catch (error) {
    $('chats-note').textContent = `History unavailable: ${error.message}`;
    return;
  }
  if (state.chats.some((chat) => chat.chatId === state.newChat?.chatId)) state.newChat = null;
  showChats();
}

/** Lists the chats, the one just started first (until ListChats has it). */
function showChats() {
  let chats = state.newChat ? [state.newChat, ...state.chats] : state.chats;
  const ended = chats.find((chat) => chat.chatId === state.ended?.chatId);
  if (ended && Number(ended.updatedAt || 0) < state.ended.at) { // its end not written yet
    chats = [{ ...ended, updatedAt: state.ended.at }, ...chats.filter((c) => c !== ended)];
  }
  $('chats-note').textContent = chats.length ? '' : 'No chats yet.';
  $('chats').replaceChildren(...chats.map((chat) => {
    const name = chat.chatName || chat.chatId;
    const when = Number(chat.updatedAt || chat.createdAt || 0);
    return h('li', {}, h('button', {
      type: 'button',
      class: chat.chatId === state.chatId ? 'current' : '',
      title: `${name}\n${when ? new Date(when).toLocaleString() : ''}`,
      'data-chat-id': chat.chatId,
      'data-agent-key': chat.agentKey || '',
      onclick: () => openChat(chat.chatId, chat.agentKey),
    },
    h('span', { class: 'chat-name' }, name),
    h('span', { class: 'chat-meta' },
      h('span', { class: 'chat-agent' }, chat.agentKey ? agentName(chat.agentKey) : ''),
      h('time', { datetime: when ? new Date(when).toISOString() : '' }, whenText(when)))));
  }));
}

async function openChat(chatId, agentKey = '') {
  try {
    const data = await call('/api/chat', { query: { chatId } });
    const live = liveRunOf(data);
    leaveRun();
    state.chatId = chatId;
    rememberChat(chatId);
    view.clear();
    $('chat-title').textContent = data.chatName || chatId;
    view.replaying = true;
    try {
      for (const ev of settledEvents(data, live)) view.handle(ev);
    } finally {
      view.replaying = false;
    }
    follower.toLatest();
    // The next message goes on with the agent of the chat's latest run.
    const queries = (data.events || []).filter((ev) => ev.type === 'request.query' && ev.agentKey);
    const latest = queries.length ? queries[queries.length - 1].agentKey : agentKey;
    if (latest && !selectAgent(latest)) setStatus(`this chat's agent ${latest} is not loaded`);
    else setStatus(`${(data.events || []).length} events replayed`);
    setMenu(false);
    loadChats();
    if (live) rejoin(live);
  } catch (error) {
    setStatus(`cannot open chat: ${error.message}`);
  }
}

/** Follows the opened chat's run in progress as if this page had started it (live.js). */
async function rejoin(live) {
  const run = { runId: live.runId, lastSeq: 0, ended: false, abort: new AbortController() };
  state.run = run;
  setBusy(true);
  setStatus(''); // the run's own line says what it waits for
  try {
    await follow(live, view, { signal: run.abort.signal }, (m) => onEvent(run, m));
    await resume(run);
  } catch (error) {
    if (error.name !== 'AbortError') {
      try {
        await resume(run, error);
      } catch (final) {
        setStatus(`error: ${final.message}`);
      }
    }
  } finally {
    run.ended = true;
    if (state.run === run) setBusy(false);
    loadChats();
  }
}

/** An empty chat with the agent chosen; a run followed until now goes on without us. */
function newChat() {
  leaveRun();
  state.chatId = '';
  rememberChat('');
  view.clear();
  $('chat-title').textContent = 'New chat';
  follower.toLatest();
  setStatus('');
  setNote('');
  setMenu(false);
  showEmptyState();
  loadChats();
}

/** Another agent for the next message; a run that waits for the user is left waiting
 *  (the agent's empty chat is shown instead: the waiting one cannot take a message). */
function changeAgent() {
  if (state.run && !state.run.ended) newChat();
  describeAgent();
}

// Runs -----------------------------------------------------------------------------------

function onEvent(run, message) {
  if (run.left) return; // the page went elsewhere meanwhile
  if (message.event === 'error') { // the stream failed after it had started
    throw new ApiError(message.data, 0);
  }
  const ev = message.data;
  if (ev.seq && ev.seq <= run.lastSeq) return; // already seen (after a resume)
  if (ev.seq) run.lastSeq = ev.seq;
  if (!run.runId && ev.runId) run.runId = ev.runId;
  if (ev.chatId && ev.chatId !== state.chatId) {
    state.chatId = ev.chatId;
    rememberChat(ev.chatId);
  }
  view.handle(ev);
  if (ev.type === 'chat.start') { // a new chat: listed at once, not after its first run
    state.newChat = {
      chatId: ev.chatId, chatName: ev.chatName, agentKey: run.agentKey, updatedAt: ev.timestamp,
    };
    showChats();
  }
  if (TERMINAL.has(ev.type)) {
    run.ended = true;
    setStatus('');
    state.ended = { chatId: ev.chatId || state.chatId, at: Number(ev.timestamp) };
    loadChats(); // the chat's time as of this run
  }
}

/** Sends the composer's message. The text stays in the composer until the service has
 *  accepted the query (its first event), so a refused message (too large, no agent,
 *  service down) is still there to be shortened or sent again. */
async function send() {
  const text = $('message').value;
  const agentKey = $('agent').value;
  if (state.run && !state.run.ended) return;
  if (!text.trim()) {
    setNote('Type a message first.');
    $('message').focus();
    return;
  }
  if (!agentKey) {
    setNote('Pick an agent first.');
    return;
  }
  setNote('');
  const run = { runId: '', agentKey, lastSeq: 0, ended: false, abort: new AbortController() };
  state.run = run;
  $('log').querySelector(':scope > .empty-state')?.remove();
  follower.toLatest(); // one's own message: back to the latest output
  setBusy(true);
  setStatus(''); // the run's own line says it is running
  let accepted = false;
  const onMessage = (m) => {
    if (!accepted) {
      accepted = true;
      if ($('message').value === text) $('message').value = '';
    }
    onEvent(run, m);
  };
  try {
    await stream('/api/query', {
      method: 'POST',
      body: { agentKey, message: text, chatId: state.chatId || undefined },
      signal: run.abort.signal,
    }, onMessage);
    await resume(run);
    setStatus(run.ended ? '' : 'the stream ended early');
  } catch (error) {
    if (!accepted && error instanceof ApiError) {
      setStatus('');
      setNote(`Not sent: ${error.message}`);
      showEmptyState();
    } else if (error.name !== 'AbortError') {
      try {
        await resume(run, error);
        setStatus('');
      } catch (final) {
        setStatus(`error: ${final.message}`);
        if (!accepted) setNote(`Not sent: ${final.message}`);
      }
    }
  } finally {
    if (!run.ended) loadChats(); // no terminal event came to refresh the list
    run.ended = true;
    if (state.run === run) setBusy(false);
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
    setStatus('cancelling…');
    const reply = await call('/api/cancel', { method: 'POST', body: { runId: run.runId } });
    if (run.ended) setStatus(''); // run.cancel came first: nothing is pending any more
    else if (!reply.cancelled) setStatus(reply.detail);
  } catch (error) {
    if (!run.ended) setStatus(`cancel failed: ${error.message}`);
  }
}

// Wiring ---------------------------------------------------------------------------------

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  send();
});
$('message').addEventListener('input', () => { if ($('message').value.trim()) setNote(''); });
$('message').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('cancel').addEventListener('click', cancel);
$('agent').addEventListener('change', changeAgent);
$('new-chat').addEventListener('click', newChat);
$('refresh-chats').addEventListener('click', loadChats);
$('menu').addEventListener('click', () => setMenu(document.body.dataset.menu !== 'open'));
$('close-menu').addEventListener('click', () => setMenu(false));
$('scrim').addEventListener('click', () => setMenu(false));

placeIcons();
setBusy(false);
setMenu(false);
loadAgents().then(() => {
  const chatId = rememberedChat(); // a reload reopens the chat it showed (and its live run)
  if (chatId) openChat(chatId);
});
