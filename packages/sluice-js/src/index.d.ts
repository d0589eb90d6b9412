// Types of sluice-limits (written by hand; test/types/consumer.ts exercises every documented
// API under tsc --strict, for ES module and CommonJS consumers).

/** A duration: milliseconds, or a string with a unit ("250ms", "2s", "1.5min"). */
export type Duration = number | string;

/** The algorithms of the core. */
export type Algorithm =
  | 'token_bucket'
  | 'gcra'
  | 'leaky_bucket'
  | 'sliding_log'
  | 'sliding_window'
  | 'fixed_window';

export type Priority = 'high' | 'normal' | 'low';

/** The algorithm names, in the order of the core's codes (frozen). */
export declare const ALGORITHMS: readonly Algorithm[];

/**
 * Compiles the WebAssembly core asynchronously (once). Needed only where synchronous
 * compilation is refused (a browser page's main thread may refuse it); elsewhere the first
 * limiter compiles it.
 */
export declare function ready(): Promise<void>;

/**
 * The key as `sluice serve` stores a key taken from a header, a cookie or a query parameter:
 * HMAC-SHA256(salt, key), its first 16 bytes as 32 lowercase hex digits. `salt` is the value of
 * the gateway's `store.key_salt` ('' when it has none); strings are read as UTF-8.
 */
export declare function keyHash(salt: string | Uint8Array, key: string | Uint8Array): string;

/** Timer functions, replaceable together with `now` for tests. */
export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface QueueOptions {
  /** The most tasks waiting at once (default: no bound). */
  depth?: number;
  /** The longest a task may wait (default: no bound). */
  maxWait?: Duration;
}

export interface RateLimiterOptions {
  /** Default 'token_bucket'. */
  algorithm?: Algorithm | (string & {});
  /** The burst: the most tokens at once (a whole number, at least 1). */
  capacity: number;
  /** The refill rate, as the gateway reads it: "10/s", "100/min", "0.5/s", "10 per 90s". */
  rate: string;
  /** The wait queue; `false`: none (a task that finds no token is refused at once). */
  queue?: QueueOptions | false;
  /** The run timeout of every task (default: none); a task may set its own. */
  timeout?: Duration;
  /** A monotonic clock in integer nanoseconds (default: process.hrtime / performance.now). */
  now?: () => bigint;
  /** Timers driven with `now` (default: the global ones). */
  timers?: Timers;
}

/** What a task function receives. */
export interface TaskContext {
  /** The task's signal, aborted too when its run timeout passes (undefined without either). */
  signal: AbortSignal | undefined;
}

/** A task: called once admitted, with its context. */
export type Task<T> = (context: TaskContext) => T | PromiseLike<T>;

export interface ScheduleOptions {
  /** Tokens this task takes (default 1). */
  cost?: number;
  /** Default 'normal'; higher priorities go first, FIFO within each. */
  priority?: Priority;
  /** Withdraws the task while it waits: it rejects with AbortError and spends nothing. */
  signal?: AbortSignal;
  /** This task's own maximum wait (0: never wait). */
  maxWait?: Duration;
  /** This task's run timeout: TimeoutError (reason 'run') once it passes; its signal aborts. */
  timeout?: Duration;
}

export interface ChargeOptions {
  /**
   * The most tokens the bucket may owe beyond empty after this charge (a whole number, or
   * Infinity: no cap, the default); what does not fit is forgiven. The window algorithms
   * carry no debt and ignore it.
   */
  maxDebt?: number;
}

export interface RefundOptions {
  /** How long ago the tokens were admitted (default 0): a window gives back only what it still counts. */
  ago?: Duration;
}

/** The event names, as p-queue's: a task started, resolved, rejected; nothing waits; nothing runs. */
export type QueueEvent = 'active' | 'completed' | 'error' | 'empty' | 'idle';

/** The events and promises every queue has (RateLimiter, PromisePool, limit()). */
export interface Observed {
  /** EventTarget's: listeners get a CustomEvent, `detail` the result ('completed') or error ('error'). */
  addEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | AddEventListenerOptions): void;
  removeEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | EventListenerOptions): void;
  dispatchEvent(event: Event): boolean;
  /** Resolves once no task waits. */
  onEmpty(): Promise<void>;
  /** Resolves once no task waits and none runs. */
  onIdle(): Promise<void>;
}

export interface ReconfigureOptions {
  algorithm?: Algorithm | (string & {});
  capacity?: number;
  rate?: string;
  queue?: QueueOptions | false;
}

export declare class RateLimiter implements Observed {
  constructor(options: RateLimiterOptions);
  readonly capacity: number;
  readonly rate: string;
  readonly algorithm: Algorithm | (string & {});
  /** Tasks waiting for their tokens (or for resume()). */
  readonly pending: number;
  /** Tasks admitted whose function has not settled. */
  readonly active: number;
  /** Whole tokens available now. */
  readonly available: number;
  readonly isPaused: boolean;
  /** Takes `cost` tokens if they are there now and nobody waits ahead; never waits. */
  tryAcquire(cost?: number): boolean;
  /**
   * Takes `cost` tokens now without asking (a cost learnt once the work was done). A bucket
   * takes all of it, going into debt up to `maxDebt` tokens beyond empty, and admits nothing
   * until the refill has paid it; a window takes what it has left. Returns the part forgiven.
   */
  charge(cost: number, options?: ChargeOptions): number;
  /** Gives back `cost` tokens admitted `ago` that will never be used; never beyond a full bucket. */
  refund(cost: number, options?: RefundOptions): void;
  /** Waits until `cost` tokens are taken. */
  acquire(options?: ScheduleOptions): Promise<void>;
  /** Runs `fn` once its tokens are admitted; resolves to its result. */
  schedule<T>(fn: Task<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  /** `fn` limited: each call schedules it with `options`. */
  wrap<A extends unknown[], T>(fn: (...args: A) => T | PromiseLike<T>, options?: ScheduleOptions): (...args: A) => Promise<Awaited<T>>;
  /** Changes the quota or queue in place: the bucket is converted, no tokens are gained. */
  reconfigure(options: ReconfigureOptions): void;
  /** Admits nothing until resume(); tasks keep their order and deadlines. */
  pause(): void;
  resume(): void;
  /** Withdraws every waiting task (AbortError); returns how many. */
  clear(reason?: unknown): number;
  /** Nothing waits and the bucket is full. */
  isIdle(): boolean;
  /** Rejects every waiting task with ClosedError and refuses new ones. */
  close(): void;
  addEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | AddEventListenerOptions): void;
  removeEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | EventListenerOptions): void;
  dispatchEvent(event: Event): boolean;
  onEmpty(): Promise<void>;
  onIdle(): Promise<void>;
}

export interface PoolOptions {
  /** The most tasks running at once (a whole number, or Infinity). */
  concurrency: number;
  /** The longest a task may wait for a slot (default: no bound). */
  maxWait?: Duration;
  /** The run timeout of every task (default: none). */
  timeout?: Duration;
  now?: () => bigint;
  timers?: Timers;
}

export interface RunOptions {
  signal?: AbortSignal;
  priority?: Priority;
  maxWait?: Duration;
  timeout?: Duration;
}

export declare class PromisePool implements Observed {
  constructor(options: PoolOptions);
  /** Setting it starts waiting tasks at once if it grew. */
  concurrency: number;
  readonly active: number;
  readonly pending: number;
  readonly isPaused: boolean;
  run<T>(fn: Task<T>, options?: RunOptions): Promise<Awaited<T>>;
  map<I, T>(
    items: Iterable<I>,
    fn: (item: I, index: number) => T | PromiseLike<T>,
    options?: RunOptions,
  ): Promise<Awaited<T>[]>;
  wrap<A extends unknown[], T>(fn: (...args: A) => T | PromiseLike<T>, options?: RunOptions): (...args: A) => Promise<Awaited<T>>;
  pause(): void;
  resume(): void;
  clear(reason?: unknown): number;
  addEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | AddEventListenerOptions): void;
  removeEventListener(type: QueueEvent, listener: (event: CustomEvent) => void, options?: boolean | EventListenerOptions): void;
  dispatchEvent(event: Event): boolean;
  onEmpty(): Promise<void>;
  onIdle(): Promise<void>;
}

export interface LimitOptions extends Partial<RateLimiterOptions> {
  /** At most this many tasks running (default: no bound). */
  concurrency?: number;
}

export interface Limit extends Observed {
  schedule<T>(fn: Task<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  run<T>(fn: Task<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  wrap<A extends unknown[], T>(fn: (...args: A) => T | PromiseLike<T>, options?: ScheduleOptions): (...args: A) => Promise<Awaited<T>>;
  readonly pool: PromisePool;
  readonly limiter: RateLimiter | null;
  readonly active: number;
  readonly pending: number;
  concurrency: number;
  reconfigure(options: ReconfigureOptions): void;
  /** RateLimiter.charge on its rate limiter (TypeError without a rate). */
  charge(cost: number, options?: ChargeOptions): number;
  /** RateLimiter.refund on its rate limiter (TypeError without a rate). */
  refund(cost: number, options?: RefundOptions): void;
  pause(): void;
  resume(): void;
  clear(reason?: unknown): number;
  close(): void;
}

/** Concurrency and rate in one object. */
export declare function limit(options: LimitOptions): Limit;

export interface KeyedOptions extends RateLimiterOptions {
  /** The most keys kept (default 100000). */
  maxKeys?: number;
}

export declare class Keyed<K = string> {
  constructor(options: KeyedOptions);
  readonly maxKeys: number;
  readonly size: number;
  has(key: K): boolean;
  get(key: K): RateLimiter;
  tryAcquire(key: K, cost?: number): boolean;
  /** Takes `cost` from `key`'s bucket without asking (see RateLimiter.charge); returns the part forgiven. */
  charge(key: K, cost: number, options?: ChargeOptions): number;
  /** Gives back `cost` admitted for `key` `ago`; a key not held now gets nothing back. */
  refund(key: K, cost: number, options?: RefundOptions): void;
  schedule<T>(key: K, fn: Task<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  wrap<A extends unknown[], T>(fn: (key: K, ...args: A) => T | PromiseLike<T>, options?: ScheduleOptions): (key: K, ...args: A) => Promise<Awaited<T>>;
  reconfigure(options: ReconfigureOptions): void;
  close(): void;
}

/** A RateLimiter per key, at most `maxKeys` of them: `new Keyed(options)`. */
export declare function keyed<K = string>(options: KeyedOptions): Keyed<K>;

export interface RetryOptions<T> {
  /** Retries after the first attempt (default 3). */
  retries?: number;
  /** The first backoff bound in ms (default 100), doubled per retry. */
  base?: number;
  /** The largest backoff bound in ms (default 10000). */
  cap?: number;
  /** 'full' (default): uniform in [0, bound]; 'none': the bound. */
  jitter?: 'full' | 'none';
  /** Wait at least what Retry-After / RateLimit ask (default true). */
  respectRetryAfter?: boolean;
  /** The longest wait a server may ask for (default 60 s); a longer one is not retried. */
  maxRetryAfter?: Duration;
  /** Whether to retry this error or result (default: errors, and responses 408, 425, 429, 5xx). */
  shouldRetry?: (errorOrResult: unknown) => boolean | PromiseLike<boolean>;
  signal?: AbortSignal;
  onRetry?: (info: { attempt: number; waitMs: number; error?: unknown; response?: T }) => void;
  /** Replaces Math.random (tests). */
  random?: () => number;
  /** Replaces the wait (tests). */
  delay?: (ms: number, signal?: AbortSignal) => Promise<void>;
}

export declare function retry<T>(fn: (attempt: number) => T | PromiseLike<T>, options?: RetryOptions<Awaited<T>>): Promise<Awaited<T>>;

export interface RateLimitHints {
  retryAfterMs: number | null;
  resetMs: number | null;
  remaining: number | null;
  limit: number | null;
  windowMs: number | null;
}

/** The server's hints in a Response, a Headers object or a plain object of headers. */
export declare function rateLimitHints(
  source: { headers: unknown } | Headers | Record<string, string>,
  nowMs?: number,
): RateLimitHints;

type HeaderSource = { headers: unknown } | Headers | Record<string, string | string[]>;

/** One limit a server announced: times in ms from now, unknown values null. */
export interface ServerLimit {
  /** The policy's name (IETF), 'requests' / 'tokens' / 'input-tokens' / 'output-tokens' (OpenAI, Anthropic), or the GitHub resource. */
  id: string;
  /** What it counts: 'requests', 'tokens', ... (the IETF `qu`). */
  unit: string;
  limit: number | null;
  windowMs: number | null;
  remaining: number | null;
  resetMs: number | null;
}

export interface RateLimitReading {
  family: 'ietf' | 'openai' | 'anthropic' | 'github' | null;
  limits: ServerLimit[];
  retryAfterMs: number | null;
  /** Server clock minus local clock (ms), from `Date`, or null. */
  skewMs: number | null;
}

/** Everything a response says about its limits. */
export declare function readRateLimits(source: HeaderSource, options?: { now?: number; skewMs?: number | null }): RateLimitReading;
export declare function parseIetf(policy: string | null, rateLimit: string | null): ServerLimit[];
export declare function parseOpenAI(get: (name: string) => string | null): ServerLimit[];
export declare function parseAnthropic(get: (name: string) => string | null, nowMs: number, skewMs?: number): ServerLimit[];
export declare function parseGitHub(get: (name: string) => string | null, nowMs: number, skewMs?: number): ServerLimit[];
export declare function parseRetryAfter(value: string | null, nowMs: number, dateMs?: number | null): number | null;
/** A Go duration (`6m0s`, `12ms`) in ms, or null. */
export declare function parseDuration(value: string | null): number | null;
export type SfBareItem = string | number | boolean | { token: string } | { bytes: string };
export interface SfMember { value: SfBareItem | { value: SfBareItem; params: Record<string, SfBareItem> }[]; params: Record<string, SfBareItem> }
/** A structured field List (RFC 9651), or null when invalid. */
export declare function parseList(text: string): SfMember[] | null;
export declare function measureSkew(date: string | null, nowMs: number, previous?: number | null): number | null;

/** A request's declared cost for token limits (requests always count 1). */
export type PaceCost = { tokens?: number; 'input-tokens'?: number; 'output-tokens'?: number; [unit: string]: number | undefined };

export interface PacerStore {
  update<T>(fn: (state: unknown, nowMs: number) => T, fresh: (nowMs: number) => unknown): T | Promise<T>;
  readonly pollMs: number;
}

export declare class MemoryPacerStore implements PacerStore {
  constructor(options?: { now?: () => number });
  update<T>(fn: (state: unknown, nowMs: number) => T, fresh: (nowMs: number) => unknown): T;
  readonly pollMs: number;
}

export interface PacerOptions {
  /** What holds while the server says nothing: `{ requests: '60/min', tokens: '90000/min' }`. */
  limits?: Record<string, string>;
  store?: PacerStore;
  /** Monotonic ms (tests). */
  now?: () => number;
  /** Wall-clock ms since 1970 (tests). */
  wallNow?: () => number;
  timers?: { setTimeout(fn: () => void, ms: number): unknown; clearTimeout(t: unknown): void };
}

export declare class Ticket {
  observe(response: { status: number; headers: unknown }): Promise<RateLimitReading>;
  abandon(): Promise<void> | void;
  reconcile(used: PaceCost): Promise<void> | void;
}

export interface PacerLimitState {
  unit: string;
  limit: number | null;
  remaining: number | null;
  resetInMs: number | null;
  windowMs: number | null;
  inflight: number;
  configured: boolean;
}

export declare class Pacer {
  constructor(options?: PacerOptions);
  acquire(options?: { cost?: PaceCost; signal?: AbortSignal }): Promise<Ticket>;
  /** Reads a response the pacer did not admit; a ticket's own goes to `ticket.observe`. */
  observe(response: { status: number; headers: unknown }): Promise<RateLimitReading>;
  schedule<T>(fn: () => T | PromiseLike<T>, options?: { cost?: PaceCost; signal?: AbortSignal }): Promise<Awaited<T>>;
  state(): Promise<{ limits: Record<string, PacerLimitState>; blockedForMs: number; skewMs: number | null }>;
}

export declare function pacer(options?: PacerOptions): Pacer;

export type PacedFetch = ((input: string | URL | Request, init?: RequestInit & { cost?: PaceCost }) => Promise<Response>) & { readonly pacer: Pacer };

export declare function paced(
  fetch?: (input: string | URL | Request, init?: RequestInit) => Promise<Response>,
  options?: PacerOptions & { pacer?: Pacer; usage?: 'openai' | 'anthropic' | ((body: unknown) => PaceCost | null) },
): PacedFetch;

export type CircuitState = 'closed' | 'open' | 'half-open';

export interface CircuitBreakerOptions {
  /** Consecutive failures that open it (default 5). */
  failureThreshold?: number;
  /** How long it stays open (default 30000 ms). */
  resetTimeout?: Duration;
  /** Trial calls let through while half-open (default 1). */
  halfOpenMax?: number;
  /** Which errors count as failures (default: all). */
  isFailure?: (error: unknown) => boolean;
  now?: () => bigint;
  onStateChange?: (state: CircuitState) => void;
}

export declare class CircuitBreaker {
  constructor(options?: CircuitBreakerOptions);
  readonly state: CircuitState;
  readonly failureThreshold: number;
  readonly halfOpenMax: number;
  call<T>(fn: () => T | PromiseLike<T>): Promise<Awaited<T>>;
}

/** The base class of every error sluice-limits raises itself. */
export declare class SluiceError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
}
export declare class QueueFullError extends SluiceError {
  constructor(message?: string, retryAfterMs?: number);
  readonly retryAfterMs: number;
}
export type TimeoutReason = 'timeout' | 'limited' | 'expired' | 'run';
export declare class TimeoutError extends SluiceError {
  constructor(message?: string, retryAfterMs?: number, reason?: TimeoutReason);
  readonly retryAfterMs: number;
  /** 'timeout': refused at once; 'limited': no token and no wait allowed; 'expired': timed out waiting; 'run': ran past its timeout. */
  readonly reason: TimeoutReason;
}
export declare class AbortError extends SluiceError {
  constructor(message?: string, options?: { cause?: unknown });
  readonly name: 'AbortError';
  readonly code: 20;
}
export declare class InsufficientCapacityError extends SluiceError {
  constructor(cost: number, capacity: number);
  readonly cost: number;
  readonly capacity: number;
}
export declare class ClosedError extends SluiceError {}
export declare class CircuitOpenError extends SluiceError {
  constructor(message?: string, retryAfterMs?: number);
  readonly retryAfterMs: number;
}
/** Redis did not answer in time and the store's onError is 'throw'. */
export declare class UnavailableError extends SluiceError {
  constructor(message?: string, retryAfterMs?: number, options?: { cause?: unknown });
  readonly retryAfterMs: number;
}

// === Durable jobs (src/jobs.js): a job queue on Redis Streams, shared with Rust workers ===

/**
 * A connected Redis client for the job queue: node-redis (createClient, createCluster) or
 * ioredis (Redis, Cluster), as for sluice-limits/redis's RedisStore.
 */
export type JobRedisClient =
  | { sendCommand(args: string[]): Promise<unknown> }
  | { sendCommand(firstKey: string | undefined, isReadonly: boolean | undefined, args: string[]): Promise<unknown>; nodeClient(...args: never[]): unknown }
  | { call(command: string, ...args: string[]): Promise<unknown> };

/** Each group's limit: the bucket `<prefix>:{<group>}`, RedisStore's key for key `<group>`. */
export interface JobLimit {
  /** The bucket prefix (a RedisStore's prefix; for a gateway policy `<store prefix>:<policy>`). Default 'sluice'. */
  prefix?: string;
  /** Default 'token_bucket'; not 'sliding_log'. */
  algorithm?: Exclude<Algorithm, 'sliding_log'> | (string & {});
  capacity: number;
  rate: string;
}

/** What every producer and worker of one queue must agree on (as the Rust QueueOptions). */
export interface JobQueueOptions {
  client: JobRedisClient;
  /** The queue's name (no braces). */
  name: string;
  /** The prefix of the queue's keys (default 'sluice:jobs'). */
  prefix?: string;
  /** Each group's limit (default: none, only concurrency). */
  limit?: JobLimit | null;
  /** Jobs of one group running at once across every worker (default 0: no bound). */
  concurrency?: number;
  /** A running job not heartbeated this long is claimed back and run again (default 30 s). */
  visibilityTimeout?: Duration;
  /** How long a completed job and its idempotency key are kept (default a day; 0: not kept). */
  keepCompleted?: Duration;
  /** Tokens a bucket may owe beyond empty when a job settles more than it was admitted with (default 0). */
  maxDebt?: number;
}

export interface EnqueueOptions {
  /** Default 'default'. Not empty, no braces. */
  group?: string;
  /** Tokens of the group's limit (default 1). */
  cost?: number;
  /** 0 to 1000, higher first within the group (default 0). */
  priority?: number;
  delay?: Duration;
  /** 1 to 1000 (default 3). */
  maxAttempts?: number;
  /** An idempotency key: a second enqueue with a key the group still holds adds nothing. */
  key?: string;
  /** The payload as it is, instead of JSON of `data`. */
  payload?: string;
}

export interface Enqueued {
  id: string;
  group: string;
  added: boolean;
  /** When the job is due, ms since the epoch (0: now). */
  due: number;
}

export interface JobGroupStats {
  waiting: number;
  delayed: number;
  active: number;
  /** In the dead-letter stream now. */
  dead: number;
  completed: number;
  /** Attempts that failed. */
  failed: number;
  retried: number;
  deadLettered: number;
  reclaimed: number;
  pausedMs: number;
  enqueued: number;
}

export interface DeadLetter {
  id: string;
  error: string;
  attempts: number;
}

export interface StoredJob {
  id: string;
  group: string;
  payload: string;
  cost: number;
  priority: number;
  attempts: number;
  maxAttempts: number;
  key: string;
  state: 'waiting' | 'delayed' | 'active' | 'done' | 'dead';
  createdAt: number;
  due: number;
  charged: number;
  /** When Redis admitted its last attempt, ns since the epoch. */
  admittedAtNs: bigint | null;
  error: string;
}

export declare class JobQueue {
  constructor(options: JobQueueOptions);
  readonly name: string;
  readonly prefix: string;
  readonly concurrency: number;
  readonly visibilityTimeoutMs: number;
  readonly keepCompletedMs: number;
  readonly maxDebt: number;
  groupKeys(group: string): string[];
  queueKeys(): string[];
  enqueue(data: unknown, options?: EnqueueOptions): Promise<Enqueued>;
  enqueueMany(jobs: Array<EnqueueOptions & { data?: unknown }>): Promise<Enqueued[]>;
  groups(): Promise<string[]>;
  stats(group: string): Promise<JobGroupStats>;
  /** Every group's figures. */
  inspect(): Promise<Record<string, JobGroupStats>>;
  deadLetters(group: string, options?: { count?: number }): Promise<DeadLetter[]>;
  job(group: string, id: string): Promise<StoredJob | null>;
  retryDead(group: string, options?: { count?: number }): Promise<number>;
  /** Deletes jobs of `group` (every group without one): 'all' (default), 'waiting', 'dead' or 'done'. */
  purge(group?: string | null, what?: 'all' | 'waiting' | 'dead' | 'done'): Promise<number>;
  /** Puts back, of the next `count` groups (default 100), those holding jobs but on neither list: how many. */
  sweep(count?: number): Promise<number>;
}

export interface Job<T = unknown> {
  id: string;
  group: string;
  /** The payload parsed as JSON (its text when it is not JSON). */
  data: T;
  payload: string;
  cost: number;
  priority: number;
  /** This attempt, from 1. */
  attempt: number;
  maxAttempts: number;
  key: string;
  /** Claimed back from a worker that stopped. */
  reclaimed: boolean;
  entry: string;
  /** Aborts when another worker claimed the job back. */
  readonly signal: AbortSignal;
  /** The job's actual cost, refunded or charged on the group's bucket when it ends. */
  settle(cost: number): void;
}

export interface WorkerOptions {
  /** Jobs this worker runs at once (default 1). */
  concurrency?: number;
  /** Its consumer name in the streams' consumer group (default `w-<pid>-<random>`). */
  consumer?: string;
  /** Exponential backoff with full jitter, ms (default base 100, cap 60000). */
  backoff?: { base?: Duration; cap?: Duration };
  /** The longest idle poll (default 50 ms). */
  poll?: Duration;
  /** How often a page of 100 groups is swept (default 5 s; Infinity: never). */
  sweep?: Duration;
  /** A server's wait pauses the job's whole group (default true). */
  slowGroup?: boolean;
  /** A breaker per group (default 5 failures open it for 30 s); false: none. */
  breaker?: Omit<CircuitBreakerOptions, 'now' | 'onStateChange'> | false;
  /** Whether a failed job is retried (default: unless `error.permanent` is true). */
  shouldRetry?: (error: unknown, job: Job) => boolean | Promise<boolean>;
  /** Start at once (default true). */
  autorun?: boolean;
  /** The jitter's random numbers in [0, 1) (default Math.random). */
  random?: () => number;
}

export interface JobCounters {
  active: number;
  completed: number;
  failed: number;
  retried: number;
  dead: number;
  reclaimed: number;
  lost: number;
}

export interface JobEventDetail<T = unknown> {
  job: Job<T>;
  settled?: number;
  result?: unknown;
  error?: unknown;
  delayMs?: number;
  pausedMs?: number;
  due?: number;
}

export type WorkerEvent = 'active' | 'completed' | 'failed' | 'retried' | 'dead' | 'reclaimed' | 'lost' | 'error' | 'breaker';

export declare class Worker<T = unknown> {
  constructor(queue: JobQueue, handler: (job: Job<T>) => unknown, options?: WorkerOptions);
  readonly consumer: string;
  readonly closed: boolean;
  addEventListener(type: WorkerEvent, listener: (event: CustomEvent) => void, options?: AddEventListenerOptions): void;
  removeEventListener(type: WorkerEvent, listener: (event: CustomEvent) => void, options?: EventListenerOptions): void;
  on(type: 'error', fn: (detail: { error: unknown }) => void): this;
  on(type: 'breaker', fn: (detail: { group: string; state: CircuitState }) => void): this;
  on(type: Exclude<WorkerEvent, 'error' | 'breaker'>, fn: (detail: JobEventDetail<T>) => void): this;
  /** What this worker did, per group. */
  metrics(): Record<string, JobCounters>;
  breaker(group: string): CircuitBreaker | null;
  run(): Promise<void>;
  /** Stops taking jobs; resolves once the running ones finished. */
  close(): Promise<void>;
}

/** The wait a failure names: a Response's Retry-After or exhausted limit, or the error's retryAfterMs; null if none. */
export declare function failureWaitMs(error: unknown, nowMs?: number): number | null;
