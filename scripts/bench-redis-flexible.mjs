// The peer in scripts/bench-redis.sh: rate-limiter-flexible's RateLimiterRedis over ioredis,
// 50 concurrent callers in one Node process, on the Redis at --port.
//
//   node scripts/bench-redis-flexible.mjs --port 6379 --scenario random|hot [--concurrency 50]
//        [--seconds 5] [--warmup 1] [--auto-pipelining]
//
// Prints one JSON line: {"impl", "scenario", "concurrency", "seconds", "decisions", "allowed",
// "denied", "per_sec"}.
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';

const require = createRequire(new URL('./bench/', import.meta.url));
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '6379' },
    scenario: { type: 'string', default: 'random' },
    concurrency: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    'auto-pipelining': { type: 'boolean', default: false },
  },
});
const concurrency = Number(args.concurrency);
const seconds = Number(args.seconds);
const warmup = Number(args.warmup);
const hot = args.scenario === 'hot';

const redis = new Redis({
  host: '127.0.0.1',
  port: Number(args.port),
  enableAutoPipelining: args['auto-pipelining'],
  lazyConnect: false,
});
// random: every key new, every decision allowed. hot: one key, 10 per minute, denied after 10.
const limiter = new RateLimiterRedis({
  storeClient: redis,
  keyPrefix: `rlf-${args.scenario}-${Date.now()}`,
  points: hot ? 10 : 1000,
  duration: hot ? 60 : 1,
});

let counting = false;
let stop = false;
let allowed = 0;
let denied = 0;

async function caller() {
  while (!stop) {
    const key = hot ? 'hot' : `k${Math.floor(Math.random() * 1e9)}`;
    try {
      await limiter.consume(key, 1);
      if (counting) allowed++;
    } catch (e) {
      if (e instanceof Error) throw e;
      if (counting) denied++;
    }
  }
}

const callers = Array.from({ length: concurrency }, caller);
await new Promise((r) => setTimeout(r, warmup * 1000));
counting = true;
const start = process.hrtime.bigint();
await new Promise((r) => setTimeout(r, seconds * 1000));
counting = false;
const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
stop = true;
await Promise.all(callers);
redis.disconnect();
const decisions = allowed + denied;
const name = args['auto-pipelining']
  ? 'rate-limiter-flexible (ioredis autopipelining)'
  : 'rate-limiter-flexible';
console.log(JSON.stringify({
  impl: name,
  scenario: args.scenario,
  concurrency,
  seconds: elapsed,
  decisions,
  allowed,
  denied,
  per_sec: Math.round(decisions / elapsed),
}));
