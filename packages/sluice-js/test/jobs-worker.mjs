// One Node worker process of the job tests: runs a Worker on QUEUE until SIGTERM (then closes
// it and exits 0) or SIGKILL. Each job's handler pushes `{ id, group, cost, attempt, at,
// worker }` to the Redis list `<record>:starts` when it starts (`at`: the time Redis gave the
// claim, in ms), sleeps `sleepMs`, then pushes the id to `<record>:done`.
//
//   node jobs-worker.mjs REDIS_URL QUEUE OPTIONS_JSON
//
// OPTIONS_JSON: { record, name, sleepMs, concurrency, visibilityTimeout, prefix }

import { createClient } from 'redis';
import { JobQueue, Worker } from '../src/index.js';

const [url, name, optionsJson] = process.argv.slice(2);
const options = JSON.parse(optionsJson);
const client = await createClient({ url }).connect();
const queue = new JobQueue({ client, name, prefix: options.prefix ?? 'sluice' });
const worker = new Worker(queue, async (job) => {
  await client.rPush(`${options.record}:starts`, JSON.stringify({
    id: job.id, group: job.group, cost: job.cost, attempt: job.attempt, at: job.claimedAt, worker: options.name,
  }));
  if (options.sleepMs) await new Promise((r) => setTimeout(r, options.sleepMs));
  await client.rPush(`${options.record}:done`, job.id);
}, {
  concurrency: options.concurrency ?? 1,
  visibilityTimeout: options.visibilityTimeout ?? '30s',
  consumer: options.name,
});
process.on('SIGTERM', async () => {
  await worker.close();
  await client.quit();
  process.exit(0);
});
process.stdout.write('ready\n');
