// The pacer's state in Redis, so that Node processes pace as one client: one key holds what
// the servers said (each limit's remaining, reset and next slot, on Redis's clock), and every
// step of the pacing (admit, observe, settle) runs against it in a compare-and-set loop. The
// step is the one the in-memory store runs (src/pacing.js): only where the state lives differs.

import { sender } from './redis-client.js';

/** The state and Redis's clock, in one round trip. */
const READ = `local v = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
return {v or '', t[1], t[2]}`;

/** Writes the new state only if the key still holds what the step read. */
const WRITE = `if (redis.call('GET', KEYS[1]) or '') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0`;

/** A step that lost this many races in a row fails rather than spin. */
const MAX_TRIES = 100;

/**
 * The shared state of a pacer group in Redis: `new RedisPacerStore({ client, key, ttl })`,
 * given as `pacer({ store })` in every process. `key` names the group (one per server and
 * account: `'pace:api.openai.com:team-a'`); the state expires `ttl` ms (default two days) after
 * its last change. Times are Redis's (TIME), so the processes' clocks do not enter: a server's
 * reset is read once into the key, and the others pace by it.
 */
export class RedisPacerStore {
  #send;
  #ttl;
  constructor({ client, key, ttl = 2 * 86400000 } = {}) {
    if (typeof key !== 'string' || key === '') throw new TypeError('key must be a non-empty string');
    if (!Number.isSafeInteger(ttl) || ttl < 1) throw new RangeError(`ttl must be a whole number of ms, got ${ttl}`);
    this.#send = sender(client);
    this.#ttl = ttl;
    this.key = key;
  }

  /**
   * Runs `fn(state, nowMs)` on the shared state and returns its answer, once the state it
   * changed was written over the one it read (else it runs again on the fresh state).
   *
   * # Errors
   * Redis's errors, as they come; an Error after 100 lost races in a row.
   */
  async update(fn, fresh) {
    for (let i = 0; i < MAX_TRIES; i++) {
      const [text, sec, usec] = await this.#send(this.key, ['EVAL', READ, '1', this.key]);
      const now = Number(sec) * 1000 + Number(usec) / 1000;
      const state = text === '' ? fresh(now) : JSON.parse(text);
      const answer = fn(state, now);
      const written = await this.#send(this.key, ['EVAL', WRITE, '1', this.key, text, JSON.stringify(state), String(this.#ttl)]);
      if (Number(written) === 1) return answer;
    }
    throw new Error(`the pacer state at ${this.key} changed under ${MAX_TRIES} tries in a row`);
  }

  /** Other processes change the state too: ask again at least this often while waiting. */
  get pollMs() {
    return 100;
  }
}
