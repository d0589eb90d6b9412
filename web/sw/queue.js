// The queue: JavaScript keeps the promises of the waiting requests and one timer; the module
// decides who is admitted, in which order, when, and who times out. The waiters of closed tabs
// and of aborted fetches leave it without spending a token.
//
// Owns: waiting (ticket -> { settle(outcome), clientId, id }), the wake-up timer, the sweep.
// Must not touch: responses (a waiter is settled with an outcome; fetch.js answers), IndexedDB
// (an admission schedules a save through record.js).

import { guarded, limiter, whenFailed } from './instance.js';
import { scheduleSave } from './record.js';

const waiting = new Map(); // ticket -> { settle(outcome), clientId, id (X-Sluice-Request-Id) }
let timer = null;
let timerAt = Infinity;

function pump() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  timerAt = Infinity;
  if (!limiter) return;
  const polled = guarded(() => limiter.poll(performance.now()));
  if (polled === null) return;
  let admitted = false;
  for (const o of polled.outcomes) {
    const w = waiting.get(o.ticket);
    waiting.delete(o.ticket);
    if (o.result === 'admitted') admitted = true;
    if (w) w.settle(o);
  }
  if (admitted) scheduleSave();
  if (polled.wake !== null) arm(polled.wake);
}

function arm(wakeMs) {
  if (timer !== null && timerAt <= wakeMs) return;
  if (timer !== null) clearTimeout(timer);
  timerAt = wakeMs;
  timer = setTimeout(wakeUp, Math.max(0, Math.ceil(wakeMs - performance.now())));
}

/** The timer: the waiters of closed tabs leave before the token they would take is handed out. */
function wakeUp() {
  timer = null;
  timerAt = Infinity;
  sweep().then(pump, pump);
}

// Chromium does not abort the worker's `request.signal` when a page aborts a fetch or closes,
// and the FetchEvent tells nothing either. A closed tab is seen through `clients.get()`: every
// SWEEP_MS while requests wait, and before each wake-up that may admit one. An aborted fetch
// is seen only when the page says so: politeFetch sends `sluice:cancel` with the id of its
// `X-Sluice-Request-Id` header.
const SWEEP_MS = 200;
let sweepTimer = null;
let sweeping = null;

function sweep() {
  if (sweeping !== null) return sweeping;
  const ids = new Set();
  for (const w of waiting.values()) if (w.clientId) ids.add(w.clientId);
  if (ids.size === 0) return Promise.resolve();
  // Every lookup first, then one cancel: cancelling as each lookup comes back would pump the
  // queue with a token due while another closed tab's lookup is still out, and hand that token
  // to its waiter, whose request would go out for a tab that is gone.
  sweeping = Promise.all(
    [...ids].map((id) =>
      self.clients.get(id).then(
        (client) => (client ? null : id),
        () => null,
      ),
    ),
  ).then((found) => {
    sweeping = null;
    const closed = new Set(found.filter((id) => id !== null));
    if (closed.size > 0) cancelWhere((w) => closed.has(w.clientId));
  });
  return sweeping;
}

/**
 * Takes every waiter `match` selects out of the queue, then pumps it once: no token spent, and
 * the next in line that is left takes it.
 */
export function cancelWhere(match) {
  let any = false;
  for (const [ticket, w] of waiting) {
    if (!match(w)) continue;
    waiting.delete(ticket);
    if (limiter) guarded(() => limiter.cancel(ticket));
    w.settle({ ticket, result: 'cancelled', retryAfterMs: 0 });
    any = true;
  }
  if (any) pump();
  return any;
}

export function wait(ticket, signal, clientId, id) {
  return new Promise((resolve) => {
    waiting.set(ticket, { settle: resolve, clientId, id });
    if (signal) signal.addEventListener('abort', () => cancelWhere((w) => w.settle === resolve), { once: true });
    if (sweepTimer === null) {
      sweepTimer = setInterval(() => {
        if (waiting.size > 0) return void sweep();
        clearInterval(sweepTimer);
        sweepTimer = null;
      }, SWEEP_MS);
    }
    pump();
  });
}

whenFailed(() => {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  timerAt = Infinity;
  // Every waiter is answered by `fail` (failedResponse).
  const waiters = [...waiting];
  waiting.clear();
  for (const [ticket, w] of waiters) w.settle({ ticket, result: 'failed', retryAfterMs: 0 });
});
