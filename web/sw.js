/*
 * sluice Service Worker: one rate limiter shared by every tab of this origin.
 *
 * A classic script. It is served as /sluice/sw.js (header `Service-Worker-Allowed: /`) as a
 * generated prefix followed by this file; the prefix defines
 *   self.__SLUICE_CONFIG__  the [browser] configuration as a plain object
 *   self.__SLUICE_WASM__    a Uint8Array with the sluice-wasm module
 * (see web/README.md, "The sw.js contract"; web/build-sw.mjs writes it).
 *
 * The decisions (who is admitted, who waits, in which order, when to wake, who times out) are
 * made by sluice-core compiled to WebAssembly, the same code the gateway runs. This file keeps
 * only what JavaScript must: the fetch events and their promises, one timer, IndexedDB and
 * the telemetry batches.
 */
'use strict';

(function (self) {
  // === configuration ===

  const DEFAULTS = {
    path_prefixes: ['/api/'],
    algorithm: 'token_bucket',
    capacity: 10,
    rate: '1/s',
    queue: { depth: 100, max_wait_ms: 10000 },
    max_queued_body_bytes: 65536,
    persist: true,
    persist_debounce_ms: 150,
    telemetry: { endpoint: '/v1/telemetry', interval_ms: 5000, sample: 1.0 },
    fail: 'open',
  };

  /**
   * Fills defaults and checks types. Returns { config, errors }: with errors, the worker
   * limits nothing (it fails open: the gateway still enforces its own limits).
   */
  function normalizeConfig(raw) {
    const errors = [];
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
      return { config: null, errors: ['the configuration must be a JSON object'] };
    }
    const pick = (key, fallback) => (raw[key] === undefined ? fallback : raw[key]);
    const isInt = (v, min) => Number.isSafeInteger(v) && v >= min;
    const config = {
      path_prefixes: pick('path_prefixes', DEFAULTS.path_prefixes),
      algorithm: pick('algorithm', DEFAULTS.algorithm),
      capacity: pick('capacity', DEFAULTS.capacity),
      rate: pick('rate', DEFAULTS.rate),
      queue: Object.assign({}, DEFAULTS.queue, raw.queue === null ? { depth: 0, max_wait_ms: 0 } : raw.queue),
      max_queued_body_bytes: pick('max_queued_body_bytes', DEFAULTS.max_queued_body_bytes),
      persist: pick('persist', DEFAULTS.persist),
      persist_debounce_ms: pick('persist_debounce_ms', DEFAULTS.persist_debounce_ms),
      fail: pick('fail', DEFAULTS.fail),
      telemetry:
        raw.telemetry === null || raw.telemetry === false
          ? null
          : Object.assign({}, DEFAULTS.telemetry, raw.telemetry),
    };
    if (!Array.isArray(config.path_prefixes) || !config.path_prefixes.every((p) => typeof p === 'string' && p.startsWith('/'))) {
      errors.push('path_prefixes must be a list of paths starting with "/"');
    }
    if (typeof config.algorithm !== 'string') errors.push('algorithm must be a string such as "token_bucket"');
    if (!isInt(config.capacity, 1)) errors.push('capacity must be a whole number of at least 1');
    if (typeof config.rate !== 'string' && !(typeof config.rate === 'number' && config.rate > 0)) {
      errors.push('rate must be a string such as "5/s" or a positive number of tokens per second');
    }
    if (!isInt(config.queue.depth, 0) || config.queue.depth > 0xffffffff) errors.push('queue.depth must be a whole number of 0 or more');
    if (!isInt(config.queue.max_wait_ms, 0)) errors.push('queue.max_wait_ms must be a whole number of milliseconds');
    if (!isInt(config.max_queued_body_bytes, 0)) errors.push('max_queued_body_bytes must be a whole number of bytes');
    if (typeof config.persist !== 'boolean') errors.push('persist must be true or false');
    if (!isInt(config.persist_debounce_ms, 0) || config.persist_debounce_ms > 10000) {
      errors.push('persist_debounce_ms must be a whole number of milliseconds up to 10000');
    }
    if (config.fail !== 'open' && config.fail !== 'closed') errors.push('fail must be "open" or "closed"');
    const t = config.telemetry;
    if (t !== null) {
      if (typeof t.endpoint !== 'string' || !t.endpoint.startsWith('/')) errors.push('telemetry.endpoint must be a path starting with "/"');
      if (!isInt(t.interval_ms, 1000)) errors.push('telemetry.interval_ms must be a whole number of at least 1000');
      if (typeof t.sample !== 'number' || !(t.sample >= 0 && t.sample <= 1)) errors.push('telemetry.sample must be a number from 0 to 1');
    }
    return { config: errors.length ? null : config, errors };
  }

  // === the module ===

  const OFFER_RESULTS = ['admitted', 'queued', 'limit', 'queue_full', 'timeout', 'too_costly', 'closed'];
  const OUTCOME_RESULTS = ['admitted', 'timeout', 'closed'];
  const ABI_VERSION = 2;

  /** A thin wrapper over the sluice-wasm exports: one limiter per instance. */
  class SluiceLimiter {
    constructor(module, { algorithm = 'token_bucket', capacity, rate, depth, maxWaitMs }) {
      this.x = new WebAssembly.Instance(module, {}).exports;
      if (this.x.sluice_abi_version() !== ABI_VERSION) {
        throw new Error(`sluice-wasm ABI ${this.x.sluice_abi_version()}, this script speaks ${ABI_VERSION}`);
      }
      const kind = this.x.sluice_parse_kind(this._text(String(algorithm)));
      if (kind < 0) throw this._error();
      let rc;
      if (typeof rate === 'number') {
        rc = this.x.sluice_create_per_second(kind, capacity, rate, depth, maxWaitMs);
      } else {
        const intervalNs = this.x.sluice_parse_rate(this._text(String(rate)));
        if (intervalNs < 0) throw this._error();
        rc = this.x.sluice_create(kind, capacity, intervalNs, depth, maxWaitMs);
      }
      if (rc !== 0) throw this._error();
      this._outView = null;
    }

    _text(s) {
      const bytes = new TextEncoder().encode(s);
      const at = this.x.sluice_input_bytes(bytes.length);
      new Uint8Array(this.x.memory.buffer, at, bytes.length).set(bytes);
      return bytes.length;
    }

    _error() {
      const at = this.x.sluice_error_ptr();
      const len = this.x.sluice_error_len();
      return new Error(new TextDecoder().decode(new Uint8Array(this.x.memory.buffer, at, len)));
    }

    // The `out` area never moves, but a grown memory detaches the old buffer.
    _out() {
      if (this._outView === null || this._outView.buffer !== this.x.memory.buffer) {
        this._outView = new Float64Array(this.x.memory.buffer, this.x.sluice_out(), 8);
      }
      return this._outView;
    }

    _list() {
      return new Float64Array(this.x.memory.buffer, this.x.sluice_list(), this.x.sluice_list_len());
    }

    /** -> { result, ticket, waitMs, remaining, limit }; result is one of OFFER_RESULTS or 'invalid'. */
    offer(nowMs, cost = 1, flow = 0, priority = 1, maxWaitMs = -1) {
      const code = this.x.sluice_offer(nowMs, cost, flow, priority, maxWaitMs);
      const o = this._out();
      return { result: OFFER_RESULTS[code] || 'invalid', ticket: o[0], waitMs: o[1], remaining: o[2], limit: o[3] };
    }

    /** -> { wake: ms or null, outcomes: [{ ticket, result, retryAfterMs }] } */
    poll(nowMs) {
      const wake = this.x.sluice_poll(nowMs);
      const list = this._list();
      const outcomes = [];
      for (let i = 0; i + 2 < list.length; i += 3) {
        outcomes.push({ ticket: list[i], result: OUTCOME_RESULTS[list[i + 1]], retryAfterMs: list[i + 2] });
      }
      return { wake: wake < 0 ? null : wake, outcomes };
    }

    cancel(ticket) {
      return this.x.sluice_cancel(ticket) === 1;
    }

    status(nowMs) {
      this.x.sluice_status(nowMs);
      const o = this._out();
      return { tokens: o[0], capacity: o[1], queued: o[2], resetAfterMs: o[3], nextTokenMs: o[4], intervalNs: o[6] };
    }

    /** The bucket as a list of numbers (web/README.md, "Persisted state"). */
    snapshot(nowMs, unixMs) {
      this.x.sluice_snapshot(nowMs, unixMs);
      return Array.from(this._list());
    }

    /** Throws when the list cannot be used; the bucket is then unchanged. */
    restore(values, nowMs, unixMs) {
      if (!Array.isArray(values)) throw new Error('the stored snapshot is not a list');
      const at = this.x.sluice_input_f64(values.length);
      // Non-numbers become NaN, which the module rejects.
      new Float64Array(this.x.memory.buffer, at, values.length).set(values.map(Number));
      if (this.x.sluice_restore(values.length, nowMs, unixMs) !== 0) throw this._error();
    }

    exhaust(nowMs) {
      if (this.x.sluice_exhaust(nowMs) !== 0) throw this._error();
    }

    /** The bucket for a record to write now, with the next `block` admissions already spent. */
    reserve(nowMs, unixMs, block) {
      this.x.sluice_reserve(nowMs, unixMs, block);
      return Array.from(this._list());
    }

    /** The oldest record of `reserve` was stored (or not). */
    written(ok) {
      this.x.sluice_written(ok ? 1 : 0);
    }

    /** Whether the stored record is at least as empty as the live bucket after `more` admissions. */
    covered(nowMs, more = 0) {
      return this.x.sluice_covered(nowMs, more) === 1;
    }
  }

  self.__sluice_internals__ = { normalizeConfig, SluiceLimiter, DEFAULTS };

  const isServiceWorker =
    typeof ServiceWorkerGlobalScope !== 'undefined' && self instanceof ServiceWorkerGlobalScope;
  if (!isServiceWorker) return; // loaded for a test: only the pieces above

  // === the worker ===

  const workerId = Math.random().toString(36).slice(2, 10);
  const startedUnixMs = Date.now();
  const STATE_PATH = '/sluice/state';

  let config = null;
  let limiter = null;
  let disabled = null; // why nothing is limited, if so
  // Once the module has failed (it did not compile, did not instantiate, or trapped): { reason,
  // mode, unix_ms }. From then on every limited request is handled by `config.fail`: 'open'
  // passes it to the network untouched, 'closed' answers 503 (failedResponse).
  let failure = null;
  let startError = null; // the module did not compile or instantiate
  const normalized = normalizeConfig(self.__SLUICE_CONFIG__);
  try {
    // An invalid configuration fails open (nothing says which requests to limit, nor how).
    if (!normalized.config) throw new Error('invalid configuration: ' + normalized.errors.join('; '));
    config = normalized.config;
    // Synchronous compile: allowed in workers, and the bytes came with this script, so a
    // restarted worker downloads nothing.
    const module = new WebAssembly.Module(self.__SLUICE_WASM__);
    limiter = new SluiceLimiter(module, {
      algorithm: config.algorithm,
      capacity: config.capacity,
      rate: config.rate,
      depth: config.queue.depth,
      maxWaitMs: config.queue.max_wait_ms,
    });
  } catch (e) {
    disabled = String((e && e.message) || e);
    console.error('sluice: limiting disabled:', disabled);
    // With a valid configuration, the module failed: handled by `fail` (moduleFailed, called
    // at the end, once everything it uses is defined).
    if (config) startError = e;
  }

  // --- counters: totals since this worker started, and the batch for telemetry ---

  function newCounters() {
    return {
      admitted: 0,
      queued: 0,
      rejected: { queue_full: 0, timeout: 0, limit: 0 },
      cancelled: 0,
      redispatched: 0,
      failures: 0,
      failed: 0,
      wait_ms: { sum: 0, count: 0, max: 0 },
    };
  }
  const totals = newCounters();
  let batch = newCounters();
  let batchStart = performance.now();

  function count(update) {
    update(totals);
    update(batch);
    armTelemetry();
  }

  // --- flows: a small integer per tab ---

  const flows = new Map();
  let nextFlow = 1;
  function flowOf(clientId) {
    if (!clientId) return 0;
    let flow = flows.get(clientId);
    if (flow === undefined) {
      flow = nextFlow;
      nextFlow = nextFlow >= 0xfffffff0 ? 1 : nextFlow + 1;
      flows.set(clientId, flow);
      // Forget the oldest tab beyond 1024; if it is still open it just gets a new number.
      if (flows.size > 1024) flows.delete(flows.keys().next().value);
    }
    return flow;
  }

  // --- persistence (IndexedDB) ---

  const DB_NAME = 'sluice';
  const STORE = 'state';
  const KEY = 'bucket';
  const RECORD_VERSION = 1;
  let dbPromise = null;

  function request(req) {
    return new Promise((resolve, reject) => {
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  function openDb() {
    if (dbPromise === null) {
      dbPromise = new Promise((resolve, reject) => {
        const req = indexedDB.open(DB_NAME, 1);
        req.onupgradeneeded = () => req.result.createObjectStore(STORE);
        req.onsuccess = () => resolve(req.result);
        req.onerror = () => reject(req.error);
        req.onblocked = () => reject(new Error('IndexedDB open blocked'));
        setTimeout(() => reject(new Error('IndexedDB open timed out')), 2000);
      });
      dbPromise.catch(() => {
        dbPromise = null;
      });
    }
    return dbPromise;
  }

  /** Runs `fn(store)` in one transaction; resolves with its result once committed. */
  async function transact(mode, fn) {
    const db = await openDb();
    return new Promise((resolve, reject) => {
      const tx = db.transaction(STORE, mode);
      let result;
      Promise.resolve(fn(tx.objectStore(STORE))).then((r) => (result = r), reject);
      tx.oncomplete = () => resolve(result);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error || new Error('transaction aborted'));
    });
  }

  function fingerprint() {
    return `${config.algorithm}/${config.capacity}/${limiter.status(performance.now()).intervalNs}`;
  }

  // The record (one IndexedDB value under 'bucket') holds the bucket and the in-flight journal.
  //
  // The journal: when a worker is stopped while its fetch to upstream is in flight, Chromium
  // dispatches the same request again to a restarted worker (seen for GET and POST; the test
  // "a request in flight when the worker stops is not sent upstream twice" shows it). So the
  // record also lists the requests on their way upstream (client, method, URL). A restarted
  // worker adopts that list and, shortly after its start, answers one matching request per
  // entry with a network error instead of sending it again: its first copy reached upstream and
  // its answer is lost, which is what a network error says. For methods that are not safe
  // (POST, PUT, PATCH, DELETE, ...) the record is written before the request leaves; for GET,
  // HEAD and OPTIONS it is written once the request has been in flight for 25 ms, so as not to
  // add latency (most answers come sooner and cost no write): a safe request whose worker is
  // stopped within its first 25 ms in flight may be sent again.

  const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
  const ORPHAN_WINDOW_MS = 10000; // after this worker started: the browser dispatches at once
  const ORPHAN_MAX_AGE_MS = 5 * 60000; // the browser's own limit on one fetch event
  // Most answers arrive sooner: they never cost a write. Slower ones are journaled then.
  const JOURNAL_DELAY_MS = 25;
  const inflight = new Map(); // id -> { key, t }
  const orphans = new Map(); // key -> how many copies may still arrive
  let inflightSeq = 0;

  // Reserve ahead: a saved record holds the bucket with the next admissions already spent
  // (at most this many, and at most what is left), so that the stored bucket is always at
  // least as empty as the live one. Admissions inside that block go without a write; one
  // beyond it waits for the next record (sendUpstream). A worker stopped at any moment restarts
  // from a record that already counts every admission it granted: it may lose the unused part
  // of one block, never grant a token twice.
  //
  // The block: a quarter of the capacity (at most 64), or one second of refill if that is
  // more. The stored bucket refills too: a block smaller than what refills between two writes
  // would be used up by refill alone (a record that has refilled to full counts nothing).
  const RESERVE_REFILL_MS = 1000;
  let reserveBlockSize = 0;
  function reserveBlock() {
    if (reserveBlockSize === 0) {
      const tokenMs = limiter.status(performance.now()).intervalNs / 1e6; // refill time of one token
      reserveBlockSize = Math.max(Math.min(64, Math.ceil(config.capacity / 4)), Math.ceil(RESERVE_REFILL_MS / tokenMs));
    }
    return reserveBlockSize;
  }

  /**
   * Whether every admission so far (and `more`) is counted in the stored record, or needs not
   * be: without persistence, or while writes fail (IndexedDB unusable: admissions do not wait
   * for writes that cannot happen; the gateway still limits).
   */
  function covered(more = 0) {
    // After a module failure nothing is counted any more: requests follow `fail` instead.
    if (!config.persist || writeFailed || !limiter) return true;
    const counted = guarded(() => limiter.covered(performance.now(), more));
    return counted === null ? true : counted;
  }

  /** After an admission inside the block: the next block is written early when this one runs low. */
  function reserveNext() {
    const half = limiter ? guarded(() => Math.ceil(reserveBlock() / 2)) : null;
    if (half === null) return; // the module failed: nothing more to reserve
    if (covered(half)) scheduleSave();
    else if (!writing) saveNow();
    else scheduleSave();
  }

  function makeRecord(kind) {
    const reserve = kind === 'save' && config.persist;
    return {
      v: RECORD_VERSION,
      kind, // 'install' (the full bucket of a fresh install) or 'save'
      config: fingerprint(),
      snapshot: reserve
        ? limiter.reserve(performance.now(), Date.now(), reserveBlock())
        : limiter.snapshot(performance.now(), Date.now()),
      inflight: [...inflight.values()],
    };
  }

  function requestKey(clientId, req) {
    return `${clientId || ''} ${req.method} ${req.url}`;
  }

  function adoptOrphans(entries) {
    if (!Array.isArray(entries)) return;
    const now = Date.now();
    for (const e of entries) {
      if (e && typeof e.key === 'string' && typeof e.t === 'number' && now - e.t < ORPHAN_MAX_AGE_MS) {
        orphans.set(e.key, (orphans.get(e.key) || 0) + 1);
      }
    }
  }

  /** Whether this request is a copy of one an earlier instance already sent (uses up the entry). */
  function isRedispatch(key) {
    const n = orphans.get(key);
    if (!n || performance.now() > ORPHAN_WINDOW_MS) return false;
    if (n === 1) orphans.delete(key);
    else orphans.set(key, n - 1);
    return true;
  }

  const unsaved = new Set(); // in-flight ids not yet in the stored record
  let journalTimer = null;

  async function sendUpstream(key, req) {
    const id = ++inflightSeq;
    inflight.set(id, { key, t: Date.now() });
    unsaved.add(id);
    // A request whose admission the stored record does not count yet waits for a record that does.
    if (!SAFE_METHODS.has(req.method) || !covered()) await saveNow();
    else if (journalTimer === null) journalTimer = setTimeout(journalSlow, JOURNAL_DELAY_MS);
    try {
      return await fetch(req);
    } finally {
      inflight.delete(id); // the response has started: the browser will not dispatch it again
      if (!unsaved.delete(id)) scheduleSave(); // it is in the record: take it out
    }
  }

  /** Safe requests still in flight after JOURNAL_DELAY_MS go into the record. */
  function journalSlow() {
    journalTimer = null;
    if (unsaved.size > 0) saveNow();
  }

  let restoredFrom = 'pending';
  let readyPromise = null;
  let restored = false; // once true, decisions can be made synchronously

  /** The bucket is restored before any request is decided; every decision awaits this. */
  function ready() {
    if (readyPromise === null) {
      readyPromise = restore()
        // The first block, so that the first requests take the fast path.
        .then(() => limiter && config.persist && saveNow())
        .then(() => {
          restored = true;
        });
    }
    return readyPromise;
  }

  async function restore() {
    if (!limiter) return;
    let record;
    try {
      record = await transact('readonly', (store) => request(store.get(KEY)));
    } catch (e) {
      if (!config.persist) restoredFrom = 'disabled';
      else exhaust('error', e);
      return;
    }
    if (record && typeof record === 'object') adoptOrphans(record.inflight);
    if (!config.persist) {
      restoredFrom = 'disabled'; // a full bucket at every start
      return;
    }
    if (record === undefined) return exhaust('missing');
    try {
      if (!record || record.v !== RECORD_VERSION || !Array.isArray(record.snapshot)) {
        throw new Error('not a sluice record');
      }
      limiter.restore(record.snapshot, performance.now(), Date.now());
      restoredFrom = record.kind === 'install' ? 'install' : 'record';
    } catch (e) {
      exhaust('corrupt', e);
    }
  }

  /** No usable record: an empty bucket that refills at the rate, never a full one. */
  function exhaust(why, error) {
    limiter.exhaust(performance.now());
    restoredFrom = why;
    if (error) console.warn(`sluice: stored bucket ${why} (${error.message || error}); starting empty`);
    scheduleSave(); // so the next start finds a record again
  }

  // With `persist: false` the record is still written, for the journal; its bucket is ignored.
  let saveTimer = null;
  let saveWaiters = [];
  let saveChain = Promise.resolve();
  let writing = 0; // records on their way to IndexedDB
  let writeFailed = false; // the last write failed

  function scheduleSave() {
    if (!limiter || saveTimer !== null) return;
    saveTimer = setTimeout(saveNow, config.persist_debounce_ms);
  }

  /** Writes the record now (taking over a scheduled save); resolves once it is committed. */
  function saveNow() {
    if (saveTimer !== null) clearTimeout(saveTimer);
    saveTimer = null;
    const waiters = saveWaiters;
    saveWaiters = [];
    unsaved.clear();
    // The state as of now, after every admission so far (none once the module has failed).
    const record = limiter ? guarded(() => makeRecord('save')) : null;
    if (record === null) {
      waiters.forEach((w) => w());
      return saveChain;
    }
    const reserved = config.persist;
    writing++;
    saveChain = saveChain
      .then(() => transact('readwrite', (store) => request(store.put(record, KEY))))
      .then(
        () => {
          writeFailed = false;
          if (reserved && limiter) guarded(() => limiter.written(true));
        },
        (e) => {
          writeFailed = true;
          if (reserved && limiter) guarded(() => limiter.written(false));
          console.warn('sluice: could not save the bucket:', e);
        },
      )
      .then(() => {
        writing--;
        waiters.forEach((w) => w());
      });
    return saveChain;
  }

  /** Resolves once the pending save (if any) is written: for `waitUntil`. */
  function saved() {
    if (saveTimer === null) return saveChain;
    return new Promise((resolve) => saveWaiters.push(resolve));
  }

  // --- the queue: JavaScript keeps the promises and one timer; the module decides ---

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
    sweeping = Promise.all(
      [...ids].map((id) =>
        self.clients.get(id).then(
          (client) => {
            if (!client) cancelWhere((w) => w.clientId === id);
          },
          () => {},
        ),
      ),
    ).then(() => {
      sweeping = null;
    });
    return sweeping;
  }

  /** Takes the waiters `match` selects out of the queue: no token spent; the next may go. */
  function cancelWhere(match) {
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

  function wait(ticket, signal, clientId, id) {
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

  // --- module failure: a trap (WebAssembly.RuntimeError) or a module that did not load ---

  /** Runs a call into the module; on a throw the module is failed for good and this gives null. */
  function guarded(call) {
    try {
      return call();
    } catch (e) {
      moduleFailed(e);
      return null;
    }
  }

  /**
   * From now on the module is never called (after a trap its state is unknown): every limited
   * request, the waiting ones included, is handled by `config.fail` (failedResponse), pages are
   * told (`sluice:failed`), `/sluice/state` shows `failure`, and telemetry counts it.
   */
  function moduleFailed(e) {
    if (failure !== null) return;
    const reason = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    failure = { reason, mode: config.fail, unix_ms: Date.now() };
    limiter = null;
    disabled = `the limiter module failed (${reason}); fail ${config.fail}`;
    console.error('sluice:', disabled);
    if (timer !== null) clearTimeout(timer);
    timer = null;
    timerAt = Infinity;
    // A pending save would snapshot the module: dropped, and whoever waits for it released.
    if (saveTimer !== null) clearTimeout(saveTimer);
    saveTimer = null;
    saveWaiters.splice(0).forEach((w) => w());
    const waiters = [...waiting];
    waiting.clear();
    for (const [ticket, w] of waiters) w.settle({ ticket, result: 'failed', retryAfterMs: 0 });
    count((c) => c.failures++);
    announceFailure(null);
  }

  /** Tells one page (or every page of the origin) that the limiter failed. */
  function announceFailure(client) {
    const message = { type: 'sluice:failed', reason: failure.reason, mode: failure.mode };
    if (client) return client.postMessage(message);
    self.clients.matchAll({ includeUncontrolled: true }).then(
      (list) => list.forEach((c) => c.postMessage(message)),
      () => {},
    );
  }

  /** A limited request once the module has failed: to the network ('open') or 503 ('closed'). */
  function failedResponse(req) {
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

  // --- responses ---

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

  let bodyBytesRead = 0; // body bytes read to size requests, since this worker started

  /**
   * The body size, exact up to `cap`; above it, some number above `cap` (the rest is never
   * read). Chromium gives the worker no Content-Length for fetch bodies, so the body is counted
   * through a clone's stream, and the counting stops past `cap`: a 100 MB upload costs at most
   * `cap` plus one chunk here, and the request itself keeps its body, to be sent as it is.
   */
  async function bodySize(req, cap) {
    if (req.method === 'GET' || req.method === 'HEAD') return 0;
    const declared = req.headers.get('content-length');
    if (declared !== null && /^\d+$/.test(declared)) return Number(declared);
    let reader = null;
    try {
      const body = req.clone().body;
      if (body === null) return 0;
      reader = body.getReader();
      let size = 0;
      while (size <= cap) {
        const { done, value } = await reader.read();
        if (done) break;
        size += value.byteLength;
        bodyBytesRead += value.byteLength;
      }
      return size;
    } catch (e) {
      return Infinity; // unreadable: never queue it
    } finally {
      if (reader !== null) reader.cancel().catch(() => {});
    }
  }

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
        return sendUpstream(key, req);
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
          return sendUpstream(key, req);
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

  function stateResponse() {
    // First: a trap in `status` sets `failure` and `disabled`, which the body then shows.
    const st = limiter ? guarded(() => limiter.status(performance.now())) : null;
    const body = {
      worker: workerId,
      started_unix_ms: startedUnixMs,
      disabled,
      failure,
      restored_from: restoredFrom,
      config,
      totals,
      flows: flows.size,
      body_bytes_read: bodyBytesRead,
    };
    if (st !== null) {
      Object.assign(body, {
        tokens: st.tokens,
        capacity: st.capacity,
        queued: st.queued,
        reset_after_ms: st.resetAfterMs,
        next_token_ms: st.nextTokenMs,
        interval_ns: st.intervalNs,
      });
    }
    return new Response(JSON.stringify(body), {
      headers: { 'content-type': 'application/json', 'cache-control': 'no-store', 'x-sluice-limiter': 'browser' },
    });
  }

  function isLimited(req, url) {
    if (!config || req.mode === 'navigate' || url.origin !== self.location.origin) return false;
    return config.path_prefixes.some((p) => url.pathname.startsWith(p));
  }

  // --- telemetry: sampled counter batches, POSTed as small JSON ---

  let telemetryTimer = null;
  let telemetrySeq = 0;
  let telemetryPausedUntil = 0;

  function armTelemetry() {
    if (!config || !config.telemetry || telemetryTimer !== null) return;
    telemetryTimer = setTimeout(flushTelemetry, config.telemetry.interval_ms);
  }

  function flushTelemetry() {
    telemetryTimer = null;
    const t = config.telemetry;
    const now = performance.now();
    const b = batch;
    const windowMs = Math.round(now - batchStart);
    batch = newCounters();
    batchStart = now;
    const empty = b.admitted + b.queued + b.cancelled + b.redispatched + b.failures + b.failed + b.rejected.queue_full + b.rejected.timeout + b.rejected.limit === 0;
    if (empty || now < telemetryPausedUntil || Math.random() >= t.sample) return;
    const body = JSON.stringify({
      v: 1,
      worker: workerId,
      seq: ++telemetrySeq,
      sample: t.sample,
      window_ms: windowMs,
      admitted: b.admitted,
      queued: b.queued,
      rejected: b.rejected,
      cancelled: b.cancelled,
      redispatched: b.redispatched,
      failures: b.failures,
      failed: b.failed,
      wait_ms: { sum: Math.round(b.wait_ms.sum), count: b.wait_ms.count, max: Math.round(b.wait_ms.max) },
    });
    fetch(t.endpoint, {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/json' },
      credentials: 'same-origin',
      cache: 'no-store',
      keepalive: true,
    })
      .then((res) => {
        if (res.status === 429 || res.status === 503) {
          const secs = Number(res.headers.get('retry-after'));
          telemetryPausedUntil = performance.now() + (Number.isFinite(secs) && secs > 0 ? secs * 1000 : t.interval_ms);
        }
      })
      .catch(() => {}); // telemetry is best effort
  }

  // --- events ---

  // The standalone worker (`/sluice/sw.js`) registers its own listeners and owns its
  // lifecycle. The import form (`/sluice/sw-import.js`, `self.__SLUICE_MODE__ = 'import'` in its
  // prefix) registers none and never calls skipWaiting or clients.claim: the app's worker calls
  // `self.sluice.handle(event)` from its own fetch listener.
  const IMPORTED = self.__SLUICE_MODE__ === 'import';

  /** Writes the full-bucket record of a fresh install (no active worker yet), if none exists. */
  async function installRecord() {
    if (!limiter || !config.persist) return;
    // A fresh install (no worker of this registration active yet) with no record may start
    // full, and writes that down, so that a record missing later means lost or corrupt, never
    // "first start".
    const fresh = !self.registration.active;
    try {
      await transact('readwrite', async (store) => {
        const existing = await request(store.getKey(KEY));
        if (existing === undefined && fresh) store.put(makeRecord('install'), KEY);
      });
    } catch (e) {
      console.warn('sluice: could not write the install record:', e);
    }
  }

  /**
   * Decides one fetch event: a Response promise for the requests sluice answers (limited
   * requests that wait, are sent by the worker or refused, and `/sluice/state`), `undefined`
   * for everything else, including a GET or HEAD admitted at once (the browser, or the app's
   * own worker, sends it). Keeps the worker alive with `event.waitUntil` until the bucket the
   * request changed is on disk.
   */
  function handle(event) {
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
      if (offer.result === 'admitted' && covered()) {
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
    return;
  }

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
})(self);
