// The worker's configuration: its defaults, and the check of what the gateway (or `sluice
// bundle`) put in the prefix as `self.__SLUICE_CONFIG__` (web/README.md, "Configuration").
//
// Owns: DEFAULTS and normalizeConfig, a pure function of the object it is given.
// Must not touch: the global scope, the module, IndexedDB or the clock. It also runs outside a
// Service Worker (internals.js hands it to the node tests), so it uses nothing but the language.

export const DEFAULTS = {
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
  pace_from_server: false,
};

/**
 * Fills defaults and checks types. Returns { config, errors }: with errors, the worker
 * limits nothing (it fails open: the gateway still enforces its own limits).
 */
export function normalizeConfig(raw) {
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
    pace_from_server: pick('pace_from_server', DEFAULTS.pace_from_server),
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
  if (typeof config.pace_from_server !== 'boolean') errors.push('pace_from_server must be true or false');
  const t = config.telemetry;
  if (t !== null) {
    if (typeof t.endpoint !== 'string' || !t.endpoint.startsWith('/')) errors.push('telemetry.endpoint must be a path starting with "/"');
    if (!isInt(t.interval_ms, 1000)) errors.push('telemetry.interval_ms must be a whole number of at least 1000');
    if (typeof t.sample !== 'number' || !(t.sample >= 0 && t.sample <= 1)) errors.push('telemetry.sample must be a number from 0 to 1');
  }
  return { config: errors.length ? null : config, errors };
}
