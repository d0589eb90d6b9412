// Helpers for the tests of worker updates and stops: deploying a new sluice-sw.js, and the
// admissions an upstream saw, checked against the limit.

import { sleep, workerState } from './harness.mjs';

/**
 * Has the page's registration look for a new sluice-sw.js (`registration.update()`, as the
 * browser does on a navigation) and waits until a new worker controls the page
 * (`controllerchange`, from its `clients.claim()`), then until its `/sluice/state` satisfies
 * `isNew`. Returns that state.
 *
 * It sends no request while it waits: Chromium stops the old worker before it activates the
 * new one, and a fetch in between starts the old one again, which then delays the activation
 * until the old worker is idle long enough to be stopped (about 30 s).
 */
export async function updateWorker(page, isNew, timeoutMs = 20000) {
  await page.evaluate(async (timeoutMs) => {
    const reg = await navigator.serviceWorker.getRegistration('/');
    const changed = new Promise((resolve) => navigator.serviceWorker.addEventListener('controllerchange', resolve, { once: true }));
    await reg.update();
    const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error(`no controllerchange within ${timeoutMs} ms`)), timeoutMs));
    await Promise.race([changed, timeout]);
  }, timeoutMs);
  const until = Date.now() + 5000;
  for (;;) {
    const state = await workerState(page).catch(() => null);
    if (state && isNew(state)) return state;
    if (Date.now() > until) throw new Error(`the new worker is not the expected one: ${JSON.stringify(state)}`);
    await sleep(50);
  }
}

/**
 * The largest excess of admissions over the limit in any window: for `times` (ms, any order)
 * and a bucket of `capacity` refilling one token per `intervalMs`, max over windows [a, b] of
 * count(a..b) - (capacity + (b - a) / intervalMs). A limit that held gives at most 0.
 */
export function worstExcess(times, capacity, intervalMs) {
  const t = [...times].sort((a, b) => a - b);
  let worst = -Infinity;
  let at = null;
  for (let i = 0; i < t.length; i++) {
    for (let j = i; j < t.length; j++) {
      const excess = j - i + 1 - (capacity + (t[j] - t[i]) / intervalMs);
      if (excess > worst) {
        worst = excess;
        at = { from: t[i], to: t[j], count: j - i + 1 };
      }
    }
  }
  return { worst, at };
}
