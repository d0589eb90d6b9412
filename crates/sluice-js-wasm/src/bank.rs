//! [`Bank`]: limiters by handle, each one bucket and its wait queue
//! ([`sluice_core::driven::Limiter`]), driven by the caller's clock. Safe Rust; the
//! `extern "C"` layer only converts numbers.

use alloc::vec::Vec;

use sluice_core::driven::Limiter;
use sluice_core::queue::QueueConfig;
use sluice_core::{Kind, Quota};

/// Limiters by handle. A dropped handle's slot is reused by the next [`Bank::create`].
#[derive(Debug, Default)]
pub struct Bank {
    slots: Vec<Option<Limiter>>,
    free: Vec<u32>,
}

impl Bank {
    /// Adds a limiter and returns its handle.
    pub fn create(&mut self, kind: Kind, quota: Quota, queue: QueueConfig) -> u32 {
        let limiter = Limiter::new(kind, quota, queue);
        match self.free.pop() {
            Some(h) => {
                self.slots[h as usize] = Some(limiter);
                h
            }
            None => {
                self.slots.push(Some(limiter));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The limiter of `handle`, if it exists.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut Limiter> {
        self.slots.get_mut(handle as usize)?.as_mut()
    }

    /// Removes the limiter of `handle`; its waiters are forgotten. Returns whether it existed.
    pub fn drop_limiter(&mut self, handle: u32) -> bool {
        match self.slots.get_mut(handle as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                self.free.push(handle);
                true
            }
            _ => false,
        }
    }

    /// Limiters alive.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no limiter is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::driven::{Delivered, Delivery, Reason, Verdict};
    use sluice_core::queue::Priority;

    const SEC: u64 = 1_000_000_000;

    fn queue(depth: usize, max_wait_ns: u64) -> QueueConfig {
        QueueConfig { depth, max_wait_ns }
    }

    #[test]
    fn handles_are_reused_and_independent() {
        let mut bank = Bank::default();
        let q = Quota::parse(2, "1/s").unwrap();
        let a = bank.create(Kind::Gcra, q, QueueConfig::NONE);
        let b = bank.create(Kind::Gcra, q, QueueConfig::NONE);
        assert_ne!(a, b);
        for _ in 0..2 {
            assert!(matches!(
                bank.get_mut(a)
                    .unwrap()
                    .offer(0, 1, 0, Priority::Normal, None),
                Verdict::Admitted { .. }
            ));
        }
        assert_eq!(
            bank.get_mut(a)
                .unwrap()
                .offer(0, 1, 0, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Limited,
                retry_after_ns: SEC
            }
        );
        assert!(matches!(
            bank.get_mut(b)
                .unwrap()
                .offer(0, 1, 0, Priority::Normal, None),
            Verdict::Admitted { remaining: 1, .. }
        ));
        assert!(bank.drop_limiter(a));
        assert!(!bank.drop_limiter(a));
        assert!(bank.get_mut(a).is_none());
        assert_eq!(bank.create(Kind::Gcra, q, QueueConfig::NONE), a);
        assert_eq!(bank.len(), 2);
    }

    #[test]
    fn cancel_spends_nothing_and_timeouts_are_reported() {
        let mut l = Limiter::new(
            Kind::TokenBucket,
            Quota::parse(1, "1/s").unwrap(),
            queue(2, 3 * SEC),
        );
        assert!(matches!(
            l.offer(0, 1, 0, Priority::Normal, None),
            Verdict::Admitted { remaining: 0, .. }
        ));
        let Verdict::Queued { ticket, .. } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!("queued")
        };
        assert!(l.cancel(ticket));
        assert!(!l.cancel(ticket));
        // The cancelled waiter took nothing: one token at 1 s, as if it never came.
        assert_eq!(
            l.offer(0, 1, 0, Priority::Normal, Some(0)),
            Verdict::Rejected {
                reason: Reason::Limited,
                retry_after_ns: SEC
            }
        );
        assert_eq!(l.status(SEC).remaining, 1);
        // A waiter that cannot be admitted before its deadline is refused at the door.
        assert_eq!(
            l.offer(0, 1, 0, Priority::Normal, Some(SEC / 2)),
            Verdict::Rejected {
                reason: Reason::Timeout,
                retry_after_ns: SEC
            }
        );
        let Verdict::Queued { ticket, wait_ns } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!("queued")
        };
        assert_eq!(wait_ns, SEC);
        assert_eq!(l.poll(SEC / 2), Some(SEC));
        assert!(l.outcomes().is_empty());
        assert_eq!(l.poll(SEC), None);
        assert_eq!(
            l.outcomes(),
            &[Delivered {
                ticket,
                delivery: Delivery::Admitted
            }]
        );
        assert_eq!(l.status(SEC).queued, 0);
        l.close();
        assert_eq!(
            l.offer(10 * SEC, 1, 0, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Closed,
                retry_after_ns: 0
            }
        );
    }

    #[test]
    fn status_tells_a_full_bucket() {
        let mut l = Limiter::new(
            Kind::SlidingWindow,
            Quota::parse(10, "10/s").unwrap(),
            QueueConfig::NONE,
        );
        assert_eq!(l.status(0).reset_after_ns, 0);
        assert!(matches!(
            l.offer(0, 3, 0, Priority::Normal, None),
            Verdict::Admitted { remaining: 7, .. }
        ));
        let st = l.status(0);
        assert_eq!((st.remaining, st.limit, st.queued), (7, 10, 0));
        assert!(st.reset_after_ns > 0);
        assert_eq!(l.status(10 * SEC).reset_after_ns, 0);
    }
}
