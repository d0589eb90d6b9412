// Minimal assertions that run alike in Node and in a browser page.

export function equal(actual, expected, message = '') {
  if (!Object.is(actual, expected)) {
    throw new Error(`${message} expected ${String(expected)}, got ${String(actual)}`);
  }
}

export function deepEqual(actual, expected, message = '') {
  const a = JSON.stringify(actual, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));
  const e = JSON.stringify(expected, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));
  if (a !== e) throw new Error(`${message} expected ${e}, got ${a}`);
}

export function ok(value, message = 'expected a true value') {
  if (!value) throw new Error(message);
}

export async function rejects(promise, check, message = '') {
  let error = null;
  try {
    await promise;
  } catch (e) {
    error = e;
  }
  if (error === null) throw new Error(`${message} expected a rejection`);
  check(error);
  return error;
}

export function throws(fn, check) {
  try {
    fn();
  } catch (e) {
    check(e);
    return e;
  }
  throw new Error('expected a throw');
}
