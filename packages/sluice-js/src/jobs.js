// Durable jobs under shared limits: a job queue on Redis Streams whose jobs are handed to a
// worker only when their group's limit and concurrency allow it. The keys and the Lua scripts
// are the Rust crate's (crates/sluice/src/jobs, docs/jobs.md "Redis layout"), so Rust and Node
// workers share one queue, and a group's limit is the very bucket `RedisStore` and the gateway
// decide for the same prefix and key.
//
// No Node module is imported: the Redis client is the caller's (node-redis or ioredis).
//
// One file, past 700 lines: JobQueue and Worker call the same scripts with the same KEYS and
// ARGV as crates/sluice/src/jobs/queue.rs, and are kept in one file, as there, so that the two
// layouts can be read side by side; cjs/jobs.cjs is generated from it (scripts/gen-cjs.mjs).

import {
  JOB_CLAIM, JOB_FINISH, JOB_ENQUEUE, JOB_TOUCH, JOB_STATS, JOB_RETRY_DEAD, JOB_PURGE, JOB_REGISTER, JOB_PICK, JOB_PARK,
  JOB_SWEEP,
} from './redis-scripts.generated.js';
import { CoreLimiter, algorithmCode, rateIntervalNs } from './core.js';
import { program } from './redis-program.js';
import { sender } from './redis-client.js';
import { CircuitBreaker } from './breaker.js';
import { readRateLimits } from './headers.js';
import { durationNs, nsToMsCeil, sleep } from './time.js';

const MAX_COST = 4294967296;
const MAX_PRIORITY = 1000;
const MAX_ATTEMPTS = 1000;
const YEAR_MS = 365 * 86400000;
/** The workers' access to a queue's five list keys. */
const LIST_KEYS = Symbol('list keys');
/** What #claimed answers for a job dead-lettered at its claim: claim again. */
const SKIPPED = Symbol('skipped');
/** park's "whatever was registered": a version no group reaches. */
const ANY_VERSION = '9007199254740991';

const msOption = (value, what) => {
  const ns = durationNs(value, what);
  return ns === null ? Infinity : nsToMsCeil(ns);
};

function checkGroup(group) {
  if (typeof group !== 'string' || group === '') throw new TypeError('a group must be a non-empty string');
  if (/[{}]/.test(group)) throw new RangeError(`group ${JSON.stringify(group)} holds a brace, which would change its Redis Cluster hash tag`);
  return group;
}

function checkPrefix(text, what) {
  if (typeof text !== 'string' || text === '') throw new TypeError(`${what} must be a non-empty string`);
  if (/[{}]/.test(text)) throw new RangeError(`${what} may not hold a brace`);
  return text;
}

const wholeIn = (value, lo, hi, what) => {
  if (!Number.isSafeInteger(value) || value < lo || value > hi) throw new RangeError(`${what} must be a whole number from ${lo} to ${hi}, got ${value}`);
  return value;
};

/** One Lua script, run with EVALSHA; on NOSCRIPT, with EVAL (which loads it on that node). */
class Script {
  constructor(source) {
    this.source = source;
    this.sha = null;
    this.loading = null;
  }
}

/**
 * The group's limit as the scripts take it: `{ prefix, algorithm, capacity, rate }` (or a
 * RedisStore, whose prefix and quota are taken), or null for none.
 */
function limitOf(limit) {
  if (limit === null || limit === undefined) return null;
  const { prefix, algorithm = 'token_bucket', capacity, rate } = limit;
  checkPrefix(prefix ?? 'sluice', 'limit.prefix');
  if (!Number.isSafeInteger(capacity) || capacity < 1) throw new RangeError(`limit.capacity must be a whole number of at least 1, got ${capacity}`);
  const intervalNs = rateIntervalNs(rate);
  // The core validates the quota as the gateway does.
  new CoreLimiter(algorithmCode(algorithm), BigInt(capacity), intervalNs, 0, 0n).free();
  const p = program(algorithm, BigInt(capacity), intervalNs);
  return { prefix: prefix ?? 'sluice', algorithm: p.kind, capacity, rate, stamp: p.stamp };
}

/**
 * A job queue on Redis: `name`, its keys under `prefix` (default 'sluice:jobs'). The queue's
 * options are what its workers and producers must agree on, as the Rust `QueueOptions`:
 * `limit` (each group's bucket `<limit.prefix>:{<group>}`, default none), `concurrency` (jobs of
 * one group at once across every worker; 0: no bound), `visibilityTimeout` (default 30 s),
 * `keepCompleted` (how long a completed job and its idempotency key are kept, default a day)
 * and `maxDebt` (tokens a bucket may owe beyond empty when a job settles more than it was
 * admitted with; default 0).
 */
export class JobQueue {
  #send;
  #scripts = new Map();
  #queueKeys;
  #sweepKeys;
  #bucketPrefix;

  constructor(options = {}) {
    const {
      client, name, prefix = 'sluice:jobs', limit = null, concurrency = 0, visibilityTimeout = 30000,
      keepCompleted = 86400000, maxDebt = 0,
    } = options;
    this.#send = sender(client);
    this.name = checkPrefix(name, 'name');
    this.prefix = checkPrefix(prefix, 'prefix');
    this.limit = limitOf(limit);
    this.concurrency = wholeIn(concurrency, 0, 4294967295, 'concurrency');
    this.visibilityTimeoutMs = msOption(visibilityTimeout, 'visibilityTimeout');
    if (!(this.visibilityTimeoutMs >= 10 && this.visibilityTimeoutMs !== Infinity)) throw new RangeError('visibilityTimeout must be at least 10 ms and finite');
    this.keepCompletedMs = msOption(keepCompleted, 'keepCompleted');
    if (this.keepCompletedMs === Infinity) this.keepCompletedMs = 100 * YEAR_MS;
    this.maxDebt = wholeIn(maxDebt, 0, Number.MAX_SAFE_INTEGER, 'maxDebt');
    const base = `${this.prefix}:{${this.name}}:`;
    // The five keys of the queue scripts, and the sweep's cursor (the sweep takes all six).
    this.#sweepKeys = ['ready', 'later', 'marks', 'turn', 'groups', 'sweep'].map((k) => base + k);
    this.#queueKeys = this.#sweepKeys.slice(0, 5);
    // Key 1 of a group: its bucket, or without a limit a key no script touches (it keeps the
    // group's slot).
    this.#bucketPrefix = this.limit?.prefix ?? `${this.prefix}:${this.name}:nolimit`;
  }

  /** The nine keys of `group`, in the order of the group scripts (docs/jobs.md). */
  groupKeys(group) {
    checkGroup(group);
    const base = `${this.prefix}:${this.name}:{${group}}:`;
    return [
      `${this.#bucketPrefix}:{${group}}`,
      ...['jobs', 'wait', 'delayed', 'active', 'dead', 'meta', 'done', 'idem'].map((k) => base + k),
    ];
  }

  /** The five keys of the queue's group list, and the sweep's cursor. */
  queueKeys() {
    return [...this.#sweepKeys];
  }

  #script(source) {
    let s = this.#scripts.get(source);
    if (!s) this.#scripts.set(source, (s = new Script(source)));
    return s;
  }

  /** Runs a script on `keys` (the first routes it in a Cluster); ARGV[1] '' (Redis's time). */
  async run(source, keys, args) {
    const s = this.#script(source);
    const argv = ['', ...args.map(String)];
    if (s.sha === null) {
      // SCRIPT LOAD (once, however many calls wait for it) answers the digest, the same on
      // every node; where it was not loaded, EVALSHA fails with NOSCRIPT and EVAL loads it.
      s.loading ??= this.#send(keys[0], ['SCRIPT', 'LOAD', source]).then((sha) => { s.sha = String(sha); }, () => {}).finally(() => { s.loading = null; });
      await s.loading;
    }
    if (s.sha !== null) {
      try {
        return await this.#send(keys[0], ['EVALSHA', s.sha, String(keys.length), ...keys, ...argv]);
      } catch (e) {
        if (!/NOSCRIPT/.test(String(e?.message ?? e))) throw e;
      }
    }
    return this.#send(keys[0], ['EVAL', source, String(keys.length), ...keys, ...argv]);
  }

  /**
   * Adds a job: `data` (JSON-encoded; a Rust worker reads it as the payload's bytes) to
   * `options.group` (default 'default'), costing `cost` tokens of the group's limit (default
   * 1), with `priority` (0 to 1000, higher first within the group; default 0), `delay`, at most
   * `maxAttempts` attempts (default 3) and an idempotency `key`: a second enqueue with a key
   * the group still holds adds nothing. Resolves to `{ id, group, added, due }` (`due`: ms
   * since the epoch, 0 for now).
   */
  async enqueue(data, options = {}) {
    const { group = 'default', cost = 1, priority = 0, delay = 0, maxAttempts = 3, key = '', payload } = options;
    checkGroup(group);
    wholeIn(cost, 0, MAX_COST, 'cost');
    wholeIn(priority, 0, MAX_PRIORITY, 'priority');
    wholeIn(maxAttempts, 1, MAX_ATTEMPTS, 'maxAttempts');
    const delayMs = msOption(delay, 'delay');
    if (delayMs > YEAR_MS) throw new RangeError('delay may not be above a year');
    if (typeof key !== 'string') throw new TypeError('key must be a string');
    const text = payload !== undefined ? String(payload) : JSON.stringify(data ?? null);
    const reply = await this.run(JOB_ENQUEUE, this.groupKeys(group), [group, text, cost, priority, delayMs, maxAttempts, key]);
    const [id, added, version, due] = reply.map(String);
    if (added === '1') await this.register(group, version, due);
    return { id, group, added: added === '1', due: Number(due) };
  }

  /** Adds many jobs, `[{ data, ...options }]`, sent together: their results in order. */
  enqueueMany(jobs) {
    return Promise.all(jobs.map(({ data, ...options }) => this.enqueue(data, options)));
  }

  /**
   * Puts `group` on the queue's list, due at `due` (ms since the epoch, '0' now), with the
   * group's `version` as an enqueue, a finish or retryDead returned it. Safe to repeat.
   */
  async register(group, version = '', due = '0') {
    let last;
    for (let i = 0; i < 3; i++) {
      try {
        await this.run(JOB_REGISTER, this.#queueKeys, [group, version, due]);
        return;
      } catch (e) {
        last = e;
        await sleep(50);
      }
    }
    throw last;
  }

  /**
   * Looks at the next `count` groups of the queue's group list (the workers walk it together)
   * and puts back on the ready list each that holds jobs but is on neither list: a producer
   * stopped between its enqueue and its registration. Resolves to how many.
   */
  async sweep(count = 100) {
    const groups = await this.run(JOB_SWEEP, this.#sweepKeys, [wholeIn(count, 1, 100000, 'count')]);
    let putBack = 0;
    for (const g of groups.map(String)) {
      const s = await this.stats(g);
      if (s.waiting + s.delayed + s.active > 0) {
        await this.register(g, '', '0');
        putBack++;
      }
    }
    return putBack;
  }

  /** The five keys of the queue scripts (for the workers). */
  get [LIST_KEYS]() {
    return this.#queueKeys;
  }

  /** Every group the queue has had (until purged). */
  async groups() {
    const reply = await this.#send(this.#queueKeys[0], ['SMEMBERS', this.#queueKeys[4]]);
    return reply.map(String).sort();
  }

  /**
   * A group's figures, read at once: `{ waiting, delayed, active, dead, completed, failed,
   * retried, deadLettered, reclaimed, pausedMs, enqueued }` (`dead`: in the dead-letter
   * stream now; `failed`: attempts that failed; the counters since the group's first job).
   */
  async stats(group) {
    const r = (await this.run(JOB_STATS, this.groupKeys(group), [])).map(Number);
    return {
      waiting: r[0], delayed: r[1], active: r[2], dead: r[3], completed: r[4], failed: r[5], retried: r[6],
      deadLettered: r[7], reclaimed: r[8], pausedMs: r[9], enqueued: r[10],
    };
  }

  /** Every group's figures: `{ [group]: stats }` (the metrics of the queue, per group). */
  async inspect() {
    const out = {};
    const groups = await this.groups();
    const all = await Promise.all(groups.map((g) => this.stats(g)));
    groups.forEach((g, i) => { out[g] = all[i]; });
    return out;
  }

  /** The dead letters of `group`, oldest first: `[{ id, error, attempts }]` (at most `count`). */
  async deadLetters(group, { count = 100 } = {}) {
    const keys = this.groupKeys(group);
    const entries = await this.#send(keys[0], ['XRANGE', keys[5], '-', '+', 'COUNT', String(count)]);
    return entries.map(([, fields]) => {
      const f = {};
      for (let i = 0; i < fields.length; i += 2) f[String(fields[i])] = String(fields[i + 1]);
      return { id: f.job, error: f.error, attempts: Number(f.attempts) };
    });
  }

  /** One job as Redis holds it (its fields named), or null. */
  async job(group, id) {
    const keys = this.groupKeys(group);
    const v = await this.#send(keys[0], ['HGET', keys[1], String(id)]);
    if (v === null || v === undefined) return null;
    const j = JSON.parse(String(v));
    return {
      id: j.id, group: j.g, payload: j.p, cost: Number(j.c), priority: Number(j.pr), attempts: Number(j.a),
      maxAttempts: Number(j.m), key: j.k, state: j.s, createdAt: Number(j.cr), due: Number(j.d),
      charged: Number(j.ch), admittedAtNs: j.st === '' ? null : BigInt(j.st), error: j.er,
    };
  }

  /** Puts up to `count` (0: all) dead letters of `group` back to wait, attempts afresh: how many. */
  async retryDead(group, { count = 0 } = {}) {
    const [moved, version] = (await this.run(JOB_RETRY_DEAD, this.groupKeys(group), [wholeIn(count, 0, Number.MAX_SAFE_INTEGER, 'count')])).map(String);
    if (Number(moved) > 0) await this.register(group, version, '0');
    return Number(moved);
  }

  /**
   * Deletes jobs of `group` (every group when none is given): `what` 'waiting' (waiting and
   * delayed), 'dead', 'done' (completed jobs kept), or 'all' (default; running jobs too, whose
   * workers' results are then refused). Resolves to the jobs deleted.
   */
  async purge(group, what = 'all') {
    if (!['waiting', 'dead', 'done', 'all'].includes(what)) throw new RangeError(`purge takes 'waiting', 'dead', 'done' or 'all', not ${JSON.stringify(what)}`);
    const groups = group === undefined || group === null ? await this.groups() : [checkGroup(group)];
    let n = 0;
    for (const g of groups) {
      n += Number(await this.run(JOB_PURGE, this.groupKeys(g), [what]));
      if (what === 'all') await this.run(JOB_PARK, this.#queueKeys, [g, 'forget', '0', '0']);
    }
    return n;
  }
}

/**
 * What a failure asks for: the wait a server named (a `Response` thrown, or on the error's
 * `response`, read by readRateLimits: `Retry-After`, else the latest reset of a limit with
 * nothing remaining; or an error's own `retryAfterMs`), or null.
 */
export function failureWaitMs(error, nowMs = Date.now()) {
  const response = isResponse(error) ? error : isResponse(error?.response) ? error.response : null;
  if (response !== null) {
    const r = readRateLimits(response, { now: nowMs });
    if (r.retryAfterMs !== null) return r.retryAfterMs;
    let wait = null;
    for (const l of r.limits) if (l.remaining === 0 && l.resetMs !== null) wait = Math.max(wait ?? 0, l.resetMs);
    if (wait !== null) return wait;
  }
  if (typeof error?.retryAfterMs === 'number' && error.retryAfterMs > 0) return error.retryAfterMs;
  return null;
}

function isResponse(v) {
  return v !== null && typeof v === 'object' && typeof v.status === 'number' && 'headers' in v;
}

function errorText(e) {
  if (isResponse(e)) return `HTTP ${e.status}`;
  if (isResponse(e?.response)) return `${e?.message ?? 'failed'} (HTTP ${e.response.status})`;
  return String(e?.message ?? e);
}

const COUNTERS = ['active', 'completed', 'failed', 'retried', 'dead', 'reclaimed', 'lost'];

function randomId() {
  const c = globalThis.crypto;
  if (c?.randomUUID) return c.randomUUID().slice(0, 8);
  return Math.floor(Math.random() * 2 ** 32).toString(16).padStart(8, '0');
}

/**
 * Runs `handler(job)` for jobs of `queue`, `concurrency` at once (default 1), each claimed
 * only when its group's pause, limit and concurrency allow it. A job is `{ id, group, data,
 * payload, cost, priority, attempt, maxAttempts, key, reclaimed, signal, settle(cost) }`:
 * `settle` names its actual cost, refunded or charged on the group's bucket when it ends;
 * `signal` aborts when the worker lost the job (another worker claimed it back).
 *
 * A handler that throws fails the attempt: retried after what the server said (a `Response`
 * thrown or on the error's `response`, whose `Retry-After` or exhausted rate-limit fields
 * name the wait; with `slowGroup`, the default, the whole group pauses that long), else after
 * exponential backoff with full jitter (`backoff: { base: 100, cap: 60000 }` ms); after its
 * last attempt, or at once for an error whose `permanent` is true or that `shouldRetry(error)`
 * refuses, to the group's dead-letter stream. A breaker per group in each worker (`breaker`,
 * default 5 failures in a row open it for 30 s; `false`: none): while it is open the worker
 * claims none of the group's jobs and parks the group until it half-opens, as the Rust worker
 * does; failures the server named a wait for do not count.
 *
 * Every `sweep` (default 5 s) the worker looks at a page of 100 of the queue's groups and puts
 * back one that holds jobs but is on neither list (its producer stopped between its two calls).
 *
 * While no group has a job to hand out, one slot of the worker polls: every 2 ms within 200 ms
 * of the last job found, then after 1 ms, twice as long each time nothing came, up to `poll`
 * (default 50 ms); the other slots wait for it.
 *
 * Events (addEventListener / on): 'active', 'completed', 'failed', 'retried', 'dead',
 * 'reclaimed', 'lost' (detail `{ job, ... }`), and 'error' (detail `{ error }`) when Redis
 * fails; metrics() counts them per group.
 */
export class Worker {
  #queue;
  #handler;
  #slots;
  #stop = new AbortController();
  #target = null;
  #running = null;
  #active = new Map();
  #metrics = new Map();
  #breakers = new Map();
  #heartbeat = null;
  #sweeper = null;
  #scout = null;
  #nap = 1;
  #foundAt = -Infinity;
  #lastPick = '';
  #repeats = 0;
  #unpicked = 0;
  #backoff;
  #breaker;

  constructor(queue, handler, options = {}) {
    if (!(queue instanceof JobQueue)) throw new TypeError('queue must be a JobQueue');
    if (typeof handler !== 'function') throw new TypeError('handler must be a function');
    const {
      concurrency = 1, consumer, backoff = {}, poll = 50, slowGroup = true, breaker = {}, shouldRetry,
      autorun = true, random = Math.random, sweep = 5000,
    } = options;
    this.#queue = queue;
    this.#handler = handler;
    this.#slots = wholeIn(concurrency, 1, 100000, 'concurrency');
    this.consumer = consumer ?? `w-${globalThis.process?.pid ?? 0}-${randomId()}`;
    if (typeof this.consumer !== 'string' || this.consumer === '') throw new TypeError('consumer must be a non-empty string');
    const base = msOption(backoff.base ?? 100, 'backoff.base');
    const cap = msOption(backoff.cap ?? 60000, 'backoff.cap');
    this.#backoff = { base, cap };
    this.pollMs = Math.max(1, msOption(poll, 'poll'));
    this.sweepMs = Math.max(10, msOption(sweep, 'sweep'));
    this.slowGroup = slowGroup;
    this.shouldRetry = shouldRetry;
    this.random = random;
    this.#breaker = breaker === false ? null : breaker;
    this.heartbeatMs = Math.max(1, Math.floor(queue.visibilityTimeoutMs / 3));
    if (autorun) this.run();
  }

  /** As EventTarget's. */
  addEventListener(type, listener, options) {
    (this.#target ??= new EventTarget()).addEventListener(type, listener, options);
  }

  removeEventListener(type, listener, options) {
    this.#target?.removeEventListener(type, listener, options);
  }

  /** `fn(detail)` on each event `type`; returns this. */
  on(type, fn) {
    this.addEventListener(type, (e) => fn(e.detail));
    return this;
  }

  #emit(type, detail) {
    if (this.#target !== null) this.#target.dispatchEvent(new CustomEvent(type, { detail }));
  }

  #count(group, what, by = 1) {
    let m = this.#metrics.get(group);
    if (!m) this.#metrics.set(group, (m = Object.fromEntries(COUNTERS.map((c) => [c, 0]))));
    m[what] += by;
  }

  /**
   * What this worker did, per group: `{ [group]: { active, completed, failed, retried, dead,
   * reclaimed, lost } }` (`active`: running now; `failed`: attempts that failed). The queue's
   * own figures, across workers, are `queue.inspect()`.
   */
  metrics() {
    const out = {};
    for (const [g, m] of this.#metrics) out[g] = { ...m };
    return out;
  }

  /** The breaker of `group`, made on first use (null without breakers). */
  breaker(group) {
    if (this.#breaker === null) return null;
    let b = this.#breakers.get(group);
    if (!b) {
      b = new CircuitBreaker({
        failureThreshold: this.#breaker.failureThreshold ?? 5,
        resetTimeout: this.#breaker.resetTimeout ?? 30000,
        halfOpenMax: this.#breaker.halfOpenMax ?? 1,
        isFailure: this.#breaker.isFailure ?? ((e) => failureWaitMs(e) === null),
        onStateChange: (state) => this.#emit('breaker', { group, state }),
      });
      this.#breakers.set(group, b);
    }
    return b;
  }

  /** Starts taking jobs (at construction unless `autorun: false`); resolves once closed. */
  run() {
    if (this.#running) return this.#running;
    this.#heartbeat = setInterval(() => this.#beat(), this.heartbeatMs);
    // A page of 100 groups every `sweep`: a group holding jobs but on neither list (its
    // producer stopped between enqueue and register) is put back.
    if (this.sweepMs !== Infinity) {
      this.#sweeper = setInterval(() => {
        this.#queue.sweep(100).catch((error) => this.#emit('error', { error }));
      }, this.sweepMs);
    }
    const slots = [];
    for (let i = 0; i < this.#slots; i++) slots.push(this.#slot());
    this.#running = Promise.all(slots).then(() => {
      clearInterval(this.#heartbeat);
      clearInterval(this.#sweeper);
    });
    return this.#running;
  }

  /** Stops taking jobs; resolves once the jobs running have finished (and were acknowledged). */
  async close() {
    this.#stop.abort();
    if (this.#running) await this.#running;
  }

  get closed() {
    return this.#stop.signal.aborted;
  }

  async #call(source, keys, args) {
    return this.#queue.run(source, keys, args);
  }

  /** The group whose turn it is: [group, ms until one is due ('' none)]. */
  async #pick() {
    const r = await this.#call(JOB_PICK, this.#queue[LIST_KEYS], []);
    const g = String(r[0]);
    if (g !== '') {
      this.#nap = 1;
      this.#foundAt = performance.now();
    }
    this.#repeats = g !== '' && g === this.#lastPick ? this.#repeats + 1 : 0;
    this.#lastPick = g;
    return [g, String(r[1])];
  }

  /**
   * Nothing to take: one slot naps and picks again; the others wait for it. Within 200 ms of
   * the last pick that found a group it naps 2 ms (work comes in a trickle); then 1 ms,
   * doubling while nothing comes, up to `poll` (or until the next group is due). Resolves to a
   * group, or null for the others (who pick themselves).
   */
  async #idle(dueMs) {
    if (this.#scout) {
      await this.#scout.promise;
      return null;
    }
    let release;
    this.#scout = { promise: new Promise((r) => { release = r; }) };
    try {
      let due = dueMs;
      for (;;) {
        const recent = performance.now() - this.#foundAt < 200;
        const nap = Math.min(recent ? 2 : this.#nap, this.pollMs, due === '' ? Infinity : Math.max(1, Number(due)));
        if (!recent) this.#nap = Math.min(this.#nap * 2, this.pollMs);
        try {
          await sleep(nap, this.#stop.signal);
        } catch {
          return null;
        }
        const [g, ms] = await this.#pick();
        if (g !== '') return g;
        due = ms;
      }
    } finally {
      this.#scout = null;
      release();
    }
  }

  /**
   * Script call `[source, keys, args]` and the next pick, sent together (one round trip):
   * [its reply, [group, ms]] (no pick once closing).
   */
  async #pickAlong(call) {
    if (this.closed) return [await this.#queue.run(...call), null];
    // One connection keeps their order: Redis runs the pick after the call.
    const [r, p] = await Promise.all([this.#queue.run(...call), this.#pick()]);
    return [r, { pick: p, claim: null }];
  }

  #claimArgs() {
    const q = this.#queue;
    return [q.limit?.stamp ?? '', this.consumer, q.concurrency, q.visibilityTimeoutMs];
  }

  async #slot() {
    // What the slot's last call brought along: { pick: [group, ms], claim } (claim: a claim of
    // the last job's group sent after that pick, { group, keys, reply }, or null), or null.
    let next = null;
    while (!this.closed) {
      try {
        let pick;
        if (next === null) {
          pick = await this.#pick();
        } else {
          ({ pick } = next);
          const { claim } = next;
          next = null;
          if (claim !== null) {
            if (pick[0] === claim.group) {
              // The pick named the group claimed after it: that claim is this turn's.
              next = await this.#claimed(claim.group, claim.keys, claim.reply, this.breaker(claim.group));
              if (next === SKIPPED) next = { pick: [claim.group, ''], claim: null };
              continue;
            }
            // Another group's turn came up: a job the claim took runs first (its group had one
            // turn more), then the group picked.
            if (String(claim.reply[0]) === 'job') await this.#runJob(claim.group, claim.keys, claim.reply, this.breaker(claim.group), false);
          }
        }
        const [g, ms] = pick;
        if (g === '') {
          const found = await this.#idle(ms);
          if (found !== null) next = { pick: [found, ''], claim: null };
          continue;
        }
        next = await this.#take(g);
      } catch (error) {
        next = null;
        this.#emit('error', { error });
        try {
          await sleep(this.pollMs, this.#stop.signal);
        } catch {
          // closing
        }
      }
    }
    // A job claimed along with the last finish, as the worker closed, runs before it stops.
    if (next?.claim && String(next.claim.reply[0]) === 'job') {
      const { group, keys, reply } = next.claim;
      try {
        await this.#runJob(group, keys, reply, this.breaker(group), false);
      } catch (error) {
        this.#emit('error', { error });
      }
    }
  }

  /**
   * Claims a job of `group` and runs it, or takes the group out of turn as claim says.
   * Resolves to what the last call brought along (see #slot), or null.
   */
  async #take(group) {
    const b = this.breaker(group);
    const q = this.#queue;
    if (b !== null && b.state === 'open') {
      // The group is parked without a claim until the breaker half-opens, whatever was
      // registered meanwhile (as the Rust worker does).
      let waitMs = 1;
      try {
        await b.call(() => {});
      } catch (e) {
        waitMs = Math.max(1, e?.retryAfterMs ?? 1);
      }
      const [, next] = await this.#pickAlong([JOB_PARK, q[LIST_KEYS], [group, 'park', ANY_VERSION, String(waitMs)]]);
      return next;
    }
    const keys = q.groupKeys(group);
    for (;;) {
      const r = await this.#call(JOB_CLAIM, keys, this.#claimArgs());
      const next = await this.#claimed(group, keys, r, b);
      if (next !== SKIPPED) return next;
    }
  }

  /** Acts on claim's reply `r` for `group`: runs the job, or parks the group as it says. */
  async #claimed(group, keys, r, b) {
    const q = this.#queue;
    const kind = String(r[0]);
    if (kind === 'job') return this.#runJob(group, keys, r, b, true);
    if (kind === 'skip') {
      if (r[1] !== '') {
        this.#count(group, 'dead');
        this.#emit('dead', { job: { id: String(r[1]), group }, reason: 'claim' });
      }
      return SKIPPED;
    }
    const version = String(r[2]);
    let park;
    if (kind === 'empty') {
      park = [group, 'drop', version, '0'];
    } else if (kind === 'wait' || kind === 'paused' || kind === 'delayed') {
      park = [group, 'park', version, String(r[1])];
    } else if (kind === 'busy' || kind === 'idle') {
      // A finished attempt raises the group's version and registers it again (with a
      // concurrency bound); a stopped worker's entry is claimed back after the visibility
      // timeout.
      park = [group, 'park', version, String(q.visibilityTimeoutMs)];
    } else {
      throw new Error(`unexpected reply from the claim script: ${JSON.stringify(r)}`);
    }
    const [, next] = await this.#pickAlong([JOB_PARK, q[LIST_KEYS], park]);
    return next;
  }

  /**
   * Runs a claimed job and finishes it. With `along`, the next pick goes with the finish, and
   * when the picks keep naming one group, a claim of the job's group after it (one round trip
   * where the picks would name that group again; while they name it again and again, 3 claims
   * in 4 go without a pick). Resolves to what came along, or null.
   */
  async #runJob(group, keys, r, breaker, along) {
    const [, id, entry, payload, cost, attempts, max, priority, key, reclaimed] = r.map(String);
    let data = payload;
    try {
      data = JSON.parse(payload);
    } catch {
      // Not JSON (a Rust producer's bytes): the text as it is.
    }
    let actual = '';
    // The signal is made when the handler asks for it.
    let ac = null;
    const held = { job: null, keys, lost: null, abort(reason) {
      this.lost = reason;
      ac?.abort(reason);
    } };
    const job = {
      id, group, data, payload, cost: Number(cost), priority: Number(priority), attempt: Number(attempts),
      maxAttempts: Number(max), key, reclaimed: reclaimed === '1', entry,
      get signal() {
        if (ac === null) {
          ac = new AbortController();
          if (held.lost !== null) ac.abort(held.lost);
        }
        return ac.signal;
      },
      settle(n) {
        wholeIn(n, 0, MAX_COST, 'the settled cost');
        actual = String(n);
      },
    };
    held.job = job;
    const name = `${group}\n${id}`;
    this.#active.set(name, held);
    this.#count(group, 'active');
    if (job.reclaimed) {
      this.#count(group, 'reclaimed');
      this.#emit('reclaimed', { job });
    }
    this.#emit('active', { job });
    let result;
    let error = null;
    let failed = false;
    try {
      result = await (breaker !== null ? breaker.call(() => this.#handler(job)) : this.#handler(job));
    } catch (e) {
      failed = true;
      error = e;
    }
    this.#active.delete(name);
    this.#count(group, 'active', -1);
    const q = this.#queue;
    const stamp = q.limit?.stamp ?? '';
    let outcome = 'done';
    let delay = 0;
    let pause = '';
    if (failed) {
      const serverMs = failureWaitMs(error);
      const retryable = error?.permanent !== true && (this.shouldRetry ? await this.shouldRetry(error, job) : true);
      outcome = retryable ? 'retry' : 'dead';
      if (serverMs !== null) {
        delay = Math.ceil(serverMs);
        if (this.slowGroup) pause = String(delay);
      } else {
        const bound = Math.min(this.#backoff.cap, this.#backoff.base * 2 ** (job.attempt - 1));
        delay = Math.floor(this.random() * bound);
      }
    }
    const finish = [JOB_FINISH, keys, [
      stamp, this.consumer, id, entry, outcome, actual, q.maxDebt, delay, pause, failed ? errorText(error) : '', q.keepCompletedMs,
    ]];
    // A retry registers the group after the finish; the next pick waits for that.
    let f;
    let next = null;
    if (!along || failed || q.concurrency > 0 || this.closed) {
      f = await this.#finish(finish);
    } else {
      const speculate = this.#repeats >= 2 && (breaker === null || breaker.state === 'closed');
      // While the picks name one group again and again, 3 finishes in 4 go without a pick:
      // their claim of the group is its turn. A group registered meanwhile is picked within
      // a few jobs of each slot.
      const withPick = !speculate || this.#repeats < 8 || ++this.#unpicked % 4 === 0;
      const calls = [this.#finish(finish), withPick ? this.#pick() : [group, '']];
      // A claim whose answer is lost leaves its job to be claimed back after the visibility
      // timeout: nothing to do here but go on.
      if (speculate) calls.push(this.#call(JOB_CLAIM, keys, this.#claimArgs()).catch(() => null));
      const [fr, p, c] = await Promise.all(calls);
      f = fr;
      next = { pick: p, claim: c ? { group, keys, reply: c } : null };
    }
    const res = String(f[0]);
    const due = String(f[2]);
    const version = String(f[3]);
    const detail = { job, settled: Number(f[1]) };
    if (res === 'lost') {
      this.#count(group, 'lost');
      this.#emit('lost', detail);
      return next;
    }
    if (failed) {
      this.#count(group, 'failed');
      this.#emit('failed', { ...detail, error });
    }
    if (res === 'done') {
      this.#count(group, 'completed');
      this.#emit('completed', { ...detail, result });
      // A slot of the group's concurrency is free: a group parked as busy runs again.
      if (q.concurrency > 0) await q.register(group, version, '0');
    } else if (res === 'retry') {
      this.#count(group, 'retried');
      await q.register(group, version, due);
      this.#emit('retried', { ...detail, error, delayMs: delay, pausedMs: pause === '' ? 0 : Number(pause), due: Number(due) });
    } else if (res === 'dead') {
      this.#count(group, 'dead');
      if (q.concurrency > 0) await q.register(group, version, '0');
      this.#emit('dead', { ...detail, error });
    }
    return next;
  }

  /** A finish, sent again (up to 3 times) when Redis failed: a repeat answers 'lost'. */
  async #finish(call) {
    for (let i = 0; ; i++) {
      try {
        return await this.#queue.run(...call);
      } catch (e) {
        if (i >= 2) throw e;
        this.#emit('error', { error: e });
        await sleep(50);
      }
    }
  }

  /** The heartbeat: every running job's entry touched; a job another worker took is lost. */
  async #beat() {
    const q = this.#queue;
    for (const held of this.#active.values()) {
      if (held.lost !== null) continue;
      const { job, keys } = held;
      q.run(JOB_TOUCH, keys, [this.consumer, job.id, job.entry]).then((ok) => {
        if (Number(ok) === 0 && held.lost === null) {
          held.abort(new Error(`job ${job.id} of group ${job.group} was claimed back by another worker`));
        }
      }, (error) => this.#emit('error', { error }));
    }
  }
}
