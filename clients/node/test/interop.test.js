'use strict';
// Interop of the Node client with a running gateway, whose address is in AGW_TARGET.
// tests/clients/test_node_client.py starts the gateway, with a fake model that answers
// "Hi" with "Hel" + "lo", "hang" with "so far" and then nothing until cancelled, and
// "fail" with an HTTP 500.
const assert = require('node:assert/strict');
const { after, test } = require('node:test');
const {
  AgwClient, AgwError, AgentNotFound, ERROR_CLASSES, RunFailed, RunNotFound, errorReasons, status,
} = require('../index.js');

const agw = new AgwClient(process.env.AGW_TARGET);
after(() => agw.close());

test('Query streams typed events in order', async () => {
  const stream = agw.query('plain', 'Hi', { requestId: 'node-1', params: { from: 'node' } });
  const events = [];
  for await (const event of stream) events.push(event);
  assert.deepEqual(events.map((e) => e.type), [
    'request.query', 'chat.start', 'run.start',
    'content.start', 'content.delta', 'content.delta', 'content.end', 'run.complete',
  ]);
  assert.deepEqual(events.map((e) => e.seq), [1, 2, 3, 4, 5, 6, 7, 8]);
  for (const event of events) {
    assert.equal(event.runId, events[0].runId);
    assert.equal(event.chatId, events[0].chatId);
    assert.equal(typeof event.timestamp, 'number');
    // the payload case matches the dotted type: contentDelta <-> content.delta
    assert.equal(event.payload.replace(/[A-Z]/, (c) => `.${c.toLowerCase()}`), event.type);
  }
  assert.equal(events[0].requestQuery.requestId, 'node-1');
  assert.equal(events[0].requestQuery.params.fields.from.stringValue, 'node');
  assert.deepEqual(events.slice(4, 6).map((e) => e.contentDelta.delta), ['Hel', 'lo']);
  assert.equal(events[4].contentDelta.contentId, `${events[0].runId}_c_1`);
  assert.equal(events[7].runComplete.finishReason, 'stop');
  assert.equal(stream.runId, events[0].runId);
});

test('ask folds the answer and keeps the chat', async () => {
  const first = await agw.ask('plain', 'Hi');
  assert.equal(first.answer, 'Hello');
  const second = await agw.ask('plain', 'Hi', { chatId: first.chatId });
  assert.equal(second.chatId, first.chatId);
  assert.notEqual(second.runId, first.runId);
  const history = await agw.getChat(first.chatId);
  assert.equal(history.events.filter((e) => e.type === 'run.complete').length, 2);
  const nameOnly = await agw.getChat(first.chatId, { liveRunOnly: true });
  assert.deepEqual([nameOnly.chatName, nameOnly.events.length], [history.chatName, 0]);
});

test('a status carries its code, its reason and the class of the reason family', async () => {
  await assert.rejects(agw.ask('nope', 'Hi'), (error) => {
    assert.ok(error instanceof AgentNotFound && error instanceof AgwError);
    assert.equal(error.name, 'AgentNotFound');
    assert.equal(error.code, status.NOT_FOUND);
    assert.equal(error.reason, 'AGENT_NOT_FOUND');
    assert.ok(agw.reasons.has(error.reason));
    assert.equal(error.domain, 'agw.v1');
    return true;
  });
  await assert.rejects(agw.cancel('no-such-run'), (error) => {
    assert.ok(error instanceof RunNotFound);
    assert.deepEqual([error.code, error.reason], [status.NOT_FOUND, 'RUN_NOT_FOUND']);
    return true;
  });
});

test('every reason family is a reason of the proto, sent with its status', () => {
  const declared = errorReasons();
  assert.deepEqual([...agw.reasons], [...declared]);
  for (const [reason, Class] of Object.entries(ERROR_CLASSES)) {
    assert.ok(declared.has(reason), reason);
    assert.equal(typeof Class.status, 'number', reason);
  }
});

test('cancel ends the stream with run.cancel', async () => {
  const stream = agw.query('plain', 'hang');
  const kinds = [];
  for await (const event of stream) {
    kinds.push(event.type);
    if (event.type === 'content.delta') assert.equal((await stream.cancel()).cancelled, true);
  }
  assert.deepEqual(kinds.slice(-3), ['content.delta', 'content.end', 'run.cancel']);
});

test('a failed run rejects ask with RunFailed', async () => {
  await assert.rejects(agw.ask('plain', 'fail'), (error) => {
    assert.ok(error instanceof RunFailed);
    assert.equal(error.reason, 'PROVIDER_ERROR');
    assert.equal(error.result.outcome, 'error');
    return true;
  });
});

test('agents are listed and described', async () => {
  const agents = await agw.listAgents();
  assert.deepEqual(agents.map((a) => [a.key, a.mode]), [['plain', 'AGENT_MODE_ONESHOT']]);
  const { agent, definition } = await agw.getAgent('plain');
  assert.equal(agent.key, 'plain');
  assert.equal(definition.plain.systemPrompt, 'You are terse.');
});
