// `GET /sluice/state`: this worker's state as JSON, for pages and tests (web/README.md,
// "`GET /sluice/state`").
//
// Owns: STATE_PATH and the shape of the body.
// Must not touch: what it shows: it reads each module's state and changes none (a trap in
// `status` fails the module, as any call into it would).

import { disabled, failure, guarded, limiter } from './instance.js';
import { restoredFrom } from './record.js';
import { totals } from './telemetry.js';
import { bodyBytesRead, flowCount } from './requests.js';
import { config, startedUnixMs, workerId } from './worker.js';
import { paceSnapshot } from './pace.js';

export const STATE_PATH = '/sluice/state';

export function stateResponse() {
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
    flows: flowCount(),
    body_bytes_read: bodyBytesRead,
    pacing: paceSnapshot(),
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
