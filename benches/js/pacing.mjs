// Clients that pace themselves from the server's limits: sluice-limits' paced(fetch) beside
// p-queue and Bottleneck configured the way their docs suggest, in one run, against the
// stand-in servers of packages/sluice-js/test/standin.mjs (127.0.0.1, free ports).
//
// Every round runs all of them at once, for `--seconds` (default 60): for each provider style
// (ietf, openai, anthropic, github) and each client, a server of its own with the same hidden
// limit, and a group of 8 workers calling it in a loop. The hidden limit is 50 requests per
// 10 s, lowered to 30 per 10 s half-way through (providers change limits; a guessed rate
// goes stale). On a 429 a worker waits what Retry-After says before its next call, whatever
// the client (sluice's pacer waits it too).
//
//   sluice      paced(fetch): no rate given, it reads the server's fields
//   p-queue     new PQueue({ concurrency: 8, interval: 10000, intervalCap: 50 }): the rate
//               guessed from the provider's documented limit
//   bottleneck  new Bottleneck({ maxConcurrent: 8, reservoir: 50, reservoirRefreshAmount: 50,
//               reservoirRefreshInterval: 10000 }), and after each response its reservoir set
//               to the server's remaining, as its users do; through incrementReservoir(), since
//               updateSettings() in 2.19.5 stops the reservoir refresh (its LocalDatastore's
//               _startHeartbeat clears the timer when one runs), after which it never refills
//
// Figures per client group: 429s per minute over the whole run, and the share of the allowed
// throughput used in steady state: answers served from one window after the start and after
// the change to the end of each half, over the hidden limit's rate times that time (50, then
// 30, per 10 s). The first window of each half is left out of both: a bucket that starts full
// allows a one-off burst above the rate, which is not throughput a client can keep. The
// served count of the whole run (the servers' own) is given beside it. Medians over rounds,
// with min and max.
//
//   cd benches/js && npm ci && node pacing.mjs [--rounds 3] [--seconds 60] [--json]

import Bottleneck from 'bottleneck';
import PQueue from 'p-queue';

import { paced } from '../../packages/sluice-js/src/index.js';
import { standIn, drive, tally } from '../../packages/sluice-js/test/standin.mjs';

const args = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
};
const ROUNDS = Number(flag('--rounds', 3));
const SECONDS = Number(flag('--seconds', 60));
const JSON_OUT = args.includes('--json');

const WINDOW = 10000;
const BEFORE = 50;
const AFTER = 30;
const WORKERS = 8;
const STYLES = ['ietf', 'openai', 'anthropic', 'github'];
const CLIENTS = ['sluice', 'p-queue', 'bottleneck'];

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The `remaining` of the request limit in a response, read as each provider's docs say. */
function remainingOf(style, res) {
  const h = res.headers;
  if (style === 'ietf') return Number(/;r=(\d+)/.exec(h.get('ratelimit') ?? '')?.[1] ?? NaN);
  if (style === 'openai') return Number(h.get('x-ratelimit-remaining-requests'));
  if (style === 'anthropic') return Number(h.get('anthropic-ratelimit-requests-remaining'));
  return Number(h.get('x-ratelimit-remaining'));
}

/** `send()` for a client: one call, resolving to its status once a 429's Retry-After was waited. */
function client(name, style, url) {
  const call = async (f) => {
    const res = await f();
    await res.arrayBuffer();
    if (res.status === 429) await sleep(Number(res.headers.get('retry-after') ?? 1) * 1000);
    return res.status;
  };
  if (name === 'sluice') {
    const f = paced(fetch);
    return () => call(() => f(url));
  }
  if (name === 'p-queue') {
    const queue = new PQueue({ concurrency: WORKERS, interval: WINDOW, intervalCap: BEFORE });
    return () => call(() => queue.add(() => fetch(url)));
  }
  const limiter = new Bottleneck({
    maxConcurrent: WORKERS, reservoir: BEFORE, reservoirRefreshAmount: BEFORE, reservoirRefreshInterval: WINDOW,
  });
  return () => call(async () => {
    const res = await limiter.schedule(() => fetch(url));
    const remaining = remainingOf(style, res);
    if (Number.isFinite(remaining)) await limiter.incrementReservoir(remaining - (await limiter.currentReservoir()));
    return res;
  });
}

async function round() {
  const ms = SECONDS * 1000;
  const runs = [];
  for (const style of STYLES) {
    for (const name of CLIENTS) {
      // Token limits far above the request limit: only requests bind (the peers count requests).
      const server = await standIn({ style, limit: BEFORE, windowMs: WINDOW, tokens: BEFORE * 1000, skewMs: style === 'github' ? 45000 : 0 });
      runs.push({ style, name, server, send: client(name, style, server.url) });
    }
  }
  const change = setTimeout(() => runs.forEach((r) => r.server.setLimit(AFTER, AFTER * 1000)), ms / 2);
  const logs = await Promise.all(runs.map((r) => drive(r.send, { workers: WORKERS, ms })));
  clearTimeout(change);
  const out = [];
  for (const [i, r] of runs.entries()) {
    const { ok, limited } = tally(logs[i]);
    const elapsed = Math.max(ms, logs[i].at(-1)?.[0] ?? ms);
    const steady = tally(logs[i], WINDOW, ms / 2).ok + tally(logs[i], ms / 2 + WINDOW, ms).ok;
    const allowed = (BEFORE * (ms / 2 - WINDOW) + AFTER * (ms / 2 - WINDOW)) / WINDOW;
    out.push({
      style: r.style, client: r.name, ok, limited, served: r.server.stats.ok,
      perMinute: (limited * 60000) / elapsed, share: steady / allowed,
    });
    await r.server.close();
  }
  return out;
}

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
};

const started = new Date().toISOString();
const rounds = [];
for (let i = 0; i < ROUNDS; i++) {
  const r = await round();
  rounds.push(r);
  if (!JSON_OUT) {
    console.log(`round ${i + 1}: ${r.map((x) => `${x.style}/${x.client} ${x.served} ok ${x.limited} 429s`).join(', ')}`);
  }
}
const summary = [];
for (const style of STYLES) {
  for (const name of CLIENTS) {
    const mine = rounds.map((r) => r.find((x) => x.style === style && x.client === name));
    summary.push({
      style, client: name, perMinute: stats(mine.map((x) => x.perMinute)), share: stats(mine.map((x) => x.share)),
      served: stats(mine.map((x) => x.served)),
    });
  }
}
if (JSON_OUT) {
  console.log(JSON.stringify({ started, rounds: ROUNDS, seconds: SECONDS, summary, raw: rounds }, null, 1));
} else {
  const f = (s, d = 2) => `${s.median.toFixed(d)} (${s.min.toFixed(d)} to ${s.max.toFixed(d)})`;
  console.log(`\n${ROUNDS} rounds of ${SECONDS} s from ${started}; hidden limit ${BEFORE} then ${AFTER} per ${WINDOW / 1000} s, ${WORKERS} workers per client group`);
  console.log('style      client      429s per minute        share of allowed (steady)     served in the run   share ratio (sluice / client)');
  for (const s of summary) {
    const mine = summary.find((x) => x.style === s.style && x.client === 'sluice');
    const ratio = s.client === 'sluice' ? '' : (mine.share.median / s.share.median).toFixed(3);
    console.log(`${s.style.padEnd(10)} ${s.client.padEnd(11)} ${f(s.perMinute, 1).padEnd(22)} ${f(s.share, 3).padEnd(29)} ${f(s.served, 0).padEnd(19)} ${ratio}`);
  }
}
