//! What the queue's unit tests share: a configuration in seconds, a poll loop that runs a queue
//! to a time, and a small GCRA.

use alloc::vec::Vec;

use crate::queue::{Outcome, Owned, QueueConfig, Ticket, WaitQueue};
use crate::{Algorithm, Gcra, Quota};

pub(super) const S: u64 = 1_000_000_000;

pub(super) fn cfg(depth: usize, max_wait_s: u64) -> QueueConfig {
    QueueConfig {
        depth,
        max_wait_ns: max_wait_s * S,
    }
}

pub(super) fn run_until<A: Algorithm>(
    q: &mut WaitQueue<A::State, ()>,
    alg: &A,
    state: &mut A::State,
    mut now: u64,
    end: u64,
) -> Vec<(u64, Ticket, Outcome)> {
    let mut out = Vec::new();
    while let Some(wake) = q.poll(alg, &mut Owned(state), now, |t, o| out.push((now, t, o))) {
        if wake > end {
            break;
        }
        assert!(wake > now, "wake {wake} must be after now {now}");
        now = wake;
    }
    out
}

pub(super) fn tiny(capacity: u64) -> Gcra {
    // One token per 10 ns.
    Gcra::new(Quota::new(capacity, crate::Rate::from_interval_ns(10).unwrap()).unwrap())
}
