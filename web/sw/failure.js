// What a failed module means for requests and pages (web/README.md, "When the module fails"):
// `fail` ('open': a limited request goes to the network untouched; 'closed': 503), a
// `sluice:failed` message to every page, and the counts.
//
// Owns: nothing: it reads `failure` (instance.js) and counts through telemetry.js.
// Must not touch: the module (never called again after a failure), the queue, IndexedDB.

import { failure, whenFailed } from './instance.js';
import { count } from './telemetry.js';

/** Tells one page (or every page of the origin) that the limiter failed. */
export function announceFailure(client) {
  const message = { type: 'sluice:failed', reason: failure.reason, mode: failure.mode };
  if (client) return client.postMessage(message);
  self.clients.matchAll({ includeUncontrolled: true }).then(
    (list) => list.forEach((c) => c.postMessage(message)),
    () => {},
  );
}

/** A limited request once the module has failed: to the network ('open') or 503 ('closed'). */
export function failedResponse(req) {
  count((c) => c.failed++);
  if (failure.mode === 'open') return fetch(req);
  const body = { title: 'Service Unavailable', status: 503, reason: 'limiter_failed', detail: failure.reason };
  return new Response(JSON.stringify(body), {
    status: 503,
    statusText: 'Service Unavailable',
    headers: {
      'content-type': 'application/problem+json',
      'cache-control': 'no-store',
      'x-sluice-limiter': 'browser',
    },
  });
}

// After the pending save and the waiters are dropped (record.js, queue.js).
whenFailed(() => {
  count((c) => c.failures++);
  announceFailure(null);
});
