// Stand-in servers on 127.0.0.1 that enforce a hidden limit and announce it in one provider's
// style, for the pacing tests and bench/pacing.mjs:
//
//   ietf       a token bucket, announced as sluice serve does with the IETF fields
//              (RateLimit-Policy: "default";q=Q;w=W, RateLimit: "default";r=R;t=T, t the
//              seconds until full, rounded up); 429 with Retry-After when empty
//   openai     two token buckets, requests and tokens, x-ratelimit-*-{requests,tokens} with
//              Go-duration resets (time until full); the tokens a request used (header
//              x-use-tokens, default 100) come back as JSON usage.total_tokens
//   anthropic  the same two buckets, anthropic-ratelimit-{requests,tokens}-* with RFC 3339
//              resets (whole seconds, rounded up)
//   github     a fixed window, x-ratelimit-{limit,remaining,used,reset,resource}, the reset a
//              Unix time of the server's clock, which runs `skewMs` ahead of this one (its
//              Date field says so)
//
// `limit` requests (and `tokens`) per `windowMs`; `setLimit(limit, tokens)` changes them while
// it runs. `stats` counts answers: { ok, limited, tokens, firstAt, lastAt, admittedAt } (the
// times of the first and last admitted, and of every admission, in ms since 1970 on the
// server's clock: what a share of the allowed throughput is counted from, where no client's
// scheduling can move it).

import http from 'node:http';

function bucket(capacity, windowMs, now) {
  return { capacity, windowMs, level: capacity, at: now };
}

function refill(b, now) {
  b.level = Math.min(b.capacity, b.level + ((now - b.at) * b.capacity) / b.windowMs);
  b.at = now;
}

/** Ms until the bucket is full, and until it holds `n`. */
const untilFull = (b) => ((b.capacity - b.level) * b.windowMs) / b.capacity;
const untilHas = (b, n) => Math.max(0, ((n - b.level) * b.windowMs) / b.capacity);

/** A Go duration as OpenAI writes it: 6m0s, 1.5s, 120ms. */
export function goDuration(ms) {
  if (ms < 1000) return `${Math.ceil(ms)}ms`;
  const s = Math.ceil(ms / 10) / 100;
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  return `${m}m${Math.round((s - m * 60) * 100) / 100}s`;
}

const rfc3339 = (ms) => new Date(Math.ceil(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');

export async function standIn({ style, limit, windowMs, tokens = limit * 100, skewMs = 0, latencyMs = 2 }) {
  const clock = () => performance.timeOrigin + performance.now();
  const stats = { ok: 0, limited: 0, tokens: 0, firstAt: null, lastAt: null, admittedAt: [] };
  let requests = bucket(limit, windowMs, clock());
  let tokenBucket = bucket(tokens, windowMs, clock());
  // GitHub's fixed window, on the server's clock (ahead by skewMs).
  let windowEnd = Math.ceil((clock() + skewMs + windowMs) / 1000) * 1000;
  let used = 0;

  function answer(req, res) {
    const now = clock();
    const want = Number(req.headers['x-use-tokens'] ?? 100);
    const h = { 'content-type': 'application/json' };
    let allowed;
    if (style === 'github') {
      const serverNow = now + skewMs;
      if (serverNow >= windowEnd) {
        windowEnd += Math.ceil((serverNow - windowEnd + 1) / windowMs) * windowMs;
        used = 0;
      }
      allowed = used < requests.capacity;
      if (allowed) used++;
      Object.assign(h, {
        date: new Date(serverNow).toUTCString(),
        'x-ratelimit-limit': String(requests.capacity), 'x-ratelimit-remaining': String(requests.capacity - used),
        'x-ratelimit-used': String(used), 'x-ratelimit-reset': String(windowEnd / 1000), 'x-ratelimit-resource': 'core',
      });
      if (!allowed) h['retry-after'] = String(Math.ceil((windowEnd - serverNow) / 1000));
    } else {
      refill(requests, now);
      refill(tokenBucket, now);
      const costly = style !== 'ietf';
      allowed = requests.level >= 1 && (!costly || tokenBucket.level >= want);
      if (allowed) {
        requests.level -= 1;
        if (costly) tokenBucket.level -= want;
      }
      const r = Math.floor(requests.level);
      if (style === 'ietf') {
        h['ratelimit-policy'] = `"default";q=${requests.capacity};w=${Math.ceil(requests.windowMs / 1000)}`;
        h.ratelimit = `"default";r=${r};t=${Math.ceil(untilFull(requests) / 1000)}`;
      } else if (style === 'openai') {
        Object.assign(h, {
          'x-ratelimit-limit-requests': String(requests.capacity), 'x-ratelimit-remaining-requests': String(r),
          'x-ratelimit-reset-requests': goDuration(untilFull(requests)),
          'x-ratelimit-limit-tokens': String(tokenBucket.capacity), 'x-ratelimit-remaining-tokens': String(Math.floor(tokenBucket.level)),
          'x-ratelimit-reset-tokens': goDuration(untilFull(tokenBucket)),
        });
      } else if (style === 'anthropic') {
        Object.assign(h, {
          date: new Date(now).toUTCString(),
          'anthropic-ratelimit-requests-limit': String(requests.capacity), 'anthropic-ratelimit-requests-remaining': String(r),
          'anthropic-ratelimit-requests-reset': rfc3339(now + untilFull(requests)),
          'anthropic-ratelimit-tokens-limit': String(tokenBucket.capacity),
          'anthropic-ratelimit-tokens-remaining': String(Math.floor(tokenBucket.level)),
          'anthropic-ratelimit-tokens-reset': rfc3339(now + untilFull(tokenBucket)),
        });
      } else {
        throw new Error(`unknown style ${style}`);
      }
      if (!allowed) {
        const wait = Math.max(untilHas(requests, 1), costly ? untilHas(tokenBucket, want) : 0);
        h['retry-after'] = String(Math.max(1, Math.ceil(wait / 1000)));
      }
    }
    if (allowed) {
      stats.ok++;
      stats.firstAt ??= now;
      stats.lastAt = now;
      stats.admittedAt.push(now);
      stats.tokens += style === 'ietf' || style === 'github' ? 0 : want;
      res.writeHead(200, h).end(JSON.stringify({ usage: { total_tokens: want, input_tokens: want, output_tokens: 0 } }));
    } else {
      stats.limited++;
      res.writeHead(429, h).end('{"error":"rate limited"}');
    }
  }

  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => (latencyMs ? setTimeout(() => answer(req, res), latencyMs) : answer(req, res)));
  });
  server.keepAliveTimeout = 60000;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/`,
    stats,
    get limit() {
      return requests.capacity;
    },
    /** Changes the hidden limit (and token limit) now; what is left is kept, at most the new capacity. */
    setLimit(newLimit, newTokens = newLimit * 100) {
      const now = clock();
      refill(requests, now);
      refill(tokenBucket, now);
      requests = { ...bucket(newLimit, windowMs, now), level: Math.min(newLimit, requests.level) };
      tokenBucket = { ...bucket(newTokens, windowMs, now), level: Math.min(newTokens, tokenBucket.level) };
      if (style === 'github') used = Math.min(used, newLimit);
    },
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(resolve); }),
  };
}

/**
 * `workers` loops that call `send()` (resolving to a status) until `ms` have passed: every
 * answer as [ms since the start, status], in the order they came.
 */
export async function drive(send, { workers = 8, ms }) {
  const t0 = performance.now();
  const log = [];
  await Promise.all(Array.from({ length: workers }, async () => {
    while (performance.now() - t0 < ms) {
      const status = await send();
      log.push([performance.now() - t0, status]);
    }
  }));
  return log;
}

/** Answers in [from, to) ms: { ok, limited }. */
export function tally(log, from = 0, to = Infinity) {
  let ok = 0;
  let limited = 0;
  for (const [t, status] of log) {
    if (t < from || t >= to) continue;
    if (status === 429) limited++;
    else ok++;
  }
  return { ok, limited };
}
