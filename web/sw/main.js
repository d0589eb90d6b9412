/*
 * sluice Service Worker: one rate limiter shared by every tab of this origin.
 *
 * ES modules, bundled into one classic script (web/sw.js) by the gateway's build
 * (crates/sluice-server/build/sw_bundle.rs, no JavaScript tooling). It is served as
 * /sluice/sw.js (header `Service-Worker-Allowed: /`) as a generated prefix followed by that
 * script; the prefix defines
 *   self.__SLUICE_CONFIG__  the [browser] configuration as a plain object
 *   self.__SLUICE_WASM__    a Uint8Array with the sluice-wasm module
 * (see web/README.md, "The sw.js contract"; web/build-sw.mjs writes it).
 *
 * The decisions (who is admitted, who waits, in which order, when to wake, who times out) are
 * made by sluice-core compiled to WebAssembly, the same code the gateway runs. These modules
 * keep only what JavaScript must: the fetch events and their promises, one timer, IndexedDB
 * and the telemetry batches.
 *
 * The modules, each after the ones it imports (the bundle's order; none imports one that
 * imports it back):
 *   config.js     the configuration's defaults and checks
 *   limiter.js    SluiceLimiter, the module's ABI in JavaScript
 *   internals.js  what node tests get; outside a Service Worker nothing below runs
 *   worker.js     this worker's id, start time and configuration
 *   instance.js   the limiter instance, `guarded` calls, the module's failure
 *   db.js         IndexedDB
 *   journal.js    the requests in flight, and the copies the browser dispatches again
 *   record.js     the stored record: restore, reserve ahead, the writes
 *   queue.js      the waiting requests, the timer, the sweep of closed tabs
 *   telemetry.js  the counters and their batches
 *   failure.js    `fail` for requests and `sluice:failed` for pages
 *   requests.js   a request's flow (tab) and body size
 *   state.js      GET /sluice/state
 *   headers.generated.js  the npm package's readers of a response's limit fields (a copy)
 *   pacing.generated.js   the npm package's pacing step (a copy; web/gen-pacing.mjs)
 *   pace.js       pacing from the server's limit fields, one state for every tab
 *   upstream.js   an admitted request sent from the worker
 *   fetch.js      the decision and the response for each fetch event
 *   main.js       this file: the lifecycle, the messages, the import form
 */
// Owns: the worker's lifecycle (install, activate, claim), the messages pages send, and the
// import form's `self.sluice`.
// Must not touch: the state of the other modules; it only calls them.

import { failure, moduleFailed, startError } from './instance.js';
import { installRecord, ready } from './record.js';
import { cancelWhere } from './queue.js';
import { announceFailure } from './failure.js';
import { stateResponse } from './state.js';
import { handle } from './fetch.js';

// The standalone worker (`/sluice/sw.js`) registers its own listeners and owns its
// lifecycle. The import form (`/sluice/sw-import.js`, `self.__SLUICE_MODE__ = 'import'` in its
// prefix) registers none and never calls skipWaiting or clients.claim: the app's worker calls
// `self.sluice.handle(event)` from its own fetch listener.
const IMPORTED = self.__SLUICE_MODE__ === 'import';

/**
 * The messages pages send to sluice (client.js): `sluice:hello` at `register()` (a page
 * loaded after a failure is told too) and `sluice:cancel` when a politeFetch signal aborts
 * (that request leaves the queue, only that page's). The import form's app worker passes its
 * message events here (`self.sluice.message(event)`).
 */
function message(event) {
  const data = event.data;
  if (data && data.type === 'sluice:hello' && failure !== null) announceFailure(event.source);
  if (data && data.type === 'sluice:cancel' && typeof data.id === 'string' && event.source) {
    const clientId = event.source.id;
    cancelWhere((w) => w.id === data.id && w.clientId === clientId);
  }
}

if (startError !== null) moduleFailed(startError);

if (IMPORTED) {
  // The app's worker evaluates this script at its own first install too: a fresh
  // registration writes its install record now (nothing can be fetched through this worker
  // before it is active, and this transaction is ordered before the first restore's).
  if (!self.registration.active) installRecord();
  self.sluice = {
    handle,
    message,
    ready,
    /** The `/sluice/state` object, once the bucket is restored. */
    state: () => ready().catch(moduleFailed).then(stateResponse).then((r) => r.json()),
  };
} else {
  self.addEventListener('install', (event) => {
    event.waitUntil(installRecord().then(() => self.skipWaiting()));
  });

  self.addEventListener('activate', (event) => {
    event.waitUntil(Promise.all([self.clients.claim(), ready()]));
  });

  self.addEventListener('message', (event) => {
    // client.js asks after a hard reload, when the page is not controlled.
    if (event.data && event.data.type === 'sluice:claim') event.waitUntil(self.clients.claim());
    message(event);
  });

  self.addEventListener('fetch', (event) => {
    const response = handle(event);
    if (response !== undefined) event.respondWith(response);
  });
}
