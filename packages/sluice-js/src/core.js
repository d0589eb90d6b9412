// The WebAssembly core (crates/sluice-js-wasm, embedded as base64): compiled once when this
// module loads, with no network or file access. The exports speak numbers; this file turns
// them into a small object per limiter.

import { WASM_BASE64 } from './core-wasm.generated.js';

const ABI_VERSION = 1;

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

// Asynchronous compilation: browsers refuse synchronous compilation of large modules on the
// main thread.
const { instance } = await WebAssembly.instantiate(decodeBase64(WASM_BASE64), {});
const ex = instance.exports;
if (ex.sj_abi_version() !== ABI_VERSION) {
  throw new Error(`sluice-limits: the embedded core speaks ABI ${ex.sj_abi_version()}, expected ${ABI_VERSION}`);
}

let buffer = null;
let out = null;
const outPtr = ex.sj_out();
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

function writeInput(text) {
  const bytes = encoder.encode(text);
  const ptr = ex.sj_input(bytes.length);
  new Uint8Array(ex.memory.buffer, ptr, bytes.length).set(bytes);
  return bytes.length;
}

/** The algorithm names, in the order of their codes. */
export const ALGORITHMS = ['token_bucket', 'gcra', 'leaky_bucket', 'sliding_log', 'sliding_window', 'fixed_window'];

/** The code of an algorithm name, parsed by the core (so aliases match the gateway's). */
export function algorithmCode(name) {
  if (typeof name !== 'string') throw new TypeError(`algorithm must be a string, got ${typeof name}`);
  const code = ex.sj_parse_kind(writeInput(name));
  if (code < 0) throw new RangeError(`algorithm: ${lastError()}`);
  return code;
}

/** The interval between tokens (BigInt ns) of a rate such as "10/s" or "10 per 90s". */
export function rateIntervalNs(rate) {
  if (typeof rate !== 'string') {
    throw new TypeError(`rate must be a string such as "10/s" or "10 per 90s", got ${typeof rate}`);
  }
  const ns = ex.sj_parse_rate(writeInput(rate));
  if (ns < 0n) throw new RangeError(`rate: ${lastError()}`);
  return ns;
}

/** Offer codes of the core. */
export const ADMITTED = 0, QUEUED = 1, LIMITED = 2, QUEUE_FULL = 3, TIMEOUT = 4, TOO_COSTLY = 5, CLOSED = 6;
/** Outcome codes of the core. */
export const OUT_ADMITTED = 0, OUT_TIMED_OUT = 1, OUT_CLOSED = 2;

const U32_MAX = 4294967295;
const I64_MAX = 9223372036854775807n;

const registry = typeof FinalizationRegistry === 'function'
  ? new FinalizationRegistry((handle) => ex.sj_drop(handle))
  : null;

/** One limiter of the core: an algorithm, its bucket and its wait queue. */
export class CoreLimiter {
  /**
   * @param {number} kind algorithm code
   * @param {bigint} capacity
   * @param {bigint} intervalNs
   * @param {number} depth queue depth (0: no queue)
   * @param {bigint|null} maxWaitNs null: no limit
   */
  constructor(kind, capacity, intervalNs, depth, maxWaitNs) {
    const d = depth === Infinity ? U32_MAX : Math.min(depth, U32_MAX);
    const handle = ex.sj_create(kind, capacity, intervalNs, d, maxWaitNs ?? I64_MAX);
    if (handle < 0) throw new RangeError(lastError());
    this.handle = handle;
    /** Floats of the last offer: [ticket, wait or retry-after ns, remaining]. */
    this.ticket = 0;
    this.waitNs = 0;
    this.remaining = 0;
    registry?.register(this, handle, this);
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

  /** [remaining, capacity, queued, ns until full] as of `now`. */
  status(now) {
    ex.sj_status(this.handle, now);
    views();
    return [out[0], out[1], out[2], out[3]];
  }

  /** Frees the core's memory for this limiter; it must not be used afterwards. */
  free() {
    if (this.handle >= 0) {
      registry?.unregister(this);
      ex.sj_drop(this.handle);
      this.handle = -1;
    }
  }
}
