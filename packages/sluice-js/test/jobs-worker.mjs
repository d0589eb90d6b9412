// One Node worker process of the job tests: runs a Worker on QUEUE until SIGTERM (then closes
// it and exits 0) or SIGKILL. Each job's handler pushes `{ id, group, cost, attempt, worker }`
// to the Redis list `<record>:starts` when it starts, sleeps `sleepMs`, then pushes the id to
// `<record>:done`. Prints `ready` once it runs.
//
//   node jobs-worker.mjs REDIS_URL QUEUE OPTIONS_JSON
//
// OPTIONS_JSON: { record, name, sleepMs, concurrency, visibilityTimeoutMs, limit,
// groupConcurrency } (limit: { prefix, algorithm, capacity, rate } or null), the queue options
// every worker of a test shares.

import { createClient } from 'redis';
import { JobQueue, Worker } from '../src/index.js';

const [url, name, optionsJson] = process.argv.slice(2);
const options = JSON.parse(optionsJson);
const client = await createClient({ url }).connect();
const queue = new JobQueue({
  client, name, limit: options.limit ?? null, concurrency: options.groupConcurrency ?? 0,
  visibilityTimeout: options.visibilityTimeoutMs ?? 30000,
});
const worker = new Worker(queue, async (job) => {
  await client.rPush(`${options.record}:starts`, JSON.stringify({
    id: job.id, group: job.group, cost: job.cost, attempt: job.attempt, worker: options.name,
  }));
  if (options.sleepMs) await new Promise((r) => setTimeout(r, options.sleepMs));
  await client.rPush(`${options.record}:done`, `${job.group}/${job.id}`);
}, { concurrency: options.concurrency ?? 1, consumer: options.name, poll: 20 });
worker.on('error', ({ error }) => process.stderr.write(`worker ${options.name}: ${error?.stack ?? error}\n`));
process.on('SIGTERM', async () => {
  await worker.close();
  await client.quit();
  process.exit(0);
});
process.stdout.write('ready\n');
