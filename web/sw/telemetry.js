// The counters (totals since this worker started, and the batch for telemetry) and the
// telemetry batches: sampled, POSTed as small JSON to `telemetry.endpoint` (web/README.md,
// "Telemetry").
//
// Owns: totals, the batch and when it started, the telemetry timer, sequence and pause.
// Must not touch: the module, the queue, IndexedDB. Other modules count through count().

import { config, workerId } from './worker.js';

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
export const totals = newCounters();
let batch = newCounters();
let batchStart = performance.now();

export function count(update) {
  update(totals);
  update(batch);
  armTelemetry();
}

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
