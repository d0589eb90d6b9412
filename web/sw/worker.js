// This worker: its id, when it started, and the configuration it was given.
//
// Owns: workerId, startedUnixMs, and config: the prefix's `self.__SLUICE_CONFIG__` normalized,
// or null when it is invalid (configErrors says why). None of them changes after the start.
// Must not touch: the module (instance.js creates the limiter), IndexedDB, the clients.

import { normalizeConfig } from './config.js';

export const workerId = Math.random().toString(36).slice(2, 10);
export const startedUnixMs = Date.now();

const normalized = normalizeConfig(self.__SLUICE_CONFIG__);
/** The configuration, or null: then nothing is limited (instance.js fails open). */
export const config = normalized.config;
export const configErrors = normalized.errors;
