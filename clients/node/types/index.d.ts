// Type declarations of pg-idempotency (hand-written: the package is plain
// CommonJS JavaScript that runs as published, with no build step; the test
// suite type-checks these against real uses with tsc).  TypeScript users
// need @types/pg, as anyone using node-postgres from TypeScript has.

import type { Pool, PoolClient, ClientBase } from 'pg';

/** A number of milliseconds, or a PostgreSQL interval ('30 seconds', '24 hours'). */
export type Duration = number | string;

/** Anything that runs one statement: a Pool, a Client, a PoolClient. */
export type Queryable = Pool | ClientBase;

export type IsolationLevel = 'read committed' | 'repeatable read' | 'serializable';

export type HeaderMap = Record<string, string | string[]>;

// ------------------------------------------------------------ SQL calls

export interface ClaimOptions {
  /** JSON value fingerprinted by the extension; null/undefined: no check. */
  request?: unknown;
  scope?: string;
  ttl?: Duration;
  /** Two-phase mode: the claim may be committed and finished later with its token. */
  lease?: Duration | null;
  wait?: boolean;
  /** Keep the request so idem_recover() can finish the claim (needs a lease). */
  keepRequest?: boolean;
}

/** expired: the key's retention passed and the server remembers it (idempotency.key_memory); nothing ran. */
export type ClaimStatus = 'claimed' | 'completed' | 'in_progress' | 'mismatch' | 'expired';

export interface ClaimResult {
  status: ClaimStatus;
  /** Fencing token, as a decimal string (bigint in SQL); pass it back as it is. */
  token: string | null;
  recoveryPoint: string | null;
  responseCode: number | null;
  responseBody: unknown;
  responseHeaders: HeaderMap | null;
  responseRaw: Buffer | null;
  expiresAt: Date | null;
}

/** A response to store: status (default 200), and a JSON body or raw bytes, with headers. */
export interface StoredResponse {
  status?: number;
  body?: unknown;
  headers?: HeaderMap | null;
  raw?: Buffer | Uint8Array | string | null;
}

export interface HolderOptions {
  scope?: string;
  /** The claim's token (two-phase); without it, the claim of this transaction. */
  token?: string | bigint | number | null;
}

/** One live key, as lookup() gives it. */
export interface LiveLookupResult {
  status: 'in_progress' | 'completed' | 'released';
  token: string;
  recoveryPoint: string | null;
  responseCode: number | null;
  responseBody: unknown;
  responseHeaders: HeaderMap | null;
  responseRaw: Buffer | null;
  claimedAt: Date;
  expiresAt: Date;
  leaseExpiresAt: Date | null;
  request: unknown;
}

/** A key whose retention passed and that the server remembers (idempotency.key_memory): nothing else is kept. */
export interface ExpiredLookupResult {
  status: 'expired';
  token: null;
  recoveryPoint: null;
  responseCode: null;
  responseBody: null;
  responseHeaders: null;
  responseRaw: null;
  claimedAt: null;
  expiresAt: null;
  leaseExpiresAt: null;
  request: null;
}

export type LookupResult = LiveLookupResult | ExpiredLookupResult;

export interface RecoveredClaim {
  key: string;
  scope: string;
  token: string;
  recoveryPoint: string | null;
  request: unknown;
  lapsedAt: Date;
}

export function claim(db: Queryable, key: string, options?: ClaimOptions): Promise<ClaimResult>;
export function complete(db: Queryable, key: string, response?: StoredResponse, options?: HolderOptions): Promise<void>;
export function checkpoint(db: Queryable, key: string, recoveryPoint: string, options?: HolderOptions): Promise<void>;
export function release(db: Queryable, key: string, options?: HolderOptions): Promise<void>;
export function lookup(db: Queryable, key: string, options?: { scope?: string }): Promise<LookupResult | null>;
export function recover(db: Queryable, options: { lease: Duration; scope?: string | null; maxKeys?: number }): Promise<RecoveredClaim[]>;
/**
 * The tenant whose rows the transaction writes, for a message ledger, stream
 * positions and producer sequences distributed by Citus (extension 0.5.0,
 * `idempotency.citus_distribute()`): the consumed id, the position or the
 * sequence is in the tenant's shard. A string, or an integer sent as its
 * decimal text. Given, the overload with the tenant is called (the
 * four-argument `idem_consume_message(s)`, the tenant forms of `idem_assign`,
 * `idem_advance`, `idem_positions` and `idem_sequence`); not given (or null),
 * the call without it, as before (what a 0.4.0 server has). A server whose
 * tables are not distributed does not use it. A key's tenant is its `scope`.
 */
export type Tenant = string | number | bigint;
/** What a receiver's tenant function answers: a tenant, or none (the three-argument call). */
export type TenantAnswer = Tenant | null | undefined | Promise<Tenant | null | undefined>;
export interface ConsumeMessageOptions {
  ttl?: Duration;
  tenant?: Tenant | null;
}
export function consumeMessage(db: Queryable, consumer: string, messageId: string | number,
  options?: ConsumeMessageOptions): Promise<boolean>;
export function consumeMessages(db: Queryable, consumer: string, messageIds: ReadonlyArray<string | number>,
  options?: ConsumeMessageOptions): Promise<string[]>;

// ------------------------------------------------------------ ordered streams

/**
 * An offset, generation, epoch or sequence number (SQL bigint): a safe
 * integer, a bigint or a decimal string.  Results give them as decimal
 * strings, which BigInt() reads exactly.
 */
export type Int8 = number | bigint | string;

export interface Seek {
  part: number;
  /** The next offset to process, as a decimal string; null for a partition never seen (start by your policy). */
  nextOffset: string | null;
}

/** Offsets first..last (both included, decimal strings) of a batch not applied yet. */
export interface OffsetRange {
  first: string;
  last: string;
}

export interface Position {
  part: number;
  /** null for a partition assigned but never advanced. */
  nextOffset: string | null;
  /** null when only unfenced advances were made. */
  generation: string | null;
  updatedAt: Date;
}

/** 'new' or 'gap': process the message; 'duplicate' or 'fenced' (an older epoch): skip it. */
export type SequenceAnswer = 'new' | 'duplicate' | 'gap' | 'fenced';

/** The stream calls' tenant, for stream positions and producer sequences distributed by Citus (see Tenant). */
export interface StreamTenantOptions {
  tenant?: Tenant | null;
}
/** idem_assign: where to seek each partition, in partition order.  StaleGenerationError (ID001): nothing changed. */
export function assign(db: Queryable, consumer: string, stream: string, parts: ReadonlyArray<number>,
  generation: Int8, options?: StreamTenantOptions): Promise<Seek[]>;
/** idem_advance in the caller's transaction: the part of the batch not applied yet, or null. */
export function advance(db: Queryable, consumer: string, stream: string, part: number,
  firstOffset: Int8, lastOffset: Int8,
  options?: StreamTenantOptions & { generation?: Int8 | null }): Promise<OffsetRange | null>;
export function positions(db: Queryable, consumer: string, stream: string,
  options?: StreamTenantOptions): Promise<Position[]>;
/** idem_sequence; with strict, a gap is SequenceGapError (ID002) and nothing is recorded. */
export function sequence(db: Queryable, consumer: string, producer: string, epoch: Int8, seq: Int8,
  options?: StreamTenantOptions & { strict?: boolean }): Promise<SequenceAnswer>;

// ------------------------------------------------------------ helpers

export interface TransactionOptions {
  isolationLevel?: IsolationLevel;
  /** How many times 40P01/40001 run the transaction again (default 3). */
  retries?: number;
}

export function transaction<T>(pool: Pool, fn: (tx: PoolClient, info: { attempt: number }) => Promise<T>,
  options?: TransactionOptions): Promise<T>;

export interface Outcome {
  status: ClaimStatus;
  /** True for a stored response given back (status 'completed'). */
  replayed: boolean;
  /** Whether the response is stored under the key now. */
  stored: boolean;
  /** The stored response (completed), or the one the function returned (claimed). */
  response?: StoredResponse & { status: number };
  token?: string;
  expiresAt?: Date | null;
}

export interface RunContext {
  key: string;
  scope: string;
  /** The last recovery point, when the key was released or taken over before. */
  recoveryPoint: string | null;
  checkpoint(point: string): Promise<void>;
}

interface RunOptionsBase extends TransactionOptions {
  key: string;
  scope?: string;
  request?: unknown;
  ttl?: Duration;
  wait?: boolean;
  /** With wait: the bound of idempotency.wait_timeout, set for this transaction. */
  waitTimeout?: Duration;
  /** Keep 5xx responses out of the store (default true): the work rolls back. */
  releaseServerErrors?: boolean;
}

export type RunOptions = RunOptionsBase & ({ pool: Pool; client?: undefined } | { client: ClientBase; pool?: undefined });

export type Work = (tx: ClientBase, ctx: RunContext) => Promise<StoredResponse | undefined | void>;

export function run(options: RunOptions, fn: Work): Promise<Outcome>;

export type IdempotentOptions<A extends unknown[]> = TransactionOptions & {
  /** Selects the key from the arguments. */
  key: (...args: A) => string;
  /** What a reuse of the key is compared with (default: the arguments). */
  request?: (...args: A) => unknown;
  scope?: string;
  ttl?: Duration;
  wait?: boolean;
  waitTimeout?: Duration;
  /** The function's value as JSON to store (default: as it is). */
  serialize?: (value: any) => unknown;
  /** The stored JSON back, on a replay (default: as stored). */
  deserialize?: (json: any) => any;
} & ({ pool: Pool; client?: undefined } | { client: ClientBase; pool?: undefined });

/** fn made to run once per key: returns its value, or for a key done before the stored value. */
export function idempotent<A extends unknown[], T>(fn: (tx: ClientBase, ...args: A) => Promise<T>,
  options: IdempotentOptions<A>): (...args: A) => Promise<T>;

export interface HolderContext {
  key: string;
  scope: string;
  token: string;
  recoveryPoint: string | null;
  request: unknown;
  /** Records how far the work got, in a transaction of its own, with write's statements. */
  checkpoint(point: string, write?: (tx: PoolClient) => Promise<unknown>): Promise<void>;
}

export interface TwoPhaseOptions extends TransactionOptions {
  pool: Pool;
  key: string;
  lease: Duration;
  scope?: string;
  request?: unknown;
  ttl?: Duration;
  /** Default true: the request is kept so that recoverLapsed can finish the work. */
  keepRequest?: boolean;
  wait?: boolean;
  waitTimeout?: Duration;
  /** Default true: a thrown error releases the claim. */
  releaseOnError?: boolean;
  releaseServerErrors?: boolean;
  /** Writes made in the transaction that completes the key. */
  beforeComplete?: (tx: PoolClient, response: StoredResponse & { status: number }, ctx: HolderContext) => Promise<unknown>;
}

export function twoPhase(options: TwoPhaseOptions,
  fn: (ctx: HolderContext) => Promise<StoredResponse | undefined | void>): Promise<Outcome>;

export interface RecoverOptions extends TransactionOptions {
  pool: Pool;
  lease: Duration;
  scope?: string | null;
  maxKeys?: number;
  releaseOnError?: boolean;
  releaseServerErrors?: boolean;
  beforeComplete?: TwoPhaseOptions['beforeComplete'];
}

export type RecoverResult =
  | { key: string; scope: string; outcome: Outcome; error?: undefined }
  | { key: string; scope: string; error: unknown; outcome?: undefined };

export function recoverLapsed(options: RecoverOptions,
  fn: (ctx: HolderContext) => Promise<StoredResponse | undefined | void>): Promise<RecoverResult[]>;

export type ConsumeOptions<M> = TransactionOptions & {
  consumer: string;
  ttl?: Duration;
  /** The batch's tenant (one for the batch), for a message ledger distributed by Citus. */
  tenant?: Tenant | null;
  /** The message's id (default: m.id for objects, else m itself). */
  id?: (message: M) => string | number;
} & ({ pool: Pool; client?: undefined } | { client: ClientBase; pool?: undefined });

export interface ConsumeResult<M, R> {
  fresh: M[];
  duplicates: M[];
  result: R | undefined;
}

export function consume<M, R = unknown>(options: ConsumeOptions<M>, messages: ReadonlyArray<M>,
  fn?: (tx: ClientBase, fresh: M[], info: { duplicates: M[] }) => Promise<R>): Promise<ConsumeResult<M, R>>;

export type StreamConsumerOptions<R> = TransactionOptions & {
  consumer: string;
  stream: string;
  /** A record's offset (default: the record itself if not an object, else record.offset). */
  offset?: (record: R) => Int8;
  /** The generation before any assign() (default null: unfenced). */
  generation?: Int8 | null;
  /** The tenant every call passes (assign, process, positions), for stream positions distributed by Citus. */
  tenant?: Tenant | null;
} & ({ pool: Pool; client?: undefined } | { client: ClientBase; pool?: undefined });

export interface ProcessResult<R, T> {
  /** The records given to the function: those not applied before. */
  fresh: R[];
  /** The part of the batch not applied before, or null (the function was not called). */
  range: OffsetRange | null;
  result: T | undefined;
}

/** One consumer of a partitioned log, its positions moved in the transaction of each batch. */
export class StreamConsumer<R = unknown> {
  constructor(options: StreamConsumerOptions<R>);
  readonly consumer: string;
  readonly stream: string;
  /** The generation process() passes: the last assign()'s. */
  generation: Int8 | null;
  /** The tenant every call passes (null: the calls without one). */
  tenant: Tenant | null;
  /** On assignment: stores the generation, returns where to seek each partition. */
  assign(parts: ReadonlyArray<number>, generation: Int8): Promise<Seek[]>;
  /** One transaction: advance, fn with the records not applied yet (if any), commit. */
  process<T = unknown>(part: number, records: ReadonlyArray<R>,
    fn?: (tx: ClientBase, fresh: R[], info: { range: OffsetRange; part: number }) => Promise<T>): Promise<ProcessResult<R, T>>;
  positions(): Promise<Position[]>;
}

export function streamConsumer<R = unknown>(options: StreamConsumerOptions<R>): StreamConsumer<R>;

// ------------------------------------------------------------ HTTP

/** What a handler finds in req.idempotency (Express) or request.idempotency (Fastify). */
export interface IdempotencyContext {
  /** The key, or null on a route with required: false and no key sent. */
  key: string | null;
  scope: string;
  /** The open transaction (same-transaction mode); null in two-phase mode (lease). */
  tx: PoolClient | null;
  /** The fencing token in two-phase mode, else null. */
  token: string | null;
  recoveryPoint: string | null;
  replayed: false;
  checkpoint(point: string, write?: (tx: PoolClient) => Promise<unknown>): Promise<void>;
}

export interface HttpOptions {
  pool: Pool;
  /** Retention of a key, passed as ttl to every claim and advertised (default '24 hours'). */
  ttl?: Duration;
  /** The server's idempotency.key_memory, advertised in the policy and the 410 answer (default: not said). */
  keyMemory?: Duration | null;
  /** Default true: a request without Idempotency-Key is 400; false: it runs without dedup. */
  required?: boolean;
  /** Methods that take a key (default ['POST', 'PATCH']; null: every method). */
  methods?: string[] | null;
  /** The header field of the key (default 'Idempotency-Key'). */
  header?: string;
  /** Takes the key from the request instead of the header field (null/undefined: missing). */
  key?: (req: any) => string | null | undefined;
  /** The authenticated caller (default: req.user.id / .sub / .username, or req.user as a string); none: refused. */
  caller?: (req: any) => string | number | null | undefined;
  /** Default false: a request whose caller cannot be established is refused (500 no-caller); true: such
   * requests share the route's keys (for an API without authentication). */
  anonymous?: boolean;
  /** The whole scope (default: [caller, method, route] as JSON); empty: refused unless anonymous. */
  scope?: (req: any, parts: { caller: string; method: string; route: string; path: string }) => string | null | undefined;
  /** The JSON value fingerprinted (default: { method, path, query, body }). */
  fingerprint?: (req: any) => unknown;
  /** Dotted paths of the JSON body's fields the fingerprint keeps instead of the whole body. */
  fingerprintFields?: string[];
  /** Wait this long for a request in flight with the same key instead of answering 409 at once. */
  wait?: Duration | false;
  /** Two-phase mode: commit the claim before the handler runs, with this lease. */
  lease?: Duration | null;
  keepRequest?: boolean;
  /** Response headers stored and replayed besides the defaults (Set-Cookie never is). */
  replayHeaders?: string[];
  /** 5xx answers: 'rollback' (default: nothing kept), 'release' (the writes commit, the key is freed), 'store'. */
  serverErrors?: 'rollback' | 'release' | 'store';
  /** Answer to 55P03/57014 and to a wait past its bound (default 409). */
  timeoutStatus?: 409 | 503;
  /** Answer to a response over idempotency.max_response_bytes, 54000 (default 500). */
  tooLargeStatus?: 500 | 413;
  /** Retry-After seconds on 409 and 503 (default 1; null: none). */
  retryAfter?: number | null;
  /** Where your policy page is: problem types and a Link header point there (default: none; types are tag: URIs). */
  docsUrl?: string | null;
  /** Longest key, in bytes (the extension's idempotency.max_key_length, default 255). */
  maxKeyBytes?: number;
  isolationLevel?: IsolationLevel;
  retries?: number;
  /** Called with unexpected errors and misconfigurations (default: console.error). */
  onError?: (err: unknown) => void;
}

export interface HttpResponse {
  status: number;
  headers: Record<string, string | string[] | number>;
  body: Buffer;
}

export interface HttpSession {
  readonly view: IdempotencyContext;
}

/** The framework-free engine the adapters use, for other frameworks. */
export class HttpIdempotency {
  constructor(options: HttpOptions);
  applies(method: string): boolean;
  begin(input: {
    req: unknown; method: string; url: string; route?: string; keyValues: string[] | string | undefined;
    contentType?: string;
  }):
    Promise<{ reply: HttpResponse; session?: undefined } | { session: HttpSession; reply?: undefined }>;
  finish(session: HttpSession, captured: HttpResponse): Promise<HttpResponse>;
  abandon(session: HttpSession): Promise<void>;
  problem(status: number, slug: string, title: string, detail: string, extraHeaders?: Record<string, string>): HttpResponse;
  /** The published policy (retention, key format, scope), the same document as the Python adapters'. */
  docs(): Record<string, unknown>;
}

export function parseIdempotencyKey(values: string[] | string | undefined,
  options?: { maxKeyBytes?: number; header?: string }): string;

// ------------------------------------------------------------ the outbox (../outbox-behaviour.md)

export interface PublishOptions {
  payload?: unknown;
  key?: string | null;
  headers?: Record<string, unknown> | null;
  raw?: Buffer | Uint8Array | null;
  /**
   * The event's tenant, for the tenant outbox distributed by Citus (extension
   * 0.5.0; relayed by an OutboxRelay with `tenants: true`). Given, the
   * overload with the tenant is called; a server without the tenant outbox
   * does not use it (see Tenant).
   */
  tenant?: Tenant | null;
}
/** idem_publish in db's transaction; returns the event id (uuid text). */
export function publish(db: Queryable, topic: string, options?: PublishOptions): Promise<string>;

export interface OutboxEvent {
  eventId: string;
  key: string | null;
  /** the payload's JSON as PostgreSQL prints jsonb (the bytes a relay sends) */
  payloadText: string | null;
  payload: unknown;
  raw: Buffer | null;
  headers: Record<string, unknown> | null;
  publishedAt: Date;
  /**
   * Read through the tenant overload (a relay with `tenants: true`, or
   * `tenant`): the event's tenant as text, null for an event of the node's
   * own outbox; absent otherwise.
   */
  tenant?: string | null;
  /** With tenant: the event's number in its (topic, tenant), 1, 2, 3... (decimal string), or null. */
  seq?: string | null;
}
/**
 * Which outbox a relay call reads (extension 0.5.0): neither option, the
 * node's own (0.4.0's calls); `tenants: true`, every tenant's events of the
 * tenant outbox distributed by Citus (on the coordinator; tenant NULL);
 * `tenant`, one tenant's. Without Citus' tenant outbox the server reads its
 * own outbox for these too.
 */
export type OutboxTenantOptions =
  | { tenants?: false | null; tenant?: Tenant | null }
  | { tenants: true; tenant?: null };
export interface OutboxBatch {
  /** decimal string; null when there is nothing to relay */
  batch: string | null;
  events: OutboxEvent[];
}
export function outboxNext(db: Queryable, relay: string, topic: string,
  options?: OutboxTenantOptions & { maxEvents?: number; generation?: Int8 | null }): Promise<OutboxBatch>;
export function outboxAck(db: Queryable, relay: string, topic: string, batch: Int8,
  options?: OutboxTenantOptions & { generation?: Int8 | null }): Promise<boolean>;
export function outboxDeadLetter(db: Queryable, relay: string, topic: string, eventId: string,
  options?: OutboxTenantOptions & { reason?: string | null; attempts?: number | null }): Promise<void>;

export interface DeadLetter extends OutboxEvent {
  relay: string;
  topic: string;
  reason: string | null;
  attempts: number | null;
  failedAt: Date;
}
/** idem_outbox_dead_letters: the calling role's dead letters, of one relay and topic or all. */
export function outboxDeadLetters(db: Queryable, options?: { relay?: string | null; topic?: string | null }): Promise<DeadLetter[]>;

export interface SinkContext { topic: string; relay: string; attempt: number }
/** Delivers one event; throws (DeliveryError) when the attempt failed. */
export type Sink = (event: OutboxEvent, ctx: SinkContext) => Promise<void> | void;

export type WebhookSecret = string | Buffer | Uint8Array;
export interface WebhookSinkOptions {
  url: string | ((event: OutboxEvent) => string);
  secret: WebhookSecret;
  /** milliseconds (15000) */
  timeout?: number;
  headers?: Record<string, string>;
  fetch?: typeof fetch;
  /** seconds since the epoch, for webhook-timestamp */
  now?: () => number;
}
export function webhookSink(options: WebhookSinkOptions): Sink;
export interface RedisStreamSinkOptions {
  /** a node-redis (sendCommand) or ioredis (call) client */
  client: unknown;
  stream?: string | ((event: OutboxEvent) => string);
  maxLen?: number;
  /** an event added within that many seconds is not added again */
  dedupSeconds?: number | null;
}
export function redisStreamSink(options: RedisStreamSinkOptions): Sink;

export interface OutboxRelayOptions {
  pool: Pool;
  relay: string;
  topic: string;
  sink: Sink;
  maxEvents?: number;
  generation?: Int8 | null;
  maxAttempts?: number;
  initialDelay?: number;
  maxDelay?: number;
  onDeadLetter?: 'continue' | 'stop';
  pollInterval?: number;
  acknowledgeLoss?: boolean;
  /**
   * true: relay every tenant's events of the tenant outbox distributed by
   * Citus (extension 0.5.0; connect to the coordinator): next, ack and dead
   * letters through the tenant overloads with tenant NULL. Without Citus'
   * tenant outbox the server relays its own outbox then.
   */
  tenants?: boolean;
  onEvent?: (kind: 'delivered' | 'attempt-failed' | 'dead-letter' | 'acked' | 'idle' | 'loss' | 'database-unavailable' | 'fenced',
    info: Record<string, unknown>) => void;
  random?: () => number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}
export interface RelayRound {
  batch: string | null;
  delivered: number;
  deadLettered: number;
  events: number;
  acked?: boolean;
  lost?: boolean;
}
export class OutboxRelay {
  constructor(options: OutboxRelayOptions);
  readonly stopped: boolean;
  /** Whether the relay reads the tenant outbox (the option tenants). */
  readonly tenants: boolean;
  runOnce(): Promise<RelayRound>;
  run(): Promise<void>;
  stop(): void;
}
export function outboxRelay(options: OutboxRelayOptions): OutboxRelay;

export interface WebhookEvent {
  id: string;
  timestamp: number;
  headers: unknown;
  body: Buffer;
  text(): string;
  json(): any;
}
export interface WebhookVerifyOptions {
  /** seconds (300) */
  tolerance?: number;
  /** seconds since the epoch */
  now?: number;
}
export function signWebhook(secret: WebhookSecret, id: string, timestamp: number | string, body: Buffer | string): string;
export function webhookHeaders(secret: WebhookSecret, id: string, timestamp: number,
  body: Buffer | string): { 'webhook-id': string; 'webhook-timestamp': string; 'webhook-signature': string };
export function verifyWebhook(secret: WebhookSecret | WebhookSecret[], headers: unknown, body: Buffer | string,
  options?: WebhookVerifyOptions): { id: string; timestamp: number };
export function generateSecret(): string;
export interface ReceiveWebhookOptions extends WebhookVerifyOptions, TransactionOptions {
  consumer: string;
  secret: WebhookSecret | WebhookSecret[];
  pool?: Pool;
  client?: PoolClient;
  ttl?: Duration;
  /** The delivery's tenant, or a function of the verified event giving it (for a message ledger distributed by Citus). */
  tenant?: Tenant | null | ((event: WebhookEvent) => TenantAnswer);
  onError?: (err: unknown) => void;
}
export function receiveWebhook<T>(options: ReceiveWebhookOptions, request: { headers: unknown; body: Buffer | string },
  fn: (tx: PoolClient, event: WebhookEvent) => Promise<T>): Promise<{ id: string; duplicate: boolean; result: T | undefined }>;

// ------------------------------------------------------------ errors

export class IdempotencyError extends Error {
  /** The SQLSTATE, when the error came from the database. */
  code?: string;
}
export class ProgrammingError extends IdempotencyError {}
/** The library is set up so that it cannot keep its contract (no caller, a body no parser read). */
export class ConfigurationError extends ProgrammingError {}
/** idempotent(): another call holds the key. */
export class KeyInProgressError extends IdempotencyError {}
/** idempotent(): the key was used with other arguments. */
export class KeyMismatchError extends IdempotencyError {}
/** idempotent(): the key expired and is remembered (idempotency.key_memory); fn did not run. */
export class KeyExpiredError extends IdempotencyError {}
export class StaleTokenError extends IdempotencyError {}
export class KeyBusyError extends IdempotencyError {}
export class ResponseTooLargeError extends IdempotencyError {}
/** ID001: the partition was assigned to another consumer with a higher generation; stop consuming it. */
export class StaleGenerationError extends IdempotencyError {}
/** ID002: sequence(..., { strict: true }) saw a gap. */
export class SequenceGapError extends IdempotencyError {}
export class TransientError extends IdempotencyError {}
export class StoreUnavailableError extends IdempotencyError {}
/** ID003: events of the relay expired before it acknowledged them; ack `batch` to go on. */
export class OutboxLostError extends IdempotencyError {
  batch: string | null;
}
/** The relay stopped on an event that kept failing (onDeadLetter: 'stop'). */
export class DeadLetterError extends IdempotencyError {
  event: OutboxEvent;
  failure: unknown;
}
/** One failed delivery attempt. */
export class DeliveryError extends IdempotencyError {
  status?: number;
  permanent: boolean;
  constructor(message: string, options?: { status?: number; permanent?: boolean; cause?: unknown });
}
/** A webhook the receiver refuses (400 webhook-malformed, 401 webhook-timestamp or webhook-signature). */
export class WebhookVerificationError extends IdempotencyError {
  status: number;
  slug: string;
}
export class BadIdempotencyKeyError extends Error {
  slug: string;
  title: string;
  detail: string;
}
