// The HTTP API of the adapter: unary calls (JSON envelope) and streams (SSE over fetch).
//
// EventSource can neither POST nor set headers, so streams are read with fetch: each
// SSE message is parsed here ("id", "event", "data"; comments such as heartbeats are
// skipped) and handed over as {id, event, data}.

export class ApiError extends Error {
  constructor(envelope, httpStatus) {
    super(envelope.msg || `HTTP ${httpStatus}`);
    this.code = envelope.code;
    this.status = envelope.status || '';
    this.reason = envelope.reason || '';
    this.httpStatus = httpStatus;
  }
}

async function envelopeOf(response) {
  let body;
  try {
    body = await response.json();
  } catch {
    body = { code: 2, msg: `HTTP ${response.status} ${response.statusText}` };
  }
  return body;
}

/** Calls a unary route; resolves to `data`, rejects with ApiError when `code` is not 0. */
export async function call(path, { method = 'GET', body, query } = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) url.searchParams.set(key, value);
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const response = await fetch(url, init);
  const envelope = await envelopeOf(response);
  if (envelope.code !== 0) throw new ApiError(envelope, response.status);
  return envelope.data;
}

/**
 * Opens a stream and calls `onMessage({id, event, data})` for each SSE message.
 * Resolves when the server ends the stream; rejects with ApiError when the call is
 * refused before streaming (JSON envelope), or with the network error.
 */
export async function stream(path, { method = 'GET', body, lastEventId, signal } = {}, onMessage) {
  const headers = { Accept: 'text/event-stream' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (lastEventId) headers['Last-Event-ID'] = String(lastEventId);
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (response.status === 204) return;
  const type = response.headers.get('Content-Type') || '';
  if (!response.ok || !type.startsWith('text/event-stream')) {
    throw new ApiError(await envelopeOf(response), response.status);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const message = parseBlock(block);
      if (message) onMessage(message);
    }
  }
}

function parseBlock(block) {
  let id = '';
  let event = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (!line || line.startsWith(':')) continue; // comment: heartbeat
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'id') id = value;
    else if (field === 'event') event = value;
    else if (field === 'data') data.push(value);
  }
  if (!data.length) return null;
  return { id, event, data: JSON.parse(data.join('\n')) };
}
