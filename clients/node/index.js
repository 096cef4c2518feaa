'use strict';
/**
 * Node client of the agw agent gateway: `agw.v1.AgentGateway` over gRPC, with the
 * official @grpc/grpc-js, its messages loaded from the repository's `proto/` at run time
 * by @grpc/proto-loader (no generated code, no build step). Types: index.d.ts.
 *
 *   const { AgwClient } = require('@agw/client');
 *   const agw = new AgwClient();                       // 127.0.0.1:50051 or AGW_TARGET
 *   for await (const event of agw.query('demo_oneshot', 'Hello')) console.log(event.type);
 *   console.log((await agw.ask('demo_oneshot', 'Hello')).answer);
 *   agw.close();
 *
 * Messages are plain objects with camelCase fields; int64 fields are numbers, enums are
 * their names, and an event's `payload` names its set payload field (e.g. "contentDelta").
 *
 * A refused call rejects with an `AgwError` whose `reason` is one of the `ErrorReason`s of
 * agw/v1/errors.proto (`errorReasons()`); known reasons get their family's subclass
 * (`AgentNotFound`, `ChatBusy`, `Overloaded`, ... see `ERROR_CLASSES`).
 */
const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const DEFAULT_TARGET = '127.0.0.1:50051';
const PROTO_DIR = process.env.AGW_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
// google/api/annotations.proto and http.proto, which gateway.proto imports.
const GOOGLEAPIS_DIR = path.join(__dirname, 'googleapis');
const PROTO_FILES = ['agw/v1/gateway.proto', 'agw/v1/errors.proto'];
const REASON_PREFIX = 'ERROR_REASON_';
const SERVICE = 'agw.v1.AgentGateway';
const UNARY_METHODS = ['Submit', 'Cancel', 'ListAgents', 'GetAgent', 'ListChats', 'GetChat', 'Upload'];
const TERMINAL_TYPES = new Set(['run.complete', 'run.error', 'run.cancel']);

/** Loads `agw/v1/gateway.proto` and `errors.proto` (and what they import) from `protoDir`. */
function loadProto(protoDir = PROTO_DIR) {
  const definition = protoLoader.loadSync(PROTO_FILES, {
    includeDirs: [protoDir, GOOGLEAPIS_DIR],
    keepCase: false,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).agw.v1;
}

// google.rpc.Status and ErrorInfo, to read the reason the gateway attaches to a status.
const rpcTypes = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: { nested: { Any: { fields: { typeUrl: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } } } },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: 'string', id: 1 },
                domain: { type: 'string', id: 2 },
                metadata: { keyType: 'string', type: 'string', id: 3 },
              },
            },
          },
        },
      },
    },
  },
});
const StatusType = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfoType = rpcTypes.lookupType('google.rpc.ErrorInfo');

/** The reasons of the `agw.v1.ErrorReason` enum of a loaded proto, as sent (no prefix). */
function reasonsOf(agw) {
  return agw.ErrorReason.type.value
    .map((value) => value.name.slice(REASON_PREFIX.length))
    .filter((reason) => reason !== 'UNSPECIFIED');
}

const reasonsByDir = new Map();
/** Every reason declared in `agw/v1/errors.proto` under `protoDir`, as a Set. */
function errorReasons(protoDir = PROTO_DIR) {
  if (!reasonsByDir.has(protoDir)) reasonsByDir.set(protoDir, new Set(reasonsOf(loadProto(protoDir))));
  return reasonsByDir.get(protoDir);
}

/** A gRPC status from the gateway; `reason` is its stable machine-readable reason. */
class AgwError extends Error {
  constructor(code, details, { reason = '', domain = '', metadata = {} } = {}) {
    super(`${statusName(code)}: ${details}${reason ? ` (${reason})` : ''}`);
    this.name = new.target.name;
    this.code = code;
    this.codeName = statusName(code);
    this.details = details;
    this.reason = reason;
    this.domain = domain;
    this.metadata = metadata;
  }

  /** Translates a grpc-js ServiceError. */
  static from(error) {
    if (error instanceof AgwError || error.code === undefined) return error;
    const info = {};
    const [bin] = error.metadata ? error.metadata.get('grpc-status-details-bin') : [];
    if (bin) {
      const status = StatusType.decode(bin);
      for (const detail of status.details) {
        if (detail.typeUrl.endsWith('/google.rpc.ErrorInfo')) {
          const decoded = ErrorInfoType.decode(detail.value);
          Object.assign(info, { reason: decoded.reason, domain: decoded.domain, metadata: { ...decoded.metadata } });
          break;
        }
      }
    }
    const family = ERROR_CLASSES[info.reason];
    const Class = family && family.status === error.code ? family : AgwError;
    return new Class(error.code, error.details, info);
  }
}

// One class per reason family; `status` is the gRPC status the gateway sends it with.
/** NOT_FOUND: no agent has the requested key. */
class AgentNotFound extends AgwError { static status = grpc.status.NOT_FOUND; }
/** NOT_FOUND: no chat has the requested id. */
class ChatNotFound extends AgwError { static status = grpc.status.NOT_FOUND; }
/** NOT_FOUND: no active, recent or archived run has the requested id. */
class RunNotFound extends AgwError { static status = grpc.status.NOT_FOUND; }
/** NOT_FOUND: an agent names a tool that is not defined. */
class ToolNotFound extends AgwError { static status = grpc.status.NOT_FOUND; }
/** INVALID_ARGUMENT: the request is malformed or misses a required field. */
class InvalidRequest extends AgwError { static status = grpc.status.INVALID_ARGUMENT; }
/** FAILED_PRECONDITION: the request conflicts with the gateway's current state. */
class Conflict extends AgwError { static status = grpc.status.FAILED_PRECONDITION; }
/** FAILED_PRECONDITION: the chat has an active run and the strategy is to reject. */
class ChatBusy extends Conflict {}
/** FAILED_PRECONDITION: an agent names a provider that no setting defines. */
class ProviderNotConfigured extends AgwError { static status = grpc.status.FAILED_PRECONDITION; }
/** RESOURCE_EXHAUSTED: too many active runs; retry later. */
class Overloaded extends AgwError { static status = grpc.status.RESOURCE_EXHAUSTED; }
/** RESOURCE_EXHAUSTED: a payload or upload exceeds its configured limit. */
class PayloadTooLarge extends AgwError { static status = grpc.status.RESOURCE_EXHAUSTED; }
/** RESOURCE_EXHAUSTED: the caller's tenant or API key used up a quota; `retryAfter` is
 *  how many seconds to wait (from `metadata.retry_after_s`). */
class QuotaExceeded extends AgwError {
  static status = grpc.status.RESOURCE_EXHAUSTED;
  get retryAfter() {
    const seconds = Number(this.metadata.retry_after_s);
    return Number.isFinite(seconds) ? seconds : undefined;
  }
}
/** RESOURCE_EXHAUSTED: a run used up one of its budgets (in a run: RunFailed). */
class BudgetExhausted extends AgwError { static status = grpc.status.RESOURCE_EXHAUSTED; }
/** UNAVAILABLE: the gateway is draining; retry on another instance. */
class ShuttingDown extends AgwError { static status = grpc.status.UNAVAILABLE; }
/** UNAVAILABLE: a model provider failed (in a run: RunFailed with this reason). */
class ProviderError extends AgwError { static status = grpc.status.UNAVAILABLE; }
/** UNAVAILABLE: the replica executing the run was lost (in a run: RunFailed with this reason). */
class OwnerLost extends AgwError { static status = grpc.status.UNAVAILABLE; }
/** UNAVAILABLE: the run's process shut down and handed it over; it goes on: re-attach with
 *  `metadata.run_id` and `metadata.after_seq`. */
class RunHandedOver extends AgwError { static status = grpc.status.UNAVAILABLE; }
/** UNAVAILABLE: the gateway's run bus (Redis) is unreachable; nothing was done, retry. */
class BusUnavailable extends AgwError { static status = grpc.status.UNAVAILABLE; }
/** DEADLINE_EXCEEDED: a model provider timed out (in a run: RunFailed with this reason). */
class ProviderTimeout extends AgwError { static status = grpc.status.DEADLINE_EXCEEDED; }

/** The one table: reason (an `ErrorReason` without its prefix) → its family's class. */
const ERROR_CLASSES = Object.freeze({
  AGENT_NOT_FOUND: AgentNotFound,
  CHAT_NOT_FOUND: ChatNotFound,
  RUN_NOT_FOUND: RunNotFound,
  TOOL_NOT_FOUND: ToolNotFound,
  INVALID_REQUEST: InvalidRequest,
  CONFLICT: Conflict,
  CHAT_BUSY: ChatBusy,
  PROVIDER_NOT_CONFIGURED: ProviderNotConfigured,
  OVERLOADED: Overloaded,
  PAYLOAD_TOO_LARGE: PayloadTooLarge,
  BUDGET_EXHAUSTED: BudgetExhausted,
  QUOTA_EXCEEDED: QuotaExceeded,
  SHUTTING_DOWN: ShuttingDown,
  PROVIDER_ERROR: ProviderError,
  PROVIDER_STREAM_ERROR: ProviderError,
  PROVIDER_TIMEOUT: ProviderTimeout,
  OWNER_LOST: OwnerLost,
  BUS_UNAVAILABLE: BusUnavailable,
  RUN_HANDED_OVER: RunHandedOver,
});

function definitionOf(definition) {
  return typeof definition === 'string' ? { definitionText: definition } : { definition: toStruct(definition) };
}

/** A run that ended with `run.error` (or `run.cancel`), from `ask()`. */
class RunFailed extends Error {
  constructor(result) {
    const why = result.outcome === 'error' ? `${result.error.reason}: ${result.error.message}` : `cancelled (${result.cancelReason})`;
    super(`run ${result.runId} ${result.outcome === 'error' ? 'failed' : 'was'}: ${why}`);
    this.name = 'RunFailed';
    this.result = result;
    this.reason = result.outcome === 'error' ? result.error.reason : result.cancelReason;
  }
}

function statusName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) || String(code);
}

/** A google.protobuf.Value (as loaded) to a plain JS value. */
function fromValue(value) {
  if (!value || !value.kind) return null;
  switch (value.kind) {
    case 'nullValue': return null;
    case 'numberValue': return value.numberValue;
    case 'stringValue': return value.stringValue;
    case 'boolValue': return value.boolValue;
    case 'structValue': return fromStruct(value.structValue);
    case 'listValue': return (value.listValue.values || []).map(fromValue);
    default: return null;
  }
}

/** A google.protobuf.Struct (as loaded) to a plain object. */
function fromStruct(struct) {
  const out = {};
  for (const [key, value] of Object.entries((struct && struct.fields) || {})) out[key] = fromValue(value);
  return out;
}

/** A plain JS value to a google.protobuf.Value. */
function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof value === 'number') return { numberValue: value };
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  return { structValue: toStruct(value) };
}

/** A plain object to a google.protobuf.Struct. */
function toStruct(object) {
  const fields = {};
  for (const [key, value] of Object.entries(object)) fields[key] = toValue(value);
  return { fields };
}

/** Folds a run's events into its answer, reasoning, tool calls, plan and outcome. */
function fold(events) {
  const result = { runId: '', chatId: '', contents: [], reasonings: [], toolCalls: [], plan: null, outcome: '', finishReason: '', usage: null, error: null, cancelReason: '' };
  const blocks = new Map();
  const calls = new Map();
  const call = (id) => {
    if (!calls.has(id)) {
      const created = { toolId: id, name: '', type: '', arguments: '', result: null, error: false, cached: false, done: false };
      calls.set(id, created);
      result.toolCalls.push(created);
    }
    return calls.get(id);
  };
  const block = (list, id, text) => { list.push(text); blocks.set(id, [list, list.length - 1]); };
  const append = (id, delta) => { const at = blocks.get(id); if (at) at[0][at[1]] += delta; };
  for (const event of events) {
    result.runId ||= event.runId;
    result.chatId ||= event.chatId;
    const p = event[event.payload];
    switch (event.payload) {
      case 'reasoningStart': block(result.reasonings, p.reasoningId, ''); break;
      case 'reasoningDelta': append(p.reasoningId, p.delta); break;
      case 'reasoningSnapshot': block(result.reasonings, p.reasoningId, p.text); break;
      case 'contentStart': block(result.contents, p.contentId, ''); break;
      case 'contentDelta': append(p.contentId, p.delta); break;
      case 'contentSnapshot': block(result.contents, p.contentId, p.text); break;
      case 'toolStart': Object.assign(call(p.toolId), { name: p.toolName, type: p.toolType }); break;
      case 'toolArgs': call(p.toolId).arguments += p.delta; break;
      case 'toolSnapshot': Object.assign(call(p.toolId), { name: p.toolName, type: p.toolType, arguments: p.arguments }); break;
      case 'toolResult': Object.assign(call(p.toolId), { result: fromValue(p.result), error: p.error, cached: Boolean(p.cached), done: true }); break;
      case 'planCreate': case 'planUpdate': case 'planRevise': result.plan = p.plan; break;
      case 'runComplete': Object.assign(result, { outcome: 'complete', finishReason: p.finishReason, usage: p.usage }); break;
      case 'runError': Object.assign(result, { outcome: 'error', error: p.error }); break;
      case 'runCancel': Object.assign(result, { outcome: 'cancel', cancelReason: p.reason }); break;
      default: break;
    }
  }
  result.answer = result.contents.length ? result.contents[result.contents.length - 1] : '';
  result.reasoning = result.reasonings.join('\n\n');
  return result;
}

// The reasons of an UNAVAILABLE after which a stream goes on by re-attaching to its run: it
// goes on (handed over by a process shutting down; or the connection, the process, the run
// bus was lost).
const FOLLOWED = new Set(['', 'RUN_HANDED_OVER', 'SHUTTING_DOWN', 'BUS_UNAVAILABLE']);

/**
 * The events of one run: an async iterable; `runId`/`chatId` are set from the first event.
 *
 * The stream follows its run: once its run's id is known, a stream cut with UNAVAILABLE —
 * the gateway process shut down and handed the run over (RUN_HANDED_OVER), or the connection
 * was lost — re-attaches through the same target after `lastSeq` (one stream, no gap, no
 * duplicate); a query refused SHUTTING_DOWN (nothing was started) is sent again. At most
 * `reattachAttempts` times in a row without a new event, backing off from 200 ms to 5 s;
 * `reattached` counts them.
 */
class QueryStream {
  constructor(client, call, runId = '', { request = null, afterSeq = 0 } = {}) {
    this.client = client;
    this.call = call;
    this.runId = runId;
    this.chatId = '';
    this.lastSeq = afterSeq;
    this.events = [];
    this.reattached = 0;
    this.request = request; // a query's, to send again when refused unstarted
    this.closed = false;
  }

  async *[Symbol.asyncIterator]() {
    let failures = 0; // attempts in a row without a new event
    for (;;) {
      try {
        for await (const event of this.call) {
          this.runId ||= event.runId;
          this.chatId ||= event.chatId;
          if (event.seq) {
            this.lastSeq = event.seq;
            failures = 0;
          }
          this.events.push(event);
          yield event;
        }
        return;
      } catch (error) {
        const failure = AgwError.from(error);
        const step = this.closed ? null : this._next(failure, failures);
        if (!step) throw failure;
        failures += 1;
        this.reattached += 1;
        await new Promise((resolve) => setTimeout(resolve, Math.min(200 * 2 ** (failures - 1), 5000)));
        this.call = step === 'query'
          ? this.client._stream('Query', this.request)
          : this.client._stream('Attach', { runId: this.runId, afterSeq: this.lastSeq });
      }
    }
  }

  _next(failure, failures) {
    if (failure.code !== grpc.status.UNAVAILABLE || failures >= this.client.reattachAttempts) return null;
    if (this.runId && FOLLOWED.has(failure.reason || '')) return 'attach';
    if (!this.runId && failure.reason === 'SHUTTING_DOWN' && this.request) return 'query';
    return null;
  }

  /** Reads the stream to its end and folds it (see `fold`). */
  async result() {
    for await (const _ of this); // eslint-disable-line no-unused-vars, no-empty
    return fold(this.events);
  }

  /** Asks the gateway to cancel this run; the stream then ends with `run.cancel`. */
  cancel() {
    if (!this.runId) throw new Error('the run id is not known before the first event');
    return this.client.cancel(this.runId);
  }

  /** Drops the stream; the run goes on unless the gateway cancels runs whose client left. */
  close() {
    this.closed = true;
    this.call.cancel();
  }
}

class AgwClient {
  /**
   * @param {string} [target] host:port; AGW_TARGET or 127.0.0.1:50051 by default.
   * @param {import('./index').ClientOptions} [options]
   */
  constructor(target = process.env.AGW_TARGET || DEFAULT_TARGET, options = {}) {
    const {
      credentials, token, metadata = {}, timeoutMs = 30000, streamTimeoutMs = null, retries = 3,
      reattachAttempts = 8, channelOptions = {}, protoDir,
    } = options;
    const agw = loadProto(protoDir);
    /** The reasons the loaded proto declares (see `errorReasons`). */
    this.reasons = new Set(reasonsOf(agw));
    this.timeoutMs = timeoutMs;
    this.streamTimeoutMs = streamTimeoutMs;
    this.reattachAttempts = reattachAttempts;
    this.metadata = new grpc.Metadata();
    for (const [key, value] of Object.entries(metadata)) this.metadata.set(key, value);
    if (token) this.metadata.set('authorization', `Bearer ${token}`);
    const serviceConfig = retries > 0 ? {
      methodConfig: [{
        name: UNARY_METHODS.map((method) => ({ service: SERVICE, method })),
        retryPolicy: { maxAttempts: retries + 1, initialBackoff: '0.2s', maxBackoff: '5s', backoffMultiplier: 2, retryableStatusCodes: ['UNAVAILABLE'] },
      }],
    } : null;
    this.stub = new agw.AgentGateway(target, credentials || grpc.credentials.createInsecure(), {
      ...(serviceConfig ? { 'grpc.service_config': JSON.stringify(serviceConfig) } : {}),
      ...channelOptions,
    });
  }

  _options(timeoutMs) {
    return timeoutMs ? { deadline: Date.now() + timeoutMs } : {};
  }

  _unary(method, request, timeoutMs = this.timeoutMs) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this.metadata, this._options(timeoutMs), (error, response) => {
        if (error) reject(AgwError.from(error));
        else resolve(response);
      });
    });
  }

  _stream(method, request) {
    return this.stub[method](request, this.metadata, this._options(this.streamTimeoutMs));
  }

  /** Starts a run; `fields` are further QueryRequest fields (chatId, params, scene, ...). */
  query(agentKey, message, fields = {}) {
    const request = { ...fields, agentKey, message };
    for (const key of ['params', 'scene']) if (request[key]) request[key] = toStruct(request[key]);
    return new QueryStream(this, this._stream('Query', request), '', { request });
  }

  /** Runs a query to its end and folds it; rejects with RunFailed unless it completed. */
  async ask(agentKey, message, fields = {}) {
    const result = await this.query(agentKey, message, fields).result();
    if (result.outcome !== 'complete') throw new RunFailed(result);
    return result;
  }

  /** Re-joins a run: the events after `afterSeq`, then the live ones to the end. */
  attach(runId, afterSeq = 0) {
    return new QueryStream(this, this._stream('Attach', { runId, afterSeq }), runId, { afterSeq });
  }

  /** Answers a waiting frontend tool, approval, permission or question with `payload`. */
  submit(runId, toolId, payload, { chatId = '', viewId = '', requestId = '' } = {}) {
    return this._unary('Submit', { requestId: requestId || crypto.randomUUID(), runId, toolId, chatId, viewId, payload: toValue(payload) });
  }

  /** Stops a running run; its stream ends with `run.cancel`. */
  cancel(runId) {
    return this._unary('Cancel', { requestId: crypto.randomUUID(), runId });
  }

  async listAgents() {
    return (await this._unary('ListAgents', {})).agents;
  }

  async getAgent(agentKey) {
    const response = await this._unary('GetAgent', { agentKey });
    return { agent: response.agent, definition: fromStruct(response.definition) };
  }

  listChats({ pageSize = 0, pageToken = '', nameContains = '' } = {}) {
    return this._unary('ListChats', { pageSize, pageToken, nameContains });
  }

  /** Renames a chat; resolves to `{ chat, event }`, the `chat.update` event recorded. */
  renameChat(chatId, chatName) {
    return this._unary('RenameChat', { requestId: crypto.randomUUID(), chatId, chatName });
  }

  /** Deletes a chat and everything of it; `cancelActiveRun` cancels its run in progress
   *  first (else such a chat is refused with ChatBusy). */
  deleteChat(chatId, { cancelActiveRun = false } = {}) {
    return this._unary('DeleteChat', { requestId: crypto.randomUUID(), chatId, cancelActiveRun });
  }

  /** What runs used, by day, tenant, API key, agent and model (this month by default). */
  getSpend({ tenant = '', firstDay = '', lastDay = '' } = {}) {
    return this._unary('GetSpend', { tenant, firstDay, lastDay });
  }

  /** Version 1 of an agent in the agent store (role "admin"): `definition` as an object,
   *  or as an agent file's text. */
  createAgent(agentKey, definition, { comment = '' } = {}) {
    return this._unary('CreateAgent', { agentKey, comment, ...definitionOf(definition) });
  }

  /** The next version of a stored agent (role "admin"). */
  updateAgent(agentKey, definition, { expectedVersion = 0, comment = '' } = {}) {
    return this._unary('UpdateAgent', { agentKey, expectedVersion, comment, ...definitionOf(definition) });
  }

  /** A new version of a stored agent with the definition of its `version` (role "admin"). */
  rollbackAgent(agentKey, version, { expectedVersion = 0, comment = '' } = {}) {
    return this._unary('RollbackAgent', { agentKey, version, expectedVersion, comment });
  }

  /** Every version of a stored agent, newest first (role "admin"). */
  async listAgentVersions(agentKey) {
    return (await this._unary('ListAgentVersions', { agentKey })).versions;
  }

  getChat(chatId, { includeRawMessages = false, liveRunOnly = false } = {}) {
    return this._unary('GetChat', { chatId, includeRawMessages, liveRunOnly });
  }

  upload(name, content, { mimeType = '', chatId = '' } = {}) {
    return this._unary('Upload', { requestId: crypto.randomUUID(), name, content, mimeType, chatId });
  }

  close() {
    this.stub.close();
  }
}

module.exports = {
  AgwClient,
  AgwError,
  AgentNotFound,
  ChatNotFound,
  RunNotFound,
  ToolNotFound,
  InvalidRequest,
  Conflict,
  ChatBusy,
  ProviderNotConfigured,
  Overloaded,
  PayloadTooLarge,
  BudgetExhausted,
  QuotaExceeded,
  ShuttingDown,
  ProviderError,
  ProviderTimeout,
  OwnerLost,
  RunHandedOver,
  BusUnavailable,
  ERROR_CLASSES,
  RunFailed,
  QueryStream,
  DEFAULT_TARGET,
  TERMINAL_TYPES,
  PROTO_DIR,
  GOOGLEAPIS_DIR,
  loadProto,
  errorReasons,
  fold,
  fromValue,
  fromStruct,
  toValue,
  toStruct,
  status: grpc.status,
  credentials: grpc.credentials,
};
