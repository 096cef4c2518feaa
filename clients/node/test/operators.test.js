'use strict';
// The operators' calls of the Node client against a running gateway (AGW_TARGET), as
// tests/clients/test_node_client.py starts it: chats renamed, searched and deleted, and the
// spend ledger read.
const assert = require('node:assert/strict');
const { after, test } = require('node:test');
const { AgwClient, ChatNotFound } = require('../index.js');

const agw = new AgwClient(process.env.AGW_TARGET);
after(() => agw.close());

test('a chat is renamed, found by its name, deleted, and the ledger counts its run', async () => {
  const { chatId } = await agw.ask('plain', 'Hi');
  const { chat, event } = await agw.renameChat(chatId, 'From Node');
  assert.equal(chat.chatName, 'From Node');
  assert.equal(event.type, 'chat.update');
  assert.equal(event.chatUpdate.chatName, 'From Node');
  assert.equal(event.chatUpdate.previousChatName, 'Hi');
  const found = await agw.listChats({ nameContains: 'from node' });
  assert.deepEqual(found.chats.map((c) => c.chatId), [chatId]);
  const history = await agw.getChat(chatId);
  assert.equal(history.events.at(-1).type, 'chat.update');

  const spend = await agw.getSpend();
  const plain = spend.rows.filter((row) => row.agentKey === 'plain');
  assert.ok(plain.length >= 1 && plain.every((row) => row.calls >= 1));
  assert.equal(spend.currency, 'USD');

  const deleted = await agw.deleteChat(chatId);
  assert.deepEqual([deleted.chatId, deleted.runsDeleted], [chatId, 1]);
  await assert.rejects(agw.getChat(chatId), ChatNotFound);
  await assert.rejects(agw.deleteChat(chatId), ChatNotFound);
});
