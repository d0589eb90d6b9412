// The fetch events: which requests sluice limits, the decision for each (the module's), and
// the response: none (the browser sends it), sent from here once admitted, 429, or `fail`.
//
// Owns: nothing that outlives a request; the modules it imports hold the state.
// Must not touch: IndexedDB (record.js), the waiters (queue.js), the module outside `guarded`.

import { failure, guarded, limiter, moduleFailed } from './instance.js';
import { count } from './telemetry.js';
import { isRedispatch, requestKey } from './journal.js';
import { covered, ready, reserveNext, restored, saved, scheduleSave } from './record.js';
import { sendUpstream } from './upstream.js';
import { costOf, pacing, paceLost, paceTurn } from './pace.js';
import { wait } from './queue.js';
import { failedResponse } from './failure.js';
import { bodySize, flowOf } from './requests.js';
import { STATE_PATH, stateResponse } from './state.js';
import { config } from './worker.js';

function tooMany(reason, retryAfterMs) {
  const ms = Math.max(0, Math.ceil(retryAfterMs));
  count((c) => c.rejected[reason]++);
  return new Response(JSON.stringify({ title: 'Too Many Requests', status: 429, reason, retry_after_ms: ms }), {
    status: 429,
    statusText: 'Too Many Requests',
    headers: {
      'content-type': 'application/problem+json',
      'retry-after': String(Math.ceil(ms / 1000)),
      'cache-control': 'no-store',
      'x-sluice-limiter': 'browser',
    },
  });
}

const PRIORITIES = { high: 0, normal: 1, low: 2 };

/** The decision for one request, synchronous: the module's offer (or a re-dispatched copy). */
function decide(event, req, key, size) {
  if (isRedispatch(key)) {
    count((c) => c.redispatched++);
    return { result: 'redispatched' };
  }
  const mayWait = size <= config.max_queued_body_bytes;
  const priority = PRIORITIES[(req.headers.get('x-sluice-priority') || '').toLowerCase()];
  const flow = flowOf(event.clientId || event.resultingClientId);
  const offer = guarded(() => limiter.offer(performance.now(), 1, flow, priority === undefined ? 1 : priority, mayWait ? -1 : 0));
  return offer === null ? { result: 'failed' } : offer;
}

/**
 * An admitted request sent from here: with `pace_from_server`, after its turn in pace.js (a
 * turn past `queue.max_wait_ms` is a 429 `timeout` with the wait the server's fields ask), at
 * the cost its `X-Sluice-Tokens` declares.
 */
async function send(event, key, req) {
  if (!pacing) return sendUpstream(key, req);
  const turn = await paceTurn(config.queue.max_wait_ms, costOf(req));
  if (turn.ticket === null) return tooMany('timeout', turn.waitMs);
  // A tab that closed while its request waited its turn: not sent.
  if (event.clientId && !(await self.clients.get(event.clientId))) {
    paceLost(turn.ticket);
    count((c) => c.cancelled++);
    return Response.error();
  }
  return sendUpstream(key, req, turn.ticket);
}

/** The slow path: before the bucket is restored, or for a request with a body. */
async function limited(event, key) {
  const req = event.request;
  try {
    await ready();
  } catch (e) {
    moduleFailed(e); // restoring the bucket trapped
  }
  if (failure !== null) return failedResponse(req);
  const size = await bodySize(req, config.max_queued_body_bytes);
  if (failure !== null) return failedResponse(req); // failed while the body was counted
  return respond(event, req, key, decide(event, req, key, size));
}

/** The response for a decision, sending the request upstream from here when admitted. */
async function respond(event, req, key, offer) {
  switch (offer.result) {
    case 'redispatched':
      return Response.error();
    case 'failed':
      return failedResponse(req);
    case 'admitted':
      count((c) => c.admitted++);
      scheduleSave();
      return send(event, key, req);
    case 'queued': {
      count((c) => c.queued++);
      const queuedAt = performance.now();
      let outcome = await wait(offer.ticket, req.signal, event.clientId, req.headers.get('x-sluice-request-id'));
      if (outcome.result === 'failed') return failedResponse(req);
      // A tab that closed after the last sweep: its request is not sent (its token is spent).
      if (outcome.result === 'admitted' && event.clientId && !(await self.clients.get(event.clientId))) {
        outcome = { result: 'cancelled' };
      }
      if (outcome.result === 'admitted') {
        const waited = performance.now() - queuedAt;
        count((c) => {
          c.admitted++;
          c.wait_ms.sum += waited;
          c.wait_ms.count++;
          c.wait_ms.max = Math.max(c.wait_ms.max, waited);
        });
        return send(event, key, req);
      }
      if (outcome.result === 'timeout') return tooMany('timeout', outcome.retryAfterMs);
      if (outcome.result === 'cancelled') {
        count((c) => c.cancelled++);
        return Response.error();
      }
      return new Response('sluice: the queue was closed', { status: 503, headers: { 'retry-after': '1' } });
    }
    case 'limit':
    case 'queue_full':
    case 'timeout':
      return tooMany(offer.result, offer.waitMs);
    case 'too_costly':
      return tooMany('limit', 0);
    default:
      // 'closed' or 'invalid' cannot happen with this script; fail open, the gateway limits.
      return fetch(req);
  }
}

function isLimited(req, url) {
  if (!config || req.mode === 'navigate' || url.origin !== self.location.origin) return false;
  return config.path_prefixes.some((p) => url.pathname.startsWith(p));
}

/**
 * Decides one fetch event: a Response promise for the requests sluice answers (limited
 * requests that wait, are sent by the worker or refused, and `/sluice/state`), `undefined`
 * for everything else, including a GET or HEAD admitted at once (the browser, or the app's
 * own worker, sends it). Keeps the worker alive with `event.waitUntil` until the bucket the
 * request changed is on disk.
 */
export function handle(event) {
  const req = event.request;
  const url = new URL(req.url);
  if (url.pathname === STATE_PATH && url.origin === self.location.origin && req.method === 'GET') {
    return ready().catch(moduleFailed).then(stateResponse);
  }
  if (!isLimited(req, url)) return undefined; // assets, navigations, other origins: untouched
  if (failure !== null) {
    if (failure.mode === 'closed') return Promise.resolve(failedResponse(req));
    count((c) => c.failed++);
    return undefined; // fail open: the browser sends it itself, untouched
  }
  const key = requestKey(event.clientId, req);
  let response;
  if (restored && (req.method === 'GET' || req.method === 'HEAD')) {
    // The fast path: decided synchronously. Admitted at once, the request is not answered
    // here at all: the browser sends it itself, as if there were no worker (the cheapest
    // path, and a stopped worker cannot make the browser send it twice).
    const offer = decide(event, req, key, 0);
    if (offer.result === 'failed' && failure.mode === 'open') {
      count((c) => c.failed++);
      return undefined;
    }
    // Paced, it is sent from here: its response's limit fields are read.
    if (offer.result === 'admitted' && covered() && !pacing) {
      count((c) => c.admitted++);
      reserveNext();
      event.waitUntil(saved()); // alive until the next block is on disk
      return undefined;
    }
    // Beyond the block the stored record counts: the worker sends it once a record does.
    response = respond(event, req, key, offer);
  } else {
    response = limited(event, key);
  }
  // Keep the worker alive until the bucket this request changed is on disk.
  event.waitUntil(response.then(saved, saved));
  return response;
}
