// What the worker learns from a limited request before deciding it: the flow of its tab (the
// module's fair queue) and the size of its body (whether it may wait).
//
// Owns: the flows (a small integer per tab) and the count of body bytes read to size bodies.
// Must not touch: the module, the queue, IndexedDB; the request itself keeps its body.

const flows = new Map(); // clientId -> flow
let nextFlow = 1;
export function flowOf(clientId) {
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

/** How many tabs have a flow number. */
export function flowCount() {
  return flows.size;
}

export let bodyBytesRead = 0; // body bytes read to size requests, since this worker started

/**
 * The body size, exact up to `cap`; above it, some number above `cap` (the rest is never
 * read). Chromium gives the worker no Content-Length for fetch bodies, so the body is counted
 * through a clone's stream, and the counting stops past `cap`: a 100 MB upload costs at most
 * `cap` plus one chunk here, and the request itself keeps its body, to be sent as it is.
 */
export async function bodySize(req, cap) {
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
