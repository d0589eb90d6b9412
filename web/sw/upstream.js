// An admitted request sent upstream by the worker itself: it enters the journal, waits for a
// record that counts its admission when it must, and leaves the journal once its response
// starts. (A GET or HEAD admitted inside the reserved block is not sent from here: the browser
// sends it, fetch.js.)
//
// Owns: the journal timer: safe requests still in flight after JOURNAL_DELAY_MS are written.
// Must not touch: the decision or the queue (fetch.js and queue.js), the module.

import { enterJournal, journalHasUnsaved, leaveJournal } from './journal.js';
import { covered, saveNow, scheduleSave } from './record.js';
import { paceLost, paceResponse } from './pace.js';

// For methods that are not safe the record is written before the request leaves; for these
// once the request has been in flight for JOURNAL_DELAY_MS (journal.js says why).
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
// Most answers arrive sooner: they never cost a write. Slower ones are journaled then.
const JOURNAL_DELAY_MS = 25;
let journalTimer = null;

/**
 * Sends `req` and answers with its response. With a pacing `ticket` (pace.js), the response's
 * limit fields are read and the ticket settled, also when no response comes.
 */
export async function sendUpstream(key, req, ticket = null) {
  const id = enterJournal(key);
  // A request whose admission the stored record does not count yet waits for a record that does.
  if (!SAFE_METHODS.has(req.method) || !covered()) await saveNow();
  else if (journalTimer === null) journalTimer = setTimeout(journalSlow, JOURNAL_DELAY_MS);
  try {
    const response = await fetch(req);
    if (ticket !== null) paceResponse(response, ticket);
    return response;
  } catch (e) {
    if (ticket !== null) paceLost(ticket);
    throw e;
  } finally {
    // The response has started: the browser will not dispatch it again. If it is in the
    // record: take it out.
    if (leaveJournal(id)) scheduleSave();
  }
}

/** Safe requests still in flight after JOURNAL_DELAY_MS go into the record. */
function journalSlow() {
  journalTimer = null;
  if (journalHasUnsaved()) saveNow();
}
