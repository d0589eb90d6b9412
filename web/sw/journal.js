// The in-flight journal, which every record lists (record.js), and the copies of its requests
// the browser may dispatch again to a restarted worker.
//
// When a worker is stopped while its fetch to upstream is in flight, Chromium dispatches the same
// request again to a restarted worker (seen for GET and POST; the test "a request in flight when
// the worker stops is not sent upstream twice" shows it). So the record also lists the requests on
// their way upstream (client, method, URL). A restarted worker adopts that list and, shortly after
// its start, answers one matching request per entry with a network error instead of sending it
// again: its first copy reached upstream and its answer is lost, which is what a network error
// says. For methods that are not safe (POST, PUT, PATCH, DELETE, ...) the record is written before
// the request leaves; for GET, HEAD and OPTIONS it is written once the request has been in flight
// for 25 ms, so as not to add latency (most answers come sooner and cost no write): a safe request
// whose worker is stopped within its first 25 ms in flight may be sent again.
//
// Owns: inflight (id -> { key, t }), orphans (what an earlier instance left in flight) and
// unsaved (in-flight ids not yet in a stored record).
// Must not touch: IndexedDB or the module: record.js writes journalEntries() and hands over
// what it read to adoptOrphans; upstream.js enters and leaves the requests it sends.

const ORPHAN_WINDOW_MS = 10000; // after this worker started: the browser dispatches at once
const ORPHAN_MAX_AGE_MS = 5 * 60000; // the browser's own limit on one fetch event
const inflight = new Map(); // id -> { key, t }
const orphans = new Map(); // key -> how many copies may still arrive
let inflightSeq = 0;
const unsaved = new Set(); // in-flight ids not yet in the stored record

/** The journal's key for a request: its client, method and URL. */
export function requestKey(clientId, req) {
  return `${clientId || ''} ${req.method} ${req.url}`;
}

export function adoptOrphans(entries) {
  if (!Array.isArray(entries)) return;
  const now = Date.now();
  for (const e of entries) {
    if (e && typeof e.key === 'string' && typeof e.t === 'number' && now - e.t < ORPHAN_MAX_AGE_MS) {
      orphans.set(e.key, (orphans.get(e.key) || 0) + 1);
    }
  }
}

/** Whether this request is a copy of one an earlier instance already sent (uses up the entry). */
export function isRedispatch(key) {
  const n = orphans.get(key);
  if (!n || performance.now() > ORPHAN_WINDOW_MS) return false;
  if (n === 1) orphans.delete(key);
  else orphans.set(key, n - 1);
  return true;
}

/** A request leaves for upstream: it is in flight, and not yet in a stored record. Its id. */
export function enterJournal(key) {
  const id = ++inflightSeq;
  inflight.set(id, { key, t: Date.now() });
  unsaved.add(id);
  return id;
}

/**
 * The response has started: the browser will not dispatch it again. Whether it was in a stored
 * record (which then needs a write without it).
 */
export function leaveJournal(id) {
  inflight.delete(id);
  return !unsaved.delete(id);
}

/** A record is being written now: every request in flight is in it. */
export function journalWritten() {
  unsaved.clear();
}

/** The entries for a record. */
export function journalEntries() {
  return [...inflight.values()];
}

/** Whether a request in flight is in no stored record yet. */
export function journalHasUnsaved() {
  return unsaved.size > 0;
}
