// Headless Chromium for the browser tests and benchmarks of web/ and packages/sluice-js/:
// Debian's /usr/bin/chromium (SLUICE_CHROMIUM names another), a fresh profile per launch,
// driven by the caller's own playwright-core (each folder installs its own).

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const CHROMIUM = process.env.SLUICE_CHROMIUM || '/usr/bin/chromium';

export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  // Several tabs fire on timers at once: none of them may be throttled as a background tab.
  '--disable-background-timer-throttling',
  '--disable-renderer-backgrounding',
  '--disable-backgrounding-occluded-windows',
];

/**
 * Launches Chromium through playwright-core's `chromium` with a new profile in a temporary
 * folder named from `prefix`. Returns { context, close() }; close() also removes the profile.
 */
export async function launchChromium(chromium, prefix) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
  });
  return {
    context,
    close: async () => {
      await context.close().catch(() => {});
      await rm(dir, { recursive: true, force: true });
    },
  };
}
