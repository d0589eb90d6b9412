// Types of sluice-limits/redis (Node).

import type { Algorithm, ChargeOptions, Duration, RefundOptions } from './index.js';

/** node-redis's createClient(): `sendCommand(args)`. */
export interface NodeRedisClientLike {
  sendCommand(args: string[]): Promise<unknown>;
}

/** node-redis's createCluster(): `sendCommand(firstKey, isReadonly, args)`, routed by the key. */
export interface NodeRedisClusterLike {
  sendCommand(firstKey: string | undefined, isReadonly: boolean | undefined, args: string[]): Promise<unknown>;
  nodeClient(...args: never[]): unknown;
}

/** ioredis's Redis or Cluster: `call(command, ...args)`. */
export interface IoRedisLike {
  call(command: string, ...args: string[]): Promise<unknown>;
}

/** A connected node-redis (createClient, createCluster; v4 and later) or ioredis (Redis, Cluster) client. */
export type RedisClientLike = NodeRedisClientLike | NodeRedisClusterLike | IoRedisLike;

export interface RedisStoreOptions {
  client: RedisClientLike;
  /**
   * The key prefix; `sluice serve` keeps policy P of `[store] prefix = "X"` under "X:P". A store
   * with another quota or algorithm on the same prefix converts each key on read: no key gains.
   */
  prefix?: string;
  algorithm?: Exclude<Algorithm, 'sliding_log'> | (string & {});
  capacity: number;
  rate: string;
  /** The default maximum wait of schedule() (default: none), counted from the call. */
  maxWait?: Duration;
  /** How long a decision waits for Redis (default 250 ms). */
  timeout?: Duration;
  /**
   * What decides while Redis does not answer: 'local' (default: a limiter in this process with
   * the same quota), 'allow', 'deny', or 'throw' (UnavailableError).
   */
  onError?: 'local' | 'allow' | 'deny' | 'throw';
  /** After a failure, Redis is not asked again for this long (default 250 ms). */
  retryInterval?: Duration;
  /**
   * Hash each key with keyHash(keySalt, key), as the gateway stores keys taken from headers,
   * cookies and query parameters: its `store.key_salt` ('' when it has none).
   */
  keySalt?: string | Uint8Array;
}

export interface RedisDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  retryAfterMs: number;
  resetAfterMs: number;
  /** 'redis', or what onError decided while Redis did not answer. */
  source: 'redis' | 'local' | 'allow' | 'deny';
}

export declare class RedisStore {
  constructor(options: RedisStoreOptions);
  readonly prefix: string;
  readonly capacity: number;
  readonly algorithm: Algorithm;
  readonly rate: string;
  /** The Redis key of `key`: `<prefix>:{<key>}` (with keySalt, its hash), whatever the algorithm. */
  redisKey(key: string): string;
  check(key: string, cost?: number): Promise<RedisDecision>;
  tryAcquire(key: string, cost?: number): Promise<boolean>;
  /**
   * Takes `cost` from `key`'s bucket in Redis without asking, as `sluice serve` settles a cost:
   * a bucket goes into debt up to `maxDebt` tokens beyond empty, a window takes what it has
   * left. Resolves to the part forgiven.
   */
  charge(key: string, cost: number, options?: ChargeOptions): Promise<number>;
  /** Gives back `cost` admitted for `key` `ago` that will never be used; never beyond a full bucket. */
  refund(key: string, cost: number, options?: RefundOptions): Promise<void>;
  schedule<T>(
    key: string,
    fn: () => T | PromiseLike<T>,
    options?: { cost?: number; signal?: AbortSignal; maxWait?: Duration },
  ): Promise<Awaited<T>>;
}

export interface RedisPacerStoreOptions {
  client: RedisClientLike;
  /** Names the group of processes that pace as one client (one per server and account). */
  key: string;
  /** The state expires this many ms after its last change (default two days). */
  ttl?: number;
}

/** A pacer's state in Redis, on Redis's clock: `pacer({ store })` in every process of a fleet. */
export declare class RedisPacerStore {
  constructor(options: RedisPacerStoreOptions);
  readonly key: string;
  readonly pollMs: number;
  update<T>(fn: (state: unknown, nowMs: number) => T, fresh: (nowMs: number) => unknown): Promise<T>;
}
