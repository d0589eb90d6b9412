// A TypeScript consumer of every documented API, compiled by tsc --strict --noEmit: in this
// folder by test/types.test.mjs (nodenext), and in a fresh folder from `npm pack` by
// test/pack.test.mjs (nodenext with TypeScript 7 and 5, node10 with TypeScript 5). The lines
// marked as expected errors below must stay errors.
import {
  RateLimiter, PromisePool, limit, keyed, Keyed, retry, rateLimitHints, CircuitBreaker, ALGORITHMS,
  keyHash, ready,
  SluiceError, QueueFullError, TimeoutError, AbortError, InsufficientCapacityError, ClosedError,
  CircuitOpenError, UnavailableError,
  readRateLimits, parseIetf, parseOpenAI, parseAnthropic, parseGitHub, parseRetryAfter, parseDuration, parseList,
  measureSkew, Pacer, Ticket, MemoryPacerStore, pacer, paced, JobQueue, Worker, failureWaitMs,
} from 'sluice-limits';
import type { Job, JobGroupStats, Enqueued, DeadLetter, StoredJob, JobCounters } from 'sluice-limits';
import type { Algorithm, ChargeOptions, Duration, RateLimitHints, RefundOptions, TimeoutReason, RateLimitReading, ServerLimit, PacedFetch, PacerLimitState } from 'sluice-limits';
import { RedisStore, RedisPacerStore } from 'sluice-limits/redis';
import type { RedisDecision } from 'sluice-limits/redis';
import { createClient, createCluster } from 'redis';
import { Redis, Cluster } from 'ioredis';

export async function main(): Promise<void> {
  await ready();
  const limiter = new RateLimiter({ algorithm: 'gcra', capacity: 20, rate: '10/s', queue: { depth: 100, maxWait: '2s' }, timeout: '5s' });
  const n: number = await limiter.schedule(async ({ signal }) => (signal ? 1 : 42), { cost: 2, priority: 'high', signal: AbortSignal.timeout(1000), maxWait: 500, timeout: '1s' });
  const ok: boolean = limiter.tryAcquire(1);
  await limiter.acquire({ cost: 1 });
  const fetchLimited: (url: string) => Promise<number> = limiter.wrap(async (url: string) => url.length);
  limiter.reconfigure({ capacity: 40, rate: '20/s', algorithm: 'token_bucket', queue: { maxWait: '1s' } });
  limiter.pause();
  limiter.resume();
  const cleared: number = limiter.clear('shutting down');
  limiter.addEventListener('completed', (e: CustomEvent) => console.log(e.detail));
  limiter.addEventListener('idle', () => {}, { once: true });
  await limiter.onEmpty();
  await limiter.onIdle();
  const counts: number[] = [limiter.pending, limiter.active, limiter.available, limiter.capacity];
  const idle: boolean = limiter.isIdle() && !limiter.isPaused;
  const charged: ChargeOptions = { maxDebt: 50 };
  const forgiven: number = limiter.charge(120, charged) + limiter.charge(3) + limiter.charge(1, { maxDebt: Infinity });
  const back: RefundOptions = { ago: '2s' };
  limiter.refund(2, back);
  limiter.refund(1);
  limiter.close();

  const pool = new PromisePool({ concurrency: 4, maxWait: '10s', timeout: 30000 });
  const doubled: number[] = await pool.map([1, 2, 3], (x) => x * 2);
  const one: string = await pool.run(() => 'x', { priority: 'low', signal: new AbortController().signal, maxWait: 100, timeout: 1000 });
  pool.concurrency = 8;
  const wrapped: (a: number) => Promise<number> = pool.wrap((a: number) => a + 1);
  pool.pause();
  pool.resume();
  pool.clear();
  await pool.onIdle();

  const both = limit({ concurrency: 2, capacity: 5, rate: '5/s', queue: { maxWait: '2s' } });
  const s: string = await both.schedule(() => 'x', { priority: 'high', maxWait: '1s' });
  const r2: string = await both.run(() => 'y');
  both.concurrency = 3;
  both.reconfigure({ rate: '10/s' });
  const bothForgiven: number = both.charge(4, { maxDebt: 10 });
  both.refund(1, { ago: 100 });
  both.pause();
  both.resume();
  both.clear();
  await both.onIdle();
  const parts: [PromisePool, RateLimiter | null, number, number] = [both.pool, both.limiter, both.active, both.pending];
  both.close();

  const perUser = keyed({ maxKeys: 1000, capacity: 10, rate: '1/s' });
  const also: Keyed<string> = new Keyed({ maxKeys: 10, capacity: 1, rate: '1/s' });
  const u: boolean = perUser.tryAcquire('user-1');
  const lim: RateLimiter = perUser.get('user-1');
  const ran: number = await perUser.schedule('user-2', () => 7, { cost: 1 });
  const byKey: (key: string, n: number) => Promise<string> = perUser.wrap((key: string, k: number) => `${key}${k}`);
  perUser.reconfigure({ capacity: 20 });
  const keyForgiven: number = perUser.charge('user-1', 30, { maxDebt: 5 });
  perUser.refund('user-1', 2, { ago: '1s' });
  const sizes: number[] = [perUser.size, perUser.maxKeys, Number(perUser.has('x'))];
  perUser.close();
  also.close();

  const res: Response = await retry(() => fetch('http://127.0.0.1/'), {
    retries: 5, base: 100, cap: 5000, jitter: 'full', respectRetryAfter: true, maxRetryAfter: '2min',
    onRetry: ({ attempt, waitMs }) => console.log(attempt, waitMs),
  });
  const hints: RateLimitHints = rateLimitHints(res);
  const ra: number | null = rateLimitHints(new Headers()).retryAfterMs ?? hints.resetMs;
  const breaker = new CircuitBreaker({ failureThreshold: 3, resetTimeout: '10s', onStateChange: (st) => console.log(st) });
  const state: 'closed' | 'open' | 'half-open' = breaker.state;
  const called: number = await breaker.call(async () => 1);
  const names: readonly Algorithm[] = ALGORITHMS;
  const hashed: string = keyHash('salt', 'sk-live-key') + keyHash(new Uint8Array([1, 2]), new Uint8Array([3]));
  const d: Duration = '250ms';

  // The errors, each with its constructor as the package builds it.
  const errors: SluiceError[] = [
    new QueueFullError('full', 100),
    new TimeoutError('late', 100, 'expired'),
    new AbortError('aborted', { cause: 'why' }),
    new InsufficientCapacityError(5, 2),
    new ClosedError('closed'),
    new CircuitOpenError('open', 100),
    new UnavailableError('down', 250, { cause: new Error('ECONNREFUSED') }),
  ];
  const e: unknown = errors[0];
  if (e instanceof TimeoutError || e instanceof QueueFullError || e instanceof CircuitOpenError || e instanceof UnavailableError) {
    const ms: number = e.retryAfterMs;
  }
  if (e instanceof TimeoutError) {
    const why: TimeoutReason = e.reason;
  }
  if (e instanceof AbortError) {
    const name: 'AbortError' = e.name;
  }
  if (e instanceof InsufficientCapacityError) {
    const c: number = e.cost + e.capacity;
  }

  // Redis: every client the store takes.
  const nodeRedis = await createClient({ url: 'redis://127.0.0.1:6379' }).connect();
  const nodeCluster = createCluster({ rootNodes: [{ url: 'redis://127.0.0.1:7000' }] });
  const io = new Redis(6379, '127.0.0.1');
  const ioCluster = new Cluster([{ host: '127.0.0.1', port: 7000 }]);
  for (const client of [nodeRedis, nodeCluster, io, ioCluster]) {
    const store = new RedisStore({
      client, prefix: 'sluice:api', algorithm: 'gcra', capacity: 10, rate: '5/s', maxWait: '1s',
      timeout: '100ms', onError: 'local', retryInterval: 250, keySalt: 'pepper',
    });
    const decision: RedisDecision = await store.check('k', 1);
    const src: 'redis' | 'local' | 'allow' | 'deny' = decision.source;
    const taken: boolean = await store.tryAcquire('k');
    const out: number = await store.schedule('k', () => 1, { cost: 1, signal: AbortSignal.timeout(100), maxWait: 500 });
    const key: string = store.redisKey('k');
    const storeForgiven: number = await store.charge('k', 250, { maxDebt: 100 });
    await store.refund('k', 1, { ago: '1s' });
  }

  // Paced clients and the limit fields.
  const reading: RateLimitReading = readRateLimits(new Headers({ ratelimit: '"a";r=1' }), { now: Date.now(), skewMs: null });
  const firstLimit: ServerLimit | undefined = reading.limits[0];
  const family: 'ietf' | 'openai' | 'anthropic' | 'github' | null = reading.family;
  const ietfLimits: ServerLimit[] = parseIetf('"a";q=1;w=1', null);
  const get = (name: string): string | null => (name ? null : null);
  const providerLimits: ServerLimit[] = [...parseOpenAI(get), ...parseAnthropic(get, 0, 0), ...parseGitHub(get, 0)];
  const waits: (number | null)[] = [parseRetryAfter('1', 0), parseDuration('6m0s'), measureSkew(null, 0)];
  const sf = parseList('"a";q=1');
  const p = pacer({ limits: { requests: '60/min' }, store: new MemoryPacerStore() });
  const ticket: Ticket = await p.acquire({ cost: { tokens: 10 }, signal: AbortSignal.timeout(1000) });
  await ticket.observe(new Response(null));
  await ticket.reconcile({ tokens: 5 });
  await ticket.abandon();
  const scheduled: number = await p.schedule(async () => 7, { cost: { tokens: 1 } });
  const seen: PacerLimitState | undefined = (await p.state()).limits['ietf:a'];
  const pacedFetch: PacedFetch = paced(fetch, { usage: 'openai', pacer: new Pacer() });
  await pacedFetch('https://example.invalid/', { method: 'POST', cost: { tokens: 100 } });
  const fleet = pacer({ store: new RedisPacerStore({ client: nodeRedis, key: 'pace:api', ttl: 60000 }) });
  const pacedLimits: unknown = [pacedFetch.pacer, fleet, firstLimit, family, ietfLimits, providerLimits, waits, sf, scheduled, seen];

  // Durable jobs.
  const jobs = new JobQueue({ client: io, name: 'embed', limit: { prefix: 'llm', algorithm: 'gcra', capacity: 90000, rate: '90000/min' }, concurrency: 4, visibilityTimeout: '30s', keepCompleted: '1d', maxDebt: 10000 });
  const queued: Enqueued = await jobs.enqueue({ text: 'x' }, { group: 'key-1', cost: 800, priority: 10, delay: '1s', maxAttempts: 5, key: 'doc-1' });
  const many: Enqueued[] = await jobs.enqueueMany([{ data: 1, group: 'key-2' }]);
  const figures: Record<string, JobGroupStats> = await jobs.inspect();
  const letters: DeadLetter[] = await jobs.deadLetters('key-1', { count: 10 });
  const stored: StoredJob | null = await jobs.job('key-1', queued.id);
  const moved: number = await jobs.retryDead('key-1') + await jobs.purge('key-1', 'dead') + await jobs.purge() + await jobs.sweep(100);
  const jobWorker = new Worker<{ text: string }>(new JobQueue({ client: nodeRedis, name: 'embed' }), async (job: Job<{ text: string }>) => {
    job.settle(job.data.text.length);
    return job.signal.aborted;
  }, { concurrency: 8, backoff: { base: 100, cap: '1min' }, poll: 50, sweep: '5s', slowGroup: true, breaker: { failureThreshold: 5, resetTimeout: '30s' }, shouldRetry: (e) => e !== null });
  jobWorker.on('retried', ({ job, delayMs }) => console.log(job.id, delayMs)).on('error', ({ error }) => console.log(error));
  const perGroup: Record<string, JobCounters> = jobWorker.metrics();
  const hinted: number | null = failureWaitMs(new Response(null, { status: 429 }));
  await jobWorker.close();
  const jobsUsed: unknown = [many, figures, letters, stored, moved, perGroup, hinted];
  // @ts-expect-error: a job queue needs a name
  new JobQueue({ client: io });
  // @ts-expect-error: the handler takes a job
  new Worker(jobs, async (job: string) => job);

  // @ts-expect-error: usage is 'openai', 'anthropic' or a function
  paced(fetch, { usage: 'gemini' });
  // @ts-expect-error: rate is a string such as "10/s"
  new RateLimiter({ capacity: 1, rate: 10 });
  // @ts-expect-error: priority is high, normal or low
  limiter.schedule(() => 1, { priority: 'urgent' });
  // @ts-expect-error: capacity is required
  new RateLimiter({ rate: '1/s' });
  // @ts-expect-error: Keyed takes the options keyed() takes
  new Keyed();
  // @ts-expect-error: not a Redis client
  new RedisStore({ client: {}, capacity: 1, rate: '1/s' });
  // @ts-expect-error: onError is local, allow, deny or throw
  new RedisStore({ client: io, capacity: 1, rate: '1/s', onError: 'ignore' });
  // @ts-expect-error: maxDebt is a number of tokens
  limiter.charge(5, { maxDebt: '50%' });
  // @ts-expect-error: keyed charges name the key
  perUser.charge(5);
  // @ts-expect-error: ALGORITHMS is read-only
  ALGORITHMS.sort();
  void [n, ok, fetchLimited, cleared, counts, idle, forgiven, bothForgiven, keyForgiven, doubled, one, wrapped, s, r2, parts, u, lim, ran, byKey, sizes, ra, state, called, names, hashed, d, pacedLimits, jobsUsed];
}
