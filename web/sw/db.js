// IndexedDB: the database `sluice` and its one object store `state` (web/README.md,
// "Persisted state"), and a transaction as a promise.
//
// Owns: the open database (opened at the first use, and again after an open fails).
// Must not touch: what is stored (record.js reads and writes the record), the module.

const DB_NAME = 'sluice';
const STORE = 'state';
let dbPromise = null;

export function request(req) {
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
export async function transact(mode, fn) {
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
