'use strict';
// Runs one query and prints the answer as it streams: `node example.js [AGENT] [MESSAGE]`.
// The gateway is at 127.0.0.1:50051 (`make run`) unless AGW_TARGET says otherwise.
const { AgwClient } = require('./index.js');

async function main() {
  const [agent = 'demo_oneshot', message = 'Hello from Node'] = process.argv.slice(2);
  const agw = new AgwClient();
  try {
    const stream = agw.query(agent, message);
    for await (const event of stream) {
      if (event.payload === 'reasoningDelta') process.stdout.write(`\x1b[2m${event.reasoningDelta.delta}\x1b[0m`);
      if (event.payload === 'contentStart' || event.payload === 'reasoningEnd') process.stdout.write('\n');
      if (event.payload === 'contentDelta') process.stdout.write(event.contentDelta.delta);
      if (event.payload === 'toolEnd') process.stdout.write(`\n[tool ${event.toolEnd.toolId}]\n`);
      if (event.payload === 'runError') console.error(`\nerror: ${event.runError.error.reason}: ${event.runError.error.message}`);
    }
    process.stdout.write(`\n(run ${stream.runId}, chat ${stream.chatId})\n`);
  } finally {
    agw.close();
  }
}

main().catch((error) => {
  console.error(error.message);
  process.exitCode = 1;
});
