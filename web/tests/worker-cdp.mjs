// A DevTools session on the Service Worker's own target (not the page's): through the page's
// session, Target.attachToTarget without flattening, messages wrapped in
// Target.sendMessageToTarget. The worker target answers the Runtime domain
// (Runtime.getHeapUsage); Performance.getMetrics is not available there.

/** Attaches to the origin's service worker. Returns { send(method, params), detach() }. */
export async function workerSession(page) {
  const cdp = await page.context().newCDPSession(page);
  const { targetInfos } = await cdp.send('Target.getTargets');
  const origin = new URL(page.url()).origin;
  const target = targetInfos.find((t) => t.type === 'service_worker' && t.url.startsWith(origin));
  if (!target) throw new Error(`no service worker target for ${origin}`);
  const { sessionId } = await cdp.send('Target.attachToTarget', { targetId: target.targetId, flatten: false });
  let id = 0;
  const pending = new Map();
  cdp.on('Target.receivedMessageFromTarget', (m) => {
    if (m.sessionId !== sessionId) return;
    const msg = JSON.parse(m.message);
    const p = pending.get(msg.id);
    if (!p) return;
    pending.delete(msg.id);
    if (msg.error) p.reject(new Error(`${msg.error.message} (${JSON.stringify(msg.error)})`));
    else p.resolve(msg.result);
  });
  return {
    send: (method, params = {}) =>
      new Promise((resolve, reject) => {
        const i = ++id;
        pending.set(i, { resolve, reject });
        cdp.send('Target.sendMessageToTarget', { sessionId, message: JSON.stringify({ id: i, method, params }) }).catch(reject);
      }),
    detach: async () => {
      await cdp.send('Target.detachFromTarget', { sessionId }).catch(() => {});
      await cdp.detach().catch(() => {});
    },
  };
}

/**
 * The worker's memory while `during()` runs: its V8 heap plus the ArrayBuffer backing stores
 * (where body chunks read in the worker live), sampled back to back. Returns { base, peak,
 * samples, result }, in bytes.
 */
export async function peakWorkerMemory(session, during) {
  const measure = async () => {
    const u = await session.send('Runtime.getHeapUsage');
    return u.usedSize + u.backingStorageSize;
  };
  await session.send('HeapProfiler.collectGarbage').catch(() => {});
  const base = await measure();
  let peak = base;
  let samples = 0;
  let done = false;
  const sampler = (async () => {
    while (!done) {
      peak = Math.max(peak, await measure());
      samples++;
    }
  })();
  try {
    const result = await during();
    return { base, peak, samples, result };
  } finally {
    done = true;
    await sampler;
  }
}
