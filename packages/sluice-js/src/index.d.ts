// Types of sluice-limits (written by hand; test/types/check.ts exercises them under tsc).

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

export declare const ALGORITHMS: readonly Algorithm[];

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
  /** A monotonic clock in integer nanoseconds (default: process.hrtime / performance.now). */
  now?: () => bigint;
  /** Timers driven with `now` (default: the global ones). */
  timers?: Timers;
}

export interface ScheduleOptions {
  /** Tokens this task takes (default 1). */
  cost?: number;
  /** Default 'normal'; higher priorities go first, FIFO within each. */
  priority?: Priority;
  /** Withdraws the task while it waits: it rejects with AbortError and spends nothing. */
  signal?: AbortSignal;
  /** This task's own maximum wait (0: never wait). */
  maxWait?: Duration;
}

export declare class RateLimiter {
  constructor(options: RateLimiterOptions);
  readonly capacity: number;
  /** Tasks waiting for their tokens. */
  readonly pending: number;
  /** Whole tokens available now. */
  readonly available: number;
  /** Takes `cost` tokens if they are there now and nobody waits ahead; never waits. */
  tryAcquire(cost?: number): boolean;
  /** Waits until `cost` tokens are taken. */
  acquire(options?: ScheduleOptions): Promise<void>;
  /** Runs `fn` once its tokens are admitted; resolves to its result. */
  schedule<T>(fn: () => T | PromiseLike<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  /** Nothing waits and the bucket is full. */
  isIdle(): boolean;
  /** Rejects every waiting task with ClosedError and refuses new ones. */
  close(): void;
}

export declare class PromisePool {
  constructor(options: { concurrency: number });
  readonly concurrency: number;
  readonly active: number;
  readonly pending: number;
  run<T>(fn: () => T | PromiseLike<T>, options?: { signal?: AbortSignal }): Promise<Awaited<T>>;
  map<I, T>(
    items: Iterable<I>,
    fn: (item: I, index: number) => T | PromiseLike<T>,
    options?: { signal?: AbortSignal },
  ): Promise<Awaited<T>[]>;
}

export interface LimitOptions extends Partial<RateLimiterOptions> {
  /** At most this many tasks running (default: no bound). */
  concurrency?: number;
}

export interface Limit {
  schedule<T>(fn: () => T | PromiseLike<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  run<T>(fn: () => T | PromiseLike<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  readonly pool: PromisePool;
  readonly limiter: RateLimiter | null;
  readonly active: number;
  readonly pending: number;
  close(): void;
}

/** Concurrency and rate in one object. */
export declare function limit(options: LimitOptions): Limit;

export interface KeyedOptions extends RateLimiterOptions {
  /** The most keys kept (default 100000). */
  maxKeys?: number;
}

export declare class Keyed<K = string> {
  readonly size: number;
  has(key: K): boolean;
  get(key: K): RateLimiter;
  tryAcquire(key: K, cost?: number): boolean;
  schedule<T>(key: K, fn: () => T | PromiseLike<T>, options?: ScheduleOptions): Promise<Awaited<T>>;
  close(): void;
}

/** A RateLimiter per key, at most `maxKeys` of them. */
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
  call<T>(fn: () => T | PromiseLike<T>): Promise<Awaited<T>>;
}

export declare class SluiceError extends Error {}
export declare class QueueFullError extends SluiceError {
  readonly retryAfterMs: number;
}
export declare class TimeoutError extends SluiceError {
  readonly retryAfterMs: number;
  /** 'timeout': refused at once; 'limited': no token and no wait allowed; 'expired': timed out waiting. */
  readonly reason: 'timeout' | 'limited' | 'expired';
}
export declare class AbortError extends SluiceError {
  readonly name: 'AbortError';
  readonly code: 20;
}
export declare class InsufficientCapacityError extends SluiceError {
  readonly cost: number;
  readonly capacity: number;
}
export declare class ClosedError extends SluiceError {}
export declare class CircuitOpenError extends SluiceError {
  readonly retryAfterMs: number;
}
