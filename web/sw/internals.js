// What the script gives anything that evaluates it outside a Service Worker (the node tests,
// web/bench): `self.__sluice_internals__`, the configuration check and the ABI wrapper.
//
// Owns: isServiceWorker, which decides whether the rest of the script runs at all: the bundle
// stops right after this module unless it is true (crates/sluice-server/build/sw_bundle.rs).
// Must not touch: anything of the running worker; this module and the ones it imports are all
// that run in node.

import { DEFAULTS, normalizeConfig } from './config.js';
import { SluiceLimiter } from './limiter.js';

self.__sluice_internals__ = { normalizeConfig, SluiceLimiter, DEFAULTS };

export const isServiceWorker =
  typeof ServiceWorkerGlobalScope !== 'undefined' && self instanceof ServiceWorkerGlobalScope;
