// A front of the test's own in front of the real gateway: it serves /sluice/sw.js built from
// web/sw.js with the module the test chooses (corrupt, not instantiable, or the real one with a
// trap to arm) and passes everything else to the gateway, whose /metrics then count what the
// worker reports.
import http from 'node:http';

import { prefix } from '../build-sw.mjs';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { launchBrowser, serveOnFreePort, startFront, startUpstream, WEB } from './harness.mjs';

/** Bytes that are not a wasm module: `new WebAssembly.Module` throws a CompileError. */
export const CORRUPT_WASM = new Uint8Array([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0xff, 0x13, 0x37]);

/** A valid module that imports `m.f`: instantiating it with no imports throws. */
export const IMPORTING_WASM = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type section: () -> ()
  0x02, 0x07, 0x01, 0x01, 0x6d, 0x01, 0x66, 0x00, 0x00, // import section: func m.f
]);

/**
 * Placed between the prefix and web/sw.js: wraps the sluice module's exports so that a page's
 * message `{ type: 'test:trap', fn: 'sluice_poll' }` makes every later call of that export run
 * a wasm `unreachable` first: a real WebAssembly.RuntimeError, thrown from inside the call. The
 * page gets `{ type: 'test:armed' }` back once it is armed.
 */
export const TRAP_SHIM = `(function () {
  var trap = new WebAssembly.Instance(new WebAssembly.Module(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 4, 1, 96, 0, 0, 3, 2, 1, 0, 7, 5, 1, 1, 116, 0, 0, 10, 5, 1, 3, 0, 0, 11])), {}).exports.t;
  var armed = null;
  self.addEventListener('message', function (e) {
    if (!e.data || e.data.type !== 'test:trap') return;
    armed = e.data.fn;
    e.source.postMessage({ type: 'test:armed', fn: armed });
  });
  var Real = WebAssembly.Instance;
  WebAssembly.Instance = function (module, imports) {
    var inst = new Real(module, imports);
    var names = WebAssembly.Module.exports(module).map(function (d) { return d.name; });
    if (names.indexOf('sluice_offer') < 0) return inst;
    var x = {};
    names.forEach(function (n) {
      var v = inst.exports[n];
      x[n] = typeof v !== 'function' ? v : function () { if (armed === n) trap(); return v.apply(null, arguments); };
    });
    return { exports: x };
  };
})();
`;

/** Serves the worker script `script` and passes everything else to `target` (a URL). */
async function startScriptFront({ target, script }) {
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && new URL(req.url, 'http://front').pathname === '/sluice/sw.js') {
      res.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8', 'service-worker-allowed': '/', 'cache-control': 'no-cache' });
      return res.end(script);
    }
    const out = http.request(`${target}${req.url}`, { method: req.method, headers: req.headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    out.on('error', () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    req.pipe(out);
  });
  return serveOnFreePort(server);
}

/**
 * Upstream, gateway (for `config`), this front (the worker with `wasm`, and `shim` before
 * web/sw.js) and a browser. `front.telemetryTotals()` is the gateway's; `metric(name)` reads
 * one series of its /metrics.
 */
export async function setupCustom({ config, wasm, shim = '' }) {
  const upstream = await startUpstream();
  const gateway = await startFront({ upstream, config });
  const script = prefix(wasm, config) + shim + readFileSync(join(WEB, 'sw.js'), 'utf8');
  const front = await startScriptFront({ target: gateway.url, script });
  const browser = await launchBrowser();
  return {
    upstream,
    gateway,
    front,
    context: browser.context,
    metric: async (name) => {
      const text = await (await fetch(`${gateway.admin}/metrics`)).text();
      const m = text.match(new RegExp(`^${name}\\s+([0-9.e+]+)`, 'm'));
      return m ? Number(m[1]) : null;
    },
    close: async () => {
      await browser.close();
      await front.close();
      await gateway.close();
      await upstream.close();
    },
  };
}
