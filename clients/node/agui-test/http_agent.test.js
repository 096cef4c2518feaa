// The AG-UI endpoint of the HTTP adapter, driven by the official AG-UI client
// (@ag-ui/client's HttpAgent, which verifies every event it receives).
// AGW_HTTP_URL names the adapter; tests/gateway/test_agui_node.py starts it.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { HttpAgent } = require('@ag-ui/client');

const BASE = process.env.AGW_HTTP_URL || 'http://127.0.0.1:8080';

// Anything the client warns about (stripped fields, unknown events) fails the test.
const warnings = [];
const warn = console.warn;
console.warn = (...args) => { warnings.push(args.join(' ')); warn(...args); };
test.afterEach(() => assert.deepEqual(warnings.splice(0), []));

function agent(key) {
  return new HttpAgent({ url: `${BASE}/api/ag-ui/${key}` });
}

function recorder() {
  const seen = { types: [], finished: [] };
  return {
    seen,
    onEvent: ({ event }) => { seen.types.push(event.type); },
    onRunFinishedEvent: (params) => {
      seen.finished.push({ outcome: params.outcome, pending: params.pendingToolCallIds });
    },
  };
}

test('a run streams reasoning and text into the agent messages', async () => {
  const chat = agent('plain');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Hello' });
  const rec = recorder();
  const { newMessages } = await chat.runAgent({}, rec);
  assert.equal(rec.seen.types[0], 'RUN_STARTED');
  assert.equal(rec.seen.types.at(-1), 'RUN_FINISHED');
  assert.ok(rec.seen.types.includes('REASONING_MESSAGE_CONTENT'));
  const answer = newMessages.filter((m) => m.role === 'assistant');
  assert.deepEqual(answer.map((m) => m.content), ['Hello']);
  assert.deepEqual(rec.seen.finished, [{ outcome: 'success', pending: [] }]);
});

test('the thread continues the same chat', async () => {
  const chat = agent('plain');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Hello' });
  await chat.runAgent();
  chat.addMessage({ id: 'u2', role: 'user', content: 'Again' });
  const rec = recorder();
  await chat.runAgent({}, rec);
  const custom = rec.seen.types.filter((t) => t === 'CUSTOM').length;
  assert.equal(custom, 2); // request.query and run.start; chat.start only on the first run
  assert.deepEqual(chat.messages.filter((m) => m.role === 'assistant').map((m) => m.content), ['Hello', 'Hello']);
});

test('a frontend tool is answered through the tool-result flow', async () => {
  const chat = agent('picker');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Pick one' });
  const rec = recorder();
  await chat.runAgent({}, rec);
  const [first] = rec.seen.finished;
  assert.equal(first.outcome, 'success');
  assert.equal(first.pending.length, 1);
  const call = chat.messages.flatMap((m) => m.toolCalls || []).find((c) => c.id === first.pending[0]);
  assert.equal(call.function.name, 'pick');
  assert.deepEqual(JSON.parse(call.function.arguments), { options: ['a', 'b'] });

  chat.addMessage({ id: 'r1', role: 'tool', toolCallId: call.id, content: JSON.stringify('b') });
  const again = recorder();
  const { newMessages } = await chat.runAgent({}, again);
  assert.deepEqual(again.seen.finished, [{ outcome: 'success', pending: [] }]);
  assert.deepEqual(newMessages.filter((m) => m.role === 'assistant').map((m) => m.content), ['You picked b.']);
});

test('a question is an interrupt, answered by resume', async () => {
  const chat = agent('asker');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Choose for me' });
  let interrupts = [];
  await chat.runAgent({}, {
    onRunFinishedEvent: (params) => { if (params.outcome === 'interrupt') interrupts = params.interrupts; },
  });
  assert.equal(interrupts.length, 1);
  const [question] = interrupts;
  assert.equal(question.reason, 'question');
  assert.equal(question.message, 'Which color?');
  assert.deepEqual(question.responseSchema, { type: 'string', enum: ['red', 'blue'] });
  assert.deepEqual(chat.pendingInterrupts.map((i) => i.id), [question.id]);

  await assert.rejects(chat.runAgent(), /pending interrupt/); // the client insists on an answer
  const rec = recorder();
  const { newMessages } = await chat.runAgent(
    { resume: [{ interruptId: question.id, status: 'resolved', payload: 'blue' }] },
    rec,
  );
  assert.deepEqual(rec.seen.finished, [{ outcome: 'success', pending: [] }]);
  assert.deepEqual(newMessages.filter((m) => m.role === 'assistant' && m.content).map((m) => m.content), ['You chose blue.']);
  assert.deepEqual(chat.pendingInterrupts, []);
});

test('a plan is the agent state and its tasks are steps', async () => {
  const chat = agent('planner');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Plan it' });
  const rec = recorder();
  await chat.runAgent({}, rec);
  const steps = rec.seen.types.filter((t) => t.startsWith('STEP_'));
  assert.deepEqual(steps, ['STEP_STARTED', 'STEP_FINISHED', 'STEP_STARTED', 'STEP_FINISHED']);
  assert.deepEqual(
    chat.state.plan.tasks.map((t) => [t.taskId, t.description, t.status]),
    [['task_1', 'Greet', 'completed'], ['task_2', 'Wave', 'completed']],
  );
});

test('a failed run raises RUN_ERROR', async () => {
  const chat = agent('plain');
  chat.addMessage({ id: 'u1', role: 'user', content: 'fail' });
  const errors = [];
  await chat.runAgent({}, { onRunErrorEvent: ({ event }) => { errors.push(event); } });
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, 'PROVIDER_ERROR');
});

test('an unknown agent is refused before the run starts', async () => {
  const chat = agent('nope');
  chat.addMessage({ id: 'u1', role: 'user', content: 'Hello' });
  await assert.rejects(chat.runAgent(), /404/);
});

test('the tools given to runAgent are offered to the model and answered by the client', async () => {
  const chat = agent('copilot');
  const showMap = {
    name: 'show_map',
    description: 'Show a city on the map.',
    parameters: { type: 'object', properties: { city: { type: 'string' } } },
  };
  chat.addMessage({ id: 'u1', role: 'user', content: 'Where is Oslo?' });
  const rec = recorder();
  await chat.runAgent({ tools: [showMap] }, rec);
  const [first] = rec.seen.finished;
  assert.equal(first.pending.length, 1);
  const call = chat.messages.flatMap((m) => m.toolCalls || []).find((c) => c.id === first.pending[0]);
  assert.equal(call.function.name, 'show_map');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Oslo' });

  chat.addMessage({ id: 'r1', role: 'tool', toolCallId: call.id, content: JSON.stringify('shown') });
  const { newMessages } = await chat.runAgent({ tools: [showMap] });
  assert.deepEqual(newMessages.filter((m) => m.role === 'assistant').map((m) => m.content), ['The map shows shown.']);
});

test('a thread opened again by another client gets its messages first', async () => {
  const first = agent('plain');
  first.addMessage({ id: 'u1', role: 'user', content: 'Hello' });
  await first.runAgent();
  const answer = first.messages.find((m) => m.role === 'assistant');
  const later = new HttpAgent({ url: `${BASE}/api/ag-ui/plain`, threadId: first.threadId });
  later.addMessage({ id: 'u2', role: 'user', content: 'Again' });
  const rec = recorder();
  let snapshot = [];
  await later.runAgent({}, {
    ...rec,
    onMessagesSnapshotEvent: ({ event }) => { snapshot = event.messages; },
  });
  assert.deepEqual(rec.seen.types.slice(0, 2), ['RUN_STARTED', 'MESSAGES_SNAPSHOT']);
  // the thread in order, as the first client saw it stream, then the new message
  assert.deepEqual(
    snapshot.map((m) => [m.id, m.role, m.content]),
    [
      ['u1', 'user', 'Hello'],
      [first.messages.find((m) => m.role === 'reasoning').id, 'reasoning', 'Hm.'],
      [answer.id, 'assistant', 'Hello'],
      ['u2', 'user', 'Again'],
    ],
  );
  const ids = new Set(later.messages.map((m) => m.id));
  assert.ok(['u1', answer.id, 'u2'].every((id) => ids.has(id)));
  assert.equal(later.messages.filter((m) => m.role === 'assistant').length, 2);
});
