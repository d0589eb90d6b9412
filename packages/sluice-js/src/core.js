// The WebAssembly core (crates/sluice-js-wasm, embedded as base64), compiled on first use with
// no network or file access: synchronously where the platform allows it (Node, workers, most
// pages), or ahead of time by `await ready()` where a page compiles WebAssembly asynchronously
// only. No top-level await: the module loads as CommonJS and through every bundler. The
// exports speak numbers; this file turns them into a small object per limiter.

import { WASM_BASE64 } from './core-wasm.generated.js';

const ABI_VERSION = 3;

function decodeBase64(text) {
  if (typeof globalThis.Buffer === 'function') {
    const b = globalThis.Buffer.from(text, 'base64');
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  const s = globalThis.atob(text);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return bytes;
}

/** The instance's exports, once compiled. */
let ex = null;
let compiling = null;
let outPtr = 0;

/** Why compilation failed, in words a developer can act on. */
function explain(e) {
  const text = String(e?.message ?? e);
  if (/unsafe-eval|Content Security Policy|CSP/i.test(text)) {
    return new Error(
      "sluice-limits: this page's Content Security Policy forbids compiling WebAssembly: add " +
      "'wasm-unsafe-eval' to its script-src (it allows WebAssembly only, not eval)",
      { cause: e },
    );
  }
  if (e instanceof RangeError) {
    return new Error(
      'sluice-limits: this page compiles WebAssembly asynchronously only: `await ready()` ' +
      '(exported by sluice-limits) before the first limiter',
      { cause: e },
    );
  }
  return e;
}

function install(instance) {
  if (ex) return;
  const exports = instance.exports;
  if (exports.sj_abi_version() !== ABI_VERSION) {
    throw new Error(`sluice-limits: the embedded core speaks ABI ${exports.sj_abi_version()}, expected ${ABI_VERSION}`);
  }
  ex = exports;
  outPtr = ex.sj_out();
}

/** The core's exports, compiling it synchronously if `ready()` has not done so. */
function core() {
  if (ex) return ex;
  let module;
  try {
    module = new WebAssembly.Module(decodeBase64(WASM_BASE64));
  } catch (e) {
    throw explain(e);
  }
  install(new WebAssembly.Instance(module, {}));
  return ex;
}

/**
 * Compiles the core asynchronously (once); resolves when every API may be used. Needed only
 * where synchronous compilation is refused (a browser page's main thread may refuse it);
 * elsewhere the first limiter compiles it.
 */
export function ready() {
  if (ex) return Promise.resolve();
  compiling ??= WebAssembly.instantiate(decodeBase64(WASM_BASE64), {}).then(
    ({ instance }) => install(instance),
    (e) => {
      compiling = null;
      throw explain(e);
    },
  );
  return compiling;
}

let buffer = null;
let out = null;
function views() {
  if (ex.memory.buffer !== buffer) {
    buffer = ex.memory.buffer;
    out = new Float64Array(buffer, outPtr, 4);
  }
}
const encoder = new TextEncoder();
const decoder = new TextDecoder();

function lastError() {
  return decoder.decode(new Uint8Array(ex.memory.buffer, ex.sj_error_ptr(), ex.sj_error_len()));
}

function writeInput(...parts) {
  let len = 0;
  for (const p of parts) len += p.length;
  const ptr = ex.sj_input(len);
  const mem = new Uint8Array(ex.memory.buffer, ptr, len);
  let at = 0;
  for (const p of parts) {
    mem.set(p, at);
    at += p.length;
  }
  return len;
}

/** The algorithm names, in the order of the core's codes. Frozen: the code of a name never moves. */
export const ALGORITHMS = Object.freeze(['token_bucket', 'gcra', 'leaky_bucket', 'sliding_log', 'sliding_window', 'fixed_window']);

/** The code of an algorithm name, parsed by the core (so aliases match the gateway's). */
export function algorithmCode(name) {
  if (typeof name !== 'string') throw new TypeError(`algorithm must be a string, got ${typeof name}`);
  const e = core();
  const code = e.sj_parse_kind(writeInput(encoder.encode(name)));
  if (code < 0) throw new RangeError(`algorithm: ${lastError()}`);
  return code;
}

/** The interval between tokens (BigInt ns) of a rate such as "10/s" or "10 per 90s". */
export function rateIntervalNs(rate) {
  if (typeof rate !== 'string') {
    throw new TypeError(`rate must be a string such as "10/s" or "10 per 90s", got ${typeof rate}`);
  }
  const e = core();
  const ns = e.sj_parse_rate(writeInput(encoder.encode(rate)));
  if (ns < 0n) throw new RangeError(`rate: ${lastError()}`);
  return ns;
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

function bytesOf(value, what) {
  if (typeof value === 'string') return encoder.encode(value);
  if (value instanceof Uint8Array) return value;
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  throw new TypeError(`${what} must be a string or a Uint8Array, got ${typeof value}`);
}

/**
 * The key as the gateway stores a key taken from a header, a cookie or a query parameter:
 * HMAC-SHA256(salt, key), its first 16 bytes as 32 lowercase hex digits. `salt` is the value
 * of the gateway's `store.key_salt` (a string is read as UTF-8); without one the gateway uses
 * the empty salt.
 */
export function keyHash(salt, key) {
  const s = bytesOf(salt, 'salt');
  const k = bytesOf(key, 'key');
  const e = core();
  writeInput(s, k);
  const ptr = e.sj_key_hash(s.length, k.length);
  const digest = new Uint8Array(e.memory.buffer, ptr, 16);
  let hex = '';
  for (let i = 0; i < 16; i++) hex += HEX[digest[i]];
  return hex;
}

/** Offer codes of the core. */
export const ADMITTED = 0, QUEUED = 1, LIMITED = 2, QUEUE_FULL = 3, TIMEOUT = 4, TOO_COSTLY = 5, CLOSED = 6;
/** Outcome codes of the core. */
export const OUT_ADMITTED = 0, OUT_TIMED_OUT = 1, OUT_CLOSED = 2;

const U32_MAX = 4294967295;
export const I64_MAX = 9223372036854775807n;

let registry;
function finalizer() {
  if (registry === undefined) {
    registry = typeof FinalizationRegistry === 'function'
      ? new FinalizationRegistry((handle) => ex.sj_drop(handle))
      : null;
  }
  return registry;
}

let groups;
/**
 * Frees `cores()` (CoreLimiters made unowned) once `owner` is garbage: one registration for a
 * whole table of limiters rather than one each (registering costs microseconds per limiter).
 * `cores` must not hold `owner`.
 */
export function freeWithOwner(owner, cores) {
  if (groups === undefined) {
    groups = typeof FinalizationRegistry === 'function'
      ? new FinalizationRegistry((list) => { for (const c of list()) c.free(); })
      : null;
  }
  groups?.register(owner, cores, owner);
}

function depthOf(depth) {
  return depth === Infinity ? U32_MAX : Math.min(depth, U32_MAX);
}

/** One limiter of the core: an algorithm, its bucket and its wait queue. */
export class CoreLimiter {
  /**
   * @param {number} kind algorithm code
   * @param {bigint} capacity
   * @param {bigint} intervalNs
   * @param {number} depth queue depth (0: no queue)
   * @param {bigint|null} maxWaitNs null: no limit
   * @param {boolean} owned whether it frees itself when garbage (false: its owner frees it,
   *   see freeWithOwner)
   */
  constructor(kind, capacity, intervalNs, depth, maxWaitNs, owned = true) {
    const e = core();
    const handle = e.sj_create(kind, capacity, intervalNs, depthOf(depth), maxWaitNs ?? I64_MAX);
    if (handle < 0) throw new RangeError(lastError());
    this.handle = handle;
    /** Floats of the last offer: [ticket, wait or retry-after ns, remaining]. */
    this.ticket = 0;
    this.waitNs = 0;
    this.remaining = 0;
    this.registered = owned && finalizer() !== null;
    if (this.registered) registry.register(this, handle, this);
  }

  /** Offers `cost` at `now`; returns the offer code and sets ticket / waitNs / remaining. */
  offer(now, cost, priority, maxWaitNs) {
    const code = ex.sj_offer(this.handle, now, cost, priority, maxWaitNs);
    views();
    this.ticket = out[0];
    this.waitNs = out[1];
    this.remaining = out[2];
    return code;
  }

  /** Offers `cost` at `now`, never waiting (tryAcquire): just the offer code. */
  offerNow(now, cost) {
    return ex.sj_try(this.handle, now, cost);
  }

  /** Polls at `now`: calls `each(ticket, code, retryAfterNs)` per outcome; the next wake (ns) or -1n. */
  poll(now, each) {
    const wake = ex.sj_poll(this.handle, now);
    this.#outcomes(ex.sj_list_len(), each);
    return wake;
  }

  #outcomes(len, each) {
    if (len === 0) return;
    const list = new Float64Array(ex.memory.buffer, ex.sj_list(), len).slice();
    for (let i = 0; i < len; i += 3) each(list[i], list[i + 1], list[i + 2]);
  }

  /** Withdraws a waiting ticket: whether it was waiting (it spent nothing). */
  cancel(ticket) {
    return ex.sj_cancel(this.handle, ticket) === 1;
  }

  /** Turns every waiter away (outcomes through `each`) and refuses new offers. */
  close(each) {
    const n = ex.sj_close(this.handle);
    this.#outcomes(n * 3, each);
  }

  /**
   * Takes `cost` (BigInt) at `now` without asking: a bucket goes up to `maxDebt` tokens
   * (BigInt; -1n: no cap) beyond empty, a window takes what it has left. Returns the part
   * forgiven, a number. Nothing may wait (withdraw the waiters first).
   */
  charge(now, cost, maxDebt) {
    const forgiven = ex.sj_charge(this.handle, now, cost, maxDebt);
    if (forgiven === -2n) throw new Error('sluice-limits: charge with waiters (withdraw them first)');
    return forgiven < 0n ? Number(cost) : Number(forgiven);
  }

  /**
   * Gives back `cost` (BigInt) admitted `agoNs` before `now`, never beyond a full bucket.
   * Nothing may wait (withdraw the waiters first).
   */
  refund(now, cost, agoNs) {
    if (ex.sj_refund(this.handle, now, cost, agoNs) === -2) {
      throw new Error('sluice-limits: refund with waiters (withdraw them first)');
    }
  }

  /** [remaining, capacity, queued, ns until full] as of `now`. */
  status(now) {
    ex.sj_status(this.handle, now);
    views();
    return [out[0], out[1], out[2], out[3]];
  }

  /**
   * `reset(now, until)` for a limiter passed from a dropped key to a new one; returns the ns
   * (BigInt) until its bucket was full again as of `now` (0n: full), what the dropped key must
   * be remembered by.
   */
  recycle(now, until = 0n) {
    return ex.sj_recycle(this.handle, now, until);
  }

  /** Nanoseconds until the bucket is full again as of `now` (0: full), a number. */
  untilFull(now) {
    ex.sj_status(this.handle, now);
    views();
    return out[3];
  }

  /**
   * Changes algorithm, quota and queue at `now`, converting the bucket (no tokens gained).
   * Nothing may wait: withdraw the waiters first. Throws RangeError for an invalid quota.
   */
  reconfigure(now, kind, capacity, intervalNs, depth, maxWaitNs) {
    const code = ex.sj_reconfigure(this.handle, now, kind, capacity, intervalNs, depthOf(depth), maxWaitNs ?? I64_MAX);
    if (code === -2) throw new Error('sluice-limits: reconfigure with waiters (withdraw them first)');
    if (code < 0) throw new RangeError(lastError());
  }

  /**
   * Makes it afresh, its configuration kept: a full bucket, or with `until` (ns) later than
   * `now` the fullest one that is full again no earlier than then. Waiters are forgotten.
   */
  reset(now, until = 0n) {
    ex.sj_reset(this.handle, now, until);
  }

  /** Frees the core's memory for this limiter; it must not be used afterwards. */
  free() {
    if (this.handle >= 0) {
      if (this.registered) registry.unregister(this);
      ex.sj_drop(this.handle);
      this.handle = -1;
    }
  }
}
