#!/usr/bin/env node
// The demo without the gateway: a demo upstream and the dev front (which serves /sluice/* and
// proxies the rest, limiting nothing itself), on 127.0.0.1.
//
//   cargo build -p sluice-wasm --target wasm32-unknown-unknown --release
//   node web/dev-server.mjs [--port 8080] [--config web/sluice.config.json]
//   then open http://127.0.0.1:8080/sluice/demo.html in two or three tabs
import { readFileSync } from 'node:fs';

import { DEFAULT_CONFIG } from './build-sw.mjs';
import { startDevFront, startUpstream } from './tests/harness.mjs';

const args = { port: '8080', config: DEFAULT_CONFIG };
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const config = JSON.parse(readFileSync(args.config, 'utf8'));
const upstream = await startUpstream();
const front = await startDevFront({ upstream, config, port: Number(args.port) });
console.log(`sluice dev front on ${front.url} (upstream ${upstream.url}); demo: ${front.url}/sluice/demo.html`);
console.log(`config: ${JSON.stringify(config)}`);
