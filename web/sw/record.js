// The stored record: one IndexedDB value under 'bucket' holding the bucket and the in-flight
// journal (web/README.md, "Persisted state"). The restore at start, reserve ahead, the writes.
//
// Owns: restoredFrom and the readiness (ready, restored), the reserve block, the save timer
// and whoever waits for it, the chain of writes, how many are under way and whether the last
// one failed.
// Must not touch: the queue, the responses, the requests themselves (upstream.js sends them,
// waiting for saveNow when a record must count them first).

import { request, transact } from './db.js';
import { adoptOrphans, journalEntries, journalWritten } from './journal.js';
import { guarded, limiter, whenFailed } from './instance.js';
import { config } from './worker.js';

const KEY = 'bucket';
const RECORD_VERSION = 1;

function fingerprint() {
  return `${config.algorithm}/${config.capacity}/${limiter.status(performance.now()).intervalNs}`;
}

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
export function covered(more = 0) {
  // After a module failure nothing is counted any more: requests follow `fail` instead.
  if (!config.persist || writeFailed || !limiter) return true;
  const counted = guarded(() => limiter.covered(performance.now(), more));
  return counted === null ? true : counted;
}

/** After an admission inside the block: the next block is written early when this one runs low. */
export function reserveNext() {
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
    inflight: journalEntries(),
  };
}

export let restoredFrom = 'pending';
let readyPromise = null;
export let restored = false; // once true, decisions can be made synchronously

/** The bucket is restored before any request is decided; every decision awaits this. */
export function ready() {
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

export function scheduleSave() {
  if (!limiter || saveTimer !== null) return;
  saveTimer = setTimeout(saveNow, config.persist_debounce_ms);
}

/** Writes the record now (taking over a scheduled save); resolves once it is committed. */
export function saveNow() {
  if (saveTimer !== null) clearTimeout(saveTimer);
  saveTimer = null;
  const waiters = saveWaiters;
  saveWaiters = [];
  journalWritten();
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
export function saved() {
  if (saveTimer === null) return saveChain;
  return new Promise((resolve) => saveWaiters.push(resolve));
}

whenFailed(() => {
  // A pending save would snapshot the module: dropped, and whoever waits for it released.
  if (saveTimer !== null) clearTimeout(saveTimer);
  saveTimer = null;
  saveWaiters.splice(0).forEach((w) => w());
});

/** Writes the full-bucket record of a fresh install (no active worker yet), if none exists. */
export async function installRecord() {
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
