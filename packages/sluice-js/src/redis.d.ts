// Types of sluice-limits/redis (Node).

import type { Algorithm, Duration } from './index.js';

export interface RedisStoreOptions {
  /** A connected node-redis (createClient) or ioredis client. */
  client: unknown;
  /**
   * The key prefix; `sluice serve` keeps policy P of `[store] prefix = "X"` under "X:P". A store
   * with another quota or algorithm on the same prefix converts each key on read: no key gains.
   */
  prefix?: string;
  algorithm?: Exclude<Algorithm, 'sliding_log'> | (string & {});
  capacity: number;
  rate: string;
  /** The default maximum wait of schedule() (default: none). */
  maxWait?: Duration;
}

export interface RedisDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
}

export declare class RedisStore {
  constructor(options: RedisStoreOptions);
  readonly prefix: string;
  readonly capacity: number;
  /** The Redis key of `key`: `<prefix>:{<key>}`, whatever the algorithm. */
  redisKey(key: string): string;
  check(key: string, cost?: number): Promise<RedisDecision>;
  tryAcquire(key: string, cost?: number): Promise<boolean>;
  schedule<T>(
    key: string,
    fn: () => T | PromiseLike<T>,
    options?: { cost?: number; signal?: AbortSignal; maxWait?: Duration },
  ): Promise<Awaited<T>>;
}
