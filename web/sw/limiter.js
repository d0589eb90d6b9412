// The module's ABI in JavaScript: SluiceLimiter, one sluice-wasm instance holding one limiter
// (web/README.md, "The wasm ABI").
//
// Owns: the instance it creates and the views of its memory; the decisions are the module's.
// Must not touch: the global scope, the clock (callers pass the times), IndexedDB or the
// worker's other state. It also runs outside a Service Worker (internals.js hands it to the
// node tests).

const OFFER_RESULTS = ['admitted', 'queued', 'limit', 'queue_full', 'timeout', 'too_costly', 'closed'];
const OUTCOME_RESULTS = ['admitted', 'timeout', 'closed'];
const ABI_VERSION = 2;

/** A thin wrapper over the sluice-wasm exports: one limiter per instance. */
export class SluiceLimiter {
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
