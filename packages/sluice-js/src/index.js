// sluice-limits: exact rate limiting for Node and browsers on sluice's Rust core.

export { RateLimiter } from './limiter.js';
export { PromisePool } from './pool.js';
export { limit } from './limit.js';
export { keyed, Keyed } from './keyed.js';
export { retry, rateLimitHints } from './retry.js';
export { CircuitBreaker } from './breaker.js';
export {
  readRateLimits, parseIetf, parseOpenAI, parseAnthropic, parseGitHub, parseRetryAfter, parseDuration, parseList,
  measureSkew,
} from './headers.js';
export { Pacer, Ticket, MemoryPacerStore, pacer, paced } from './pacer.js';
export {
  SluiceError, QueueFullError, TimeoutError, AbortError, InsufficientCapacityError, ClosedError,
  CircuitOpenError, UnavailableError,
} from './errors.js';
export { ALGORITHMS, keyHash, ready } from './core.js';
export { JobQueue, Worker, failureWaitMs } from './jobs.js';
