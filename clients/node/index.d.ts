// Types of the agw Node client (index.js). Messages are the agw.v1 messages as
// @grpc/proto-loader loads them: camelCase fields, int64 as number, enums as their
// names, defaults filled in, and `payload` naming the set case of Event's oneof.
import type { ChannelCredentials, status } from '@grpc/grpc-js';

export const DEFAULT_TARGET: string;
export const TERMINAL_TYPES: Set<string>;
export const PROTO_DIR: string;
export const GOOGLEAPIS_DIR: string;
export { status };
export { credentials } from '@grpc/grpc-js';

/** A google.protobuf.Struct / Value as loaded (convert with fromStruct / fromValue). */
export interface Struct { fields: Record<string, Value> }
export interface Value {
  kind?: 'nullValue' | 'numberValue' | 'stringValue' | 'boolValue' | 'structValue' | 'listValue';
  nullValue?: 'NULL_VALUE';
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: Struct;
  listValue?: { values: Value[] };
}
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export type TaskStatus =
  | 'TASK_STATUS_UNSPECIFIED' | 'TASK_STATUS_INIT' | 'TASK_STATUS_IN_PROGRESS'
  | 'TASK_STATUS_COMPLETED' | 'TASK_STATUS_FAILED' | 'TASK_STATUS_CANCELED';
export interface Task { taskId: string; description: string; status: TaskStatus }
export interface Plan { tasks: Task[] }
export interface Usage {
  promptTokens: number; completionTokens: number; totalTokens: number;
  reasoningTokens: number; cachedTokens: number;
}
export interface ErrorDetail { reason: string; message: string; metadata: Record<string, string> }
export interface Reference {
  id: string; type: string; name: string; url: string; mimeType: string; sizeBytes: number; sha256: string;
}

/** The payloads used most; every other payload is a plain object of its proto fields. */
export interface Payloads {
  requestQuery: {
    requestId: string; role: string; message: string; agentKey: string;
    references: Reference[]; params: Struct | null; scene: Struct | null; stream: boolean;
  };
  chatStart: { chatName: string };
  runStart: { agentKey: string };
  runComplete: { finishReason: string; usage: Usage | null };
  runError: { error: ErrorDetail };
  runCancel: { reason: string };
  reasoningStart: { reasoningId: string };
  reasoningDelta: { reasoningId: string; delta: string };
  reasoningEnd: { reasoningId: string };
  reasoningSnapshot: { reasoningId: string; text: string };
  contentStart: { contentId: string };
  contentDelta: { contentId: string; delta: string };
  contentEnd: { contentId: string };
  contentSnapshot: { contentId: string; text: string };
  toolStart: {
    toolId: string; toolName: string; toolType: string; toolApi: string;
    toolParams: Struct | null; description: string; answerSchema: Struct | null; viewHtml: string;
  };
  toolArgs: { toolId: string; delta: string; chunkIndex: number };
  toolEnd: { toolId: string };
  toolResult: { toolId: string; result: Value | null; error: boolean; cached: boolean; renderedArguments: string };
  toolSnapshot: {
    toolId: string; toolName: string; toolType: string; toolApi: string;
    toolParams: Struct | null; description: string; arguments: string;
  };
  planCreate: { planId: string; plan: Plan };
  planUpdate: { planId: string; plan: Plan };
  taskStart: { description: string };
  taskComplete: { description: string };
  taskFail: { error: ErrorDetail };
  questionAsk: {
    questionId: string; question: string; options: string[]; timeoutMs: number;
    choices: { label: string; description: string; recommended: boolean }[];
    multiSelect: boolean; allowFreeText: boolean;
  };
  permissionAsk: {
    permissionId: string; toolId: string; toolName: string; arguments: string; timeoutMs: number;
  };
  heartbeat: Record<string, never>;
}

/** One event of a run: the envelope, plus exactly one payload field named by `payload`. */
export type Event = {
  seq: number;
  /** Dotted event name, e.g. "content.delta". */
  type: string;
  /** Milliseconds since the Unix epoch. */
  timestamp: number;
  chatId: string;
  runId: string;
  taskId: string;
  /** The calling tool's id on the events of a nested run (a subagent); "" otherwise. */
  parentToolId: string;
  /** Name of the set payload field, e.g. "contentDelta". */
  payload: string;
} & Partial<Payloads> & { [payload: string]: unknown };

export interface Agent {
  key: string; name: string; icon: string; description: string;
  mode: AgentMode;
  providerKey: string; model: string; tools: string[];
  /** The modes a query may choose with `mode`. */
  modes: AgentMode[];
  /** A few prompts that show what the agent does (the agent file's `examples`). */
  examples: string[];
}
export type AgentMode =
  'AGENT_MODE_UNSPECIFIED' | 'AGENT_MODE_ONESHOT' | 'AGENT_MODE_REACT' | 'AGENT_MODE_PLAN_EXECUTE';
export interface ChatSummary {
  chatId: string; chatName: string; agentKey: string; createdAt: number; updatedAt: number; runCount: number;
}
export interface SubmitResponse { accepted: boolean; outcome: string; detail: string }
export interface CancelResponse { cancelled: boolean; detail: string }
export interface ListChatsResponse { chats: ChatSummary[]; nextPageToken: string }
/** What the model calls of one UTC day, tenant, API key, agent and model used. */
export interface SpendRow {
  day: string; tenant: string; apiKey: string; agentKey: string; model: string;
  calls: number; promptTokens: number; completionTokens: number; cost: number;
}
/** One version of an agent of the agent store. */
export interface AgentVersion {
  agentKey: string; version: number; definition: Struct; createdAt: number; createdBy: string;
  change: string; sourceVersion: number; comment: string;
}
export interface GetChatResponse {
  chatId: string; chatName: string; events: Event[]; rawMessages: Struct[]; references: Reference[];
}
export interface UploadResponse { reference: Reference; event: Event }

export interface ToolCall {
  toolId: string; name: string; type: string; arguments: string;
  result: Json; error: boolean; cached: boolean; done: boolean;
}
/** What `fold` makes of one run's events. */
export interface RunResult {
  runId: string; chatId: string;
  /** Text of the last answer block. */
  answer: string;
  contents: string[]; reasoning: string; reasonings: string[];
  toolCalls: ToolCall[]; plan: Plan | null;
  outcome: '' | 'complete' | 'error' | 'cancel';
  finishReason: string; usage: Usage | null; error: ErrorDetail | null; cancelReason: string;
}

export interface ClientOptions {
  /** TLS or other channel credentials; insecure (plaintext) by default. */
  credentials?: ChannelCredentials;
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Further metadata sent with every call. */
  metadata?: Record<string, string>;
  /** Deadline of unary calls (default 30000); streams get `streamTimeoutMs` (none by default). */
  timeoutMs?: number;
  streamTimeoutMs?: number | null;
  /** Further attempts of unary calls answered UNAVAILABLE (default 3, at most 4). */
  retries?: number;
  /** How often in a row a stream re-attaches to its run (or sends a query the gateway
   *  refused as it shut down) without a new event, before it throws (default 8; 0: never). */
  reattachAttempts?: number;
  channelOptions?: Record<string, unknown>;
  /** Where agw/v1/*.proto are; the repository's proto/ (or AGW_PROTO_DIR) by default. */
  protoDir?: string;
}

/**
 * The reasons of agw/v1/errors.proto (`ErrorReason` without its `ERROR_REASON_` prefix).
 * A newer gateway may send a reason not listed here: `reason` is typed as a string too.
 */
export type ErrorReason =
  | 'INTERNAL' | 'INVALID_REQUEST'
  | 'NOT_FOUND' | 'AGENT_NOT_FOUND' | 'CHAT_NOT_FOUND' | 'RUN_NOT_FOUND' | 'TOOL_NOT_FOUND'
  | 'CONFLICT' | 'CHAT_BUSY' | 'PROVIDER_NOT_CONFIGURED'
  | 'OVERLOADED' | 'PAYLOAD_TOO_LARGE' | 'BUDGET_EXHAUSTED' | 'QUOTA_EXCEEDED'
  | 'SHUTTING_DOWN' | 'PROVIDER_ERROR' | 'PROVIDER_STREAM_ERROR' | 'PROVIDER_TIMEOUT'
  | 'OWNER_LOST' | 'BUS_UNAVAILABLE' | 'RUN_HANDED_OVER'
  | 'STORE_FAILED' | 'SANDBOX_UNAVAILABLE'
  | 'PLAN_FAILED' | 'TASK_FAILED' | 'TASK_NOT_REPORTED' | 'UNAUTHENTICATED' | 'PERMISSION_DENIED';

export class AgwError extends Error {
  constructor(
    code: number, details: string,
    info?: { reason?: string; domain?: string; metadata?: Record<string, string> },
  );
  code: number;
  codeName: string;
  details: string;
  /** Stable reason from google.rpc.ErrorInfo, e.g. "AGENT_NOT_FOUND". */
  reason: ErrorReason | (string & {});
  domain: string;
  metadata: Record<string, string>;
  /** A grpc-js error as the class of its reason's family (`ERROR_CLASSES`), else AgwError. */
  static from(error: unknown): AgwError;
}
/** A reason family's error; `status` is the gRPC status the gateway sends it with. */
export class AgentNotFound extends AgwError { static status: number }
export class ChatNotFound extends AgwError { static status: number }
export class RunNotFound extends AgwError { static status: number }
export class ToolNotFound extends AgwError { static status: number }
export class InvalidRequest extends AgwError { static status: number }
export class Conflict extends AgwError { static status: number }
export class ChatBusy extends Conflict {}
export class ProviderNotConfigured extends AgwError { static status: number }
export class Overloaded extends AgwError { static status: number }
export class PayloadTooLarge extends AgwError { static status: number }
export class BudgetExhausted extends AgwError { static status: number }
/** A quota of the caller's tenant or API key is used up; retry after `retryAfter` seconds. */
export class QuotaExceeded extends AgwError { static status: number; readonly retryAfter?: number }
export class ShuttingDown extends AgwError { static status: number }
export class ProviderError extends AgwError { static status: number }
export class ProviderTimeout extends AgwError { static status: number }
export class OwnerLost extends AgwError { static status: number }
export class RunHandedOver extends AgwError { static status: number }
export class BusUnavailable extends AgwError { static status: number }
/** Reason → the class of its family; reasons not listed arrive as plain AgwError. */
export const ERROR_CLASSES: Readonly<Partial<Record<ErrorReason, typeof AgwError & { status: number }>>>;
/** Every reason declared in agw/v1/errors.proto under `protoDir` (loaded once per directory). */
export function errorReasons(protoDir?: string): Set<ErrorReason>;

export class RunFailed extends Error {
  result: RunResult;
  /** The run.error's reason, or the run.cancel's reason ("cancel", "disconnect", ...). */
  reason: ErrorReason | (string & {});
}

/**
 * A run's events. It follows its run: after RUN_HANDED_OVER (or a lost connection) it
 * re-attaches after `lastSeq` through the same target; a query refused SHUTTING_DOWN is sent
 * again (see `ClientOptions.reattachAttempts`).
 */
export class QueryStream implements AsyncIterable<Event> {
  runId: string;
  chatId: string;
  /** The seq of the last event of the run it gave. */
  lastSeq: number;
  /** How often it re-attached to its run (or sent its query again). */
  reattached: number;
  events: Event[];
  [Symbol.asyncIterator](): AsyncIterator<Event>;
  result(): Promise<RunResult>;
  cancel(): Promise<CancelResponse>;
  close(): void;
}

export interface QueryFields {
  chatId?: string; requestId?: string; role?: string;
  references?: Reference[]; params?: Record<string, Json>; scene?: Record<string, Json>;
  stream?: boolean; debugLevel?: string;
  /** One of the agent's `modes`, e.g. 'AGENT_MODE_PLAN_EXECUTE'. */
  mode?: AgentMode;
  [field: string]: unknown;
}

export class AgwClient {
  constructor(target?: string, options?: ClientOptions);
  /** The reasons the loaded proto declares. */
  reasons: Set<ErrorReason>;
  query(agentKey: string, message: string, fields?: QueryFields): QueryStream;
  ask(agentKey: string, message: string, fields?: QueryFields): Promise<RunResult>;
  attach(runId: string, afterSeq?: number): QueryStream;
  submit(
    runId: string, toolId: string, payload: Json,
    options?: { chatId?: string; viewId?: string; requestId?: string },
  ): Promise<SubmitResponse>;
  cancel(runId: string): Promise<CancelResponse>;
  listAgents(): Promise<Agent[]>;
  getAgent(agentKey: string): Promise<{ agent: Agent; definition: Record<string, Json> }>;
  listChats(
    options?: { pageSize?: number; pageToken?: string; nameContains?: string },
  ): Promise<ListChatsResponse>;
  renameChat(chatId: string, chatName: string): Promise<{ chat: ChatSummary; event: Event }>;
  deleteChat(chatId: string, options?: { cancelActiveRun?: boolean }): Promise<{
    chatId: string; cancelledRunId: string; runsDeleted: number; uploadsDeleted: number;
  }>;
  getSpend(options?: { tenant?: string; firstDay?: string; lastDay?: string }): Promise<{
    rows: SpendRow[]; currency: string; firstDay: string; lastDay: string;
  }>;
  createAgent(
    agentKey: string, definition: Record<string, Json> | string, options?: { comment?: string },
  ): Promise<AgentVersion>;
  updateAgent(
    agentKey: string, definition: Record<string, Json> | string,
    options?: { expectedVersion?: number; comment?: string },
  ): Promise<AgentVersion>;
  rollbackAgent(
    agentKey: string, version: number, options?: { expectedVersion?: number; comment?: string },
  ): Promise<AgentVersion>;
  listAgentVersions(agentKey: string): Promise<AgentVersion[]>;
  getChat(
    chatId: string, options?: { includeRawMessages?: boolean; liveRunOnly?: boolean },
  ): Promise<GetChatResponse>;
  upload(
    name: string, content: Buffer, options?: { mimeType?: string; chatId?: string },
  ): Promise<UploadResponse>;
  close(): void;
}

export function loadProto(protoDir?: string): Record<string, unknown>;
export function fold(events: Iterable<Event>): RunResult;
export function fromValue(value: Value | null | undefined): Json;
export function fromStruct(struct: Struct | null | undefined): Record<string, Json>;
export function toValue(value: Json | undefined): Value;
export function toStruct(object: Record<string, Json>): Struct;
