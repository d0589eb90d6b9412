// A fake monotonic clock (BigInt ns) and the timers that go with it, for the behaviour suite:
// `advance(ms)` moves the clock timer by timer and lets each fired callback's promises settle.

export function fakeTime() {
  let now = 0n;
  let seq = 0;
  const pending = new Map();
  const settle = () => new Promise((resolve) => globalThis.setTimeout(resolve, 0));
  return {
    now: () => now,
    get ms() {
      return Number(now / 1000000n);
    },
    timers: {
      setTimeout(fn, ms) {
        const id = ++seq;
        pending.set(id, { at: now + BigInt(Math.max(0, Math.ceil(ms))) * 1000000n, fn, id });
        return id;
      },
      clearTimeout(id) {
        pending.delete(id);
      },
    },
    /** Timers armed now. */
    get armed() {
      return pending.size;
    },
    async advance(ms) {
      const target = now + BigInt(ms) * 1000000n;
      await settle();
      for (;;) {
        let next = null;
        for (const t of pending.values()) {
          if (t.at <= target && (next === null || t.at < next.at || (t.at === next.at && t.id < next.id))) next = t;
        }
        if (next === null) break;
        pending.delete(next.id);
        if (next.at > now) now = next.at;
        next.fn();
        await settle();
      }
      now = target;
      await settle();
    },
  };
}
