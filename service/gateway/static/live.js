// A chat's run in progress, joined again when the chat is opened — after a reload, in
// another tab, on another device. GetChat names the run (`liveRun`); the page replays
// it from its first event (Attach, afterSeq=0) and follows it live, so a frontend tool,
// a question, a permission or a plan approval it waits for can be answered here.
// The open chat is kept in the address (#chat=<id>), so a reload opens it again.

import { stream } from './api.js';

/** The chat's run in progress (GetChat's `liveRun`), or null. */
export function liveRunOf(chat) {
  const live = chat.liveRun;
  return live && live.runId ? live : null;
}

/** The chat's history without the live run, which is replayed whole from its own events. */
export function settledEvents(chat, live) {
  return (chat.events || []).filter((ev) => !live || ev.runId !== live.runId);
}

/** Follows the live run from its first event, handing each SSE message to `onMessage`.
 *  Its events up to the seq GetChat saw are history to the view (client-side actions
 *  are shown, not performed again); what waits is answerable all the same. */
export function follow(live, view, { signal }, onMessage) {
  const upTo = Number(live.lastSeq || 0);
  const path = `/api/runs/${encodeURIComponent(live.runId)}/events?afterSeq=0`;
  return stream(path, { signal }, (message) => {
    const seq = Number(message.data?.seq || 0);
    view.replaying = seq > 0 && seq <= upTo;
    try {
      onMessage(message);
    } finally {
      view.replaying = false;
    }
  });
}

/** Keeps `chatId` in the address ('' for a new chat), replacing the history entry. */
export function rememberChat(chatId) {
  const url = chatId ? `#chat=${encodeURIComponent(chatId)}` : location.pathname + location.search;
  if (url !== location.hash) history.replaceState(null, '', url);
}

/** The chat the address names, or ''. */
export function rememberedChat() {
  const match = /^#chat=(.+)$/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : '';
}
