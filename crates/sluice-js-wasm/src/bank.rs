//! [`Bank`]: limiters by handle, each one bucket and its wait queue
//! ([`sluice_core::driven::Limiter`]), driven by the caller's clock. Safe Rust; the
//! `extern "C"` layer only converts numbers.

use alloc::vec::Vec;

use sluice_core::driven::{Busy, Limiter, Reason, Verdict};
use sluice_core::queue::{Priority, QueueConfig};
use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota, Snapshot};

/// Limiters by handle. A dropped handle's slot is reused by the next [`Bank::create`].
#[derive(Debug, Default)]
pub struct Bank {
    slots: Vec<Option<Limiter>>,
    free: Vec<u32>,
    /// The algorithm of the last [`Bank::reset`]: a key table resets its limiters under one
    /// quota, and making an algorithm costs wide divisions.
    algorithm: Option<AnyAlgorithm>,
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

    /// Replaces the algorithm, quota and queue of `handle`'s limiter at `now`, converting its
    /// bucket by sluice-core's rule ([`sluice_core::SavedState::convert`]): what it has left
    /// becomes at most the new capacity, debt is kept in the new rate's time, so no change
    /// gives a key tokens it did not have. Returns whether the limiter exists.
    ///
    /// # Errors
    ///
    /// [`Busy`] while requests wait on it (withdraw them first, then offer them again).
    pub fn reconfigure(
        &mut self,
        handle: u32,
        now: u64,
        kind: Kind,
        quota: Quota,
        queue: QueueConfig,
    ) -> Result<bool, Busy> {
        let Some(old) = self.get_mut(handle) else {
            return Ok(false);
        };
        if old.queued() > 0 {
            return Err(Busy);
        }
        let snapshot = old.snapshot(now, 0);
        let mut new = Limiter::new(kind, quota, queue);
        if new.restore(&snapshot, now, 0).is_err() {
            // A snapshot the new limiter cannot read: empty rather than full.
            let _ = new.exhaust(now);
        }
        *old = new;
        Ok(true)
    }

    /// Makes `handle`'s limiter afresh (its algorithm, quota and queue kept): a full bucket, or
    /// with `until` later than `now`, the fullest bucket that is full again no earlier than
    /// `until` (as [`Algorithm::idle_at`] tells). What a key table does with the slot of a key
    /// it forgot, for the next key; with `until`, the state of a key that was forgotten while it
    /// still had spending to recover, so that it comes back no fuller than it left. Waiters,
    /// if any, are forgotten. Returns whether the limiter exists.
    pub fn reset(&mut self, handle: u32, now: u64, until: u64) -> bool {
        let cached = self.algorithm;
        let Some(limiter) = self.get_mut(handle) else {
            return false;
        };
        let (kind, quota) = (limiter.kind(), limiter.quota());
        let algorithm = same_or_new(cached, kind, quota);
        let state = if until > now {
            spent_until(&algorithm, until, now)
        } else {
            algorithm.initial_state()
        };
        // With nothing waiting, the bucket is replaced in place (restore); else made anew.
        let snapshot = Snapshot::take(&algorithm, &state, now, 0);
        if limiter.queued() > 0 || limiter.restore(&snapshot, now, 0).is_err() {
            *limiter = Limiter::new(kind, quota, limiter.queue_config());
            if limiter.restore(&snapshot, now, 0).is_err() {
                let _ = limiter.exhaust(now);
            }
        }
        self.algorithm = Some(algorithm);
        true
    }

    /// Takes `cost` from `handle`'s bucket at `now` without asking: a cost learnt once the work
    /// was done (see [`Algorithm::charge`]). A bucket (token bucket, GCRA, leaky bucket) takes
    /// all of it, going up to `max_debt` tokens beyond empty (`u64::MAX`: no cap), and refuses
    /// every offer, a query of cost 0 included, until the refill has paid the debt; a window
    /// takes what it has left. Returns the part of `cost` that was forgiven (0 when all was
    /// taken); `None`: no such limiter.
    ///
    /// # Errors
    ///
    /// [`Busy`] while requests wait: their turns were planned on the bucket before the charge
    /// (withdraw them first, then offer them again, so that they wait for the refill that pays
    /// the debt).
    pub fn charge(
        &mut self,
        handle: u32,
        now: u64,
        cost: u64,
        max_debt: u64,
    ) -> Option<Result<u64, Busy>> {
        if cost == 0 {
            return self.get_mut(handle).map(|_| Ok(0));
        }
        self.settle(handle, now, |algorithm, state| {
            algorithm.charge(state, now, cost, max_debt)
        })
        .map(|r| r.map(|charged| charged.unwrap_or(cost)))
    }

    /// Gives back `cost` admitted `ago` ns before `now` that will never be used (see
    /// [`Algorithm::refund`]): a debt shrinks first, and the bucket never holds more than when
    /// it was full; a window gives it back only if the admission counted in a window it still
    /// holds. `None`: no such limiter.
    ///
    /// # Errors
    ///
    /// [`Busy`] while requests wait (withdraw them first, then offer them again: the head may
    /// go now).
    pub fn refund(
        &mut self,
        handle: u32,
        now: u64,
        cost: u64,
        ago: u64,
    ) -> Option<Result<(), Busy>> {
        if cost == 0 {
            return self.get_mut(handle).map(|_| Ok(()));
        }
        let admitted_at = now.saturating_sub(ago);
        self.settle(handle, now, |algorithm, state| {
            algorithm.refund(state, admitted_at, now, cost);
        })
        .map(|r| r.map(|_| ()))
    }

    /// Runs `f` on the state of `handle`'s bucket as of `now` and puts the result back. The
    /// driven limiter keeps its state to itself; its snapshot, whose times are relative to the
    /// moment it is taken, carries the state out and back exactly (a restore at the same
    /// moment, with no wall-clock time between, rebuilds what was saved). `Ok(None)`: the
    /// bucket could not be carried (a state no snapshot restores), and is left as it was.
    fn settle<R>(
        &mut self,
        handle: u32,
        now: u64,
        f: impl FnOnce(&AnyAlgorithm, &mut sluice_core::AnyState) -> R,
    ) -> Option<Result<Option<R>, Busy>> {
        let cached = self.algorithm;
        let limiter = self.get_mut(handle)?;
        if limiter.queued() > 0 {
            return Some(Err(Busy));
        }
        let algorithm = same_or_new(cached, limiter.kind(), limiter.quota());
        let Ok(mut state) = limiter.snapshot(now, 0).restore(&algorithm, now, 0) else {
            return Some(Ok(None));
        };
        let out = f(&algorithm, &mut state);
        let snapshot = Snapshot::take(&algorithm, &state, now, 0);
        if limiter.restore(&snapshot, now, 0).is_err() {
            return Some(Ok(None));
        }
        self.algorithm = Some(algorithm);
        Some(Ok(Some(out)))
    }

    /// Takes `cost` from `handle`'s bucket if it is there now and nobody waits: an offer that
    /// may not wait. When nothing waits and fewer whole tokens than `cost` are left, it is
    /// refused without the queue's planning (what such an offer comes to, for less work);
    /// `retry_after_ns` is then the wait for one token (exact for a cost of 1). `None`: no such
    /// limiter.
    pub fn try_take(&mut self, handle: u32, now: u64, cost: u64) -> Option<Verdict> {
        let limiter = self.get_mut(handle)?;
        if limiter.queued() == 0 && cost <= limiter.quota().capacity() {
            let status = limiter.status(now);
            if status.remaining < cost {
                return Some(Verdict::Rejected {
                    reason: Reason::Limited,
                    retry_after_ns: status.next_token_ns,
                });
            }
        }
        Some(limiter.offer(now, cost, 0, Priority::Normal, Some(0)))
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

/// `cached` if it is `kind` over `quota`, else that algorithm made afresh (which costs wide
/// divisions).
fn same_or_new(cached: Option<AnyAlgorithm>, kind: Kind, quota: Quota) -> AnyAlgorithm {
    match cached {
        Some(a) if a.which() == kind && a.quota() == quota => a,
        _ => AnyAlgorithm::new(kind, quota),
    }
}

/// The fullest state of `algorithm` at `now` that is idle (full again) no earlier than `until`:
/// an exhausted bucket, aged so that it refills by `until`. The rule of the Rust crate's keyed
/// table for a key it evicted busy (`sluice::keyed`), for `until` earlier than one whole
/// refill after the clock's start.
fn spent_until(algorithm: &AnyAlgorithm, until: u64, now: u64) -> sluice_core::AnyState {
    let span = algorithm
        .idle_at(&algorithm.exhausted_state(now))
        .saturating_sub(now);
    if until >= span {
        return algorithm.exhausted_state(until - span);
    }
    let spent = algorithm.save(&algorithm.exhausted_state(0), 0);
    let since = now.saturating_add(span - until);
    algorithm
        .restore(&spent, now, since)
        .unwrap_or_else(|_| algorithm.exhausted_state(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use sluice_core::driven::{Delivered, Delivery};

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

    fn remaining(bank: &mut Bank, h: u32, now: u64) -> u64 {
        bank.get_mut(h).unwrap().status(now).remaining
    }

    #[test]
    fn reconfigure_converts_and_no_key_gains() {
        let mut bank = Bank::default();
        let h = bank.create(
            Kind::TokenBucket,
            Quota::parse(10, "1/s").unwrap(),
            QueueConfig::NONE,
        );
        let l = bank.get_mut(h).unwrap();
        assert!(matches!(
            l.offer(0, 7, 0, Priority::Normal, None),
            Verdict::Admitted { remaining: 3, .. }
        ));
        // A larger capacity: still 3 left, refilling towards 100 at the new rate.
        let raised = Quota::parse(100, "10/s").unwrap();
        assert_eq!(
            bank.reconfigure(h, 0, Kind::TokenBucket, raised, QueueConfig::NONE),
            Ok(true)
        );
        assert_eq!(remaining(&mut bank, h, 0), 3);
        assert_eq!(remaining(&mut bank, h, SEC), 13);
        // A smaller capacity: at most 2.
        let lowered = Quota::parse(2, "1/s").unwrap();
        bank.reconfigure(h, SEC, Kind::Gcra, lowered, QueueConfig::NONE)
            .unwrap();
        assert_eq!(remaining(&mut bank, h, SEC), 2);
        assert_eq!(bank.get_mut(h).unwrap().kind(), Kind::Gcra);
        // To another family: what was left, at most the new capacity.
        let l = bank.get_mut(h).unwrap();
        assert!(matches!(
            l.offer(SEC, 1, 0, Priority::Normal, None),
            Verdict::Admitted { remaining: 1, .. }
        ));
        let window = Quota::parse(5, "5/s").unwrap();
        bank.reconfigure(h, SEC, Kind::FixedWindow, window, QueueConfig::NONE)
            .unwrap();
        assert_eq!(remaining(&mut bank, h, SEC), 1);
        assert_eq!(
            bank.reconfigure(99, 0, Kind::Gcra, window, QueueConfig::NONE),
            Ok(false)
        );
    }

    #[test]
    fn reconfigure_refuses_while_requests_wait() {
        let mut bank = Bank::default();
        let q = Quota::parse(1, "1/s").unwrap();
        let h = bank.create(Kind::Gcra, q, queue(4, 10 * SEC));
        let l = bank.get_mut(h).unwrap();
        let _ = l.offer(0, 1, 0, Priority::Normal, None);
        let Verdict::Queued { ticket, .. } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!("queued")
        };
        assert_eq!(
            bank.reconfigure(h, 0, Kind::Gcra, q, QueueConfig::NONE),
            Err(Busy)
        );
        assert!(bank.get_mut(h).unwrap().cancel(ticket));
        assert_eq!(
            bank.reconfigure(h, 0, Kind::Gcra, q, QueueConfig::NONE),
            Ok(true)
        );
        assert_eq!(remaining(&mut bank, h, 0), 0);
    }

    #[test]
    fn reset_is_full_again_exactly_then() {
        for kind in Kind::ALL {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "10/s").unwrap(), QueueConfig::NONE);
            let l = bank.get_mut(h).unwrap();
            assert!(matches!(
                l.offer(0, 10, 0, Priority::Normal, None),
                Verdict::Admitted { .. }
            ));
            // Full again at 0.5 s from now (5 s): half the bucket spent.
            let now = 5 * SEC;
            assert!(bank.reset(h, now, now + SEC / 2));
            let st = bank.get_mut(h).unwrap().status(now);
            assert!(
                st.remaining <= 5 && st.reset_after_ns >= SEC / 2 - 1,
                "{kind:?}: {st:?}"
            );
            assert_eq!(
                bank.get_mut(h)
                    .unwrap()
                    .status(now + SEC / 2)
                    .reset_after_ns,
                0,
                "{kind:?}"
            );
            // A time already past: a full bucket, whatever it held.
            let l = bank.get_mut(h).unwrap();
            let _ = l.offer(now, 10, 0, Priority::Normal, None);
            assert!(bank.reset(h, now, now - 1));
            assert_eq!(remaining(&mut bank, h, now), 10);
            // Near the clock's start (a fake clock): the same rule.
            let h = bank.create(kind, Quota::parse(10, "10/s").unwrap(), QueueConfig::NONE);
            assert!(bank.reset(h, 0, SEC / 2));
            assert!(remaining(&mut bank, h, 0) <= 5, "{kind:?}");
            assert_eq!(
                bank.get_mut(h).unwrap().status(SEC / 2).reset_after_ns,
                0,
                "{kind:?}"
            );
            assert!(!bank.reset(99, 0, 0));
        }
    }

    #[test]
    fn try_take_decides_as_an_offer_that_may_not_wait() {
        for kind in Kind::ALL {
            let q = Quota::parse(3, "1/s").unwrap();
            let mut fast = Bank::default();
            let mut slow = Bank::default();
            let (f, s) = (
                fast.create(kind, q, queue(10, SEC)),
                slow.create(kind, q, queue(10, SEC)),
            );
            for step in 0..40u64 {
                let now = step * SEC / 4;
                let cost = 1 + step % 3;
                let a = fast.try_take(f, now, cost).unwrap();
                let b = slow
                    .get_mut(s)
                    .unwrap()
                    .offer(now, cost, 0, Priority::Normal, Some(0));
                let admitted = |v: Verdict| matches!(v, Verdict::Admitted { .. });
                assert_eq!(admitted(a), admitted(b), "{kind:?} at {now}, cost {cost}");
                if cost == 1 {
                    assert_eq!(a, b, "{kind:?} at {now}");
                }
            }
            assert!(matches!(
                fast.try_take(f, 100 * SEC, 4),
                Some(Verdict::Rejected {
                    reason: Reason::TooCostly,
                    ..
                })
            ));
            assert_eq!(fast.try_take(99, 0, 1), None);
        }
    }

    const BUCKETS: [Kind; 3] = [Kind::TokenBucket, Kind::Gcra, Kind::LeakyBucket];
    const WINDOWS: [Kind; 3] = [Kind::SlidingLog, Kind::SlidingWindow, Kind::FixedWindow];

    fn offer_now(bank: &mut Bank, h: u32, now: u64, cost: u64) -> Verdict {
        bank.get_mut(h)
            .unwrap()
            .offer(now, cost, 0, Priority::Normal, Some(0))
    }

    fn limited(retry_after_ns: u64) -> Verdict {
        Verdict::Rejected {
            reason: Reason::Limited,
            retry_after_ns,
        }
    }

    #[test]
    fn a_charge_goes_into_debt_and_the_bucket_refuses_until_the_refill_pays_it() {
        for kind in BUCKETS {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), queue(10, 60 * SEC));
            // 25 on a full bucket of 10: all of it, 15 tokens beyond empty.
            assert_eq!(bank.charge(h, 0, 25, u64::MAX), Some(Ok(0)), "{kind:?}");
            let st = bank.get_mut(h).unwrap().status(0);
            assert_eq!((st.remaining, st.reset_after_ns), (0, 25 * SEC), "{kind:?}");
            // Even a query is refused until the debt is paid; a token comes a second later.
            assert_eq!(offer_now(&mut bank, h, 0, 0), limited(15 * SEC), "{kind:?}");
            assert_eq!(offer_now(&mut bank, h, 0, 1), limited(16 * SEC), "{kind:?}");
            assert_eq!(
                offer_now(&mut bank, h, 15 * SEC, 1),
                limited(SEC),
                "{kind:?}"
            );
            assert!(
                matches!(
                    offer_now(&mut bank, h, 15 * SEC, 0),
                    Verdict::Admitted { .. }
                ),
                "{kind:?}"
            );
            assert!(
                matches!(
                    offer_now(&mut bank, h, 16 * SEC, 1),
                    Verdict::Admitted { remaining: 0, .. }
                ),
                "{kind:?}"
            );
            // A waiter offered on a key in debt is planned after the refill that pays it.
            assert_eq!(bank.charge(h, 16 * SEC, 5, u64::MAX), Some(Ok(0)));
            let l = bank.get_mut(h).unwrap();
            let Verdict::Queued { wait_ns, .. } = l.offer(16 * SEC, 1, 0, Priority::Normal, None)
            else {
                panic!("{kind:?}: queued");
            };
            assert_eq!(wait_ns, 6 * SEC, "{kind:?}");
            assert_eq!(l.poll(21 * SEC), Some(22 * SEC), "{kind:?}");
            assert_eq!(l.poll(22 * SEC), None, "{kind:?}");
            assert_eq!(l.outcomes()[0].delivery, Delivery::Admitted, "{kind:?}");
        }
    }

    #[test]
    fn max_debt_caps_what_a_charge_takes_and_the_rest_is_forgiven() {
        for kind in BUCKETS {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            // The 10 left and 5 beyond empty are taken; 10 forgiven.
            assert_eq!(bank.charge(h, 0, 25, 5), Some(Ok(10)), "{kind:?}");
            assert_eq!(offer_now(&mut bank, h, 0, 1), limited(6 * SEC), "{kind:?}");
            // At the cap already: a further charge takes nothing.
            assert_eq!(bank.charge(h, 0, 3, 5), Some(Ok(3)), "{kind:?}");
            // A second later one token of debt is paid: one more fits.
            assert_eq!(bank.charge(h, SEC, 3, 5), Some(Ok(2)), "{kind:?}");
            // Without debt allowed, a charge takes what is left.
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            assert!(matches!(
                offer_now(&mut bank, h, 0, 3),
                Verdict::Admitted { .. }
            ));
            assert_eq!(bank.charge(h, 0, 20, 0), Some(Ok(13)), "{kind:?}");
            assert_eq!(offer_now(&mut bank, h, 0, 1), limited(SEC), "{kind:?}");
        }
    }

    #[test]
    fn windows_take_what_is_left_and_forgive_the_rest() {
        for kind in WINDOWS {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            assert!(matches!(
                offer_now(&mut bank, h, 0, 4),
                Verdict::Admitted { .. }
            ));
            assert_eq!(bank.charge(h, 0, 25, u64::MAX), Some(Ok(19)), "{kind:?}");
            assert_eq!(remaining(&mut bank, h, 0), 0, "{kind:?}");
            // Nothing left: all forgiven, whatever max_debt allows.
            assert_eq!(bank.charge(h, 0, 7, u64::MAX), Some(Ok(7)), "{kind:?}");
            // No debt carried into the next windows.
            assert_eq!(remaining(&mut bank, h, 100 * SEC), 10, "{kind:?}");
        }
    }

    #[test]
    fn a_refund_shrinks_a_debt_and_never_fills_beyond_full() {
        for kind in BUCKETS {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            assert_eq!(bank.refund(h, 0, 5, 0), Some(Ok(())));
            let st = bank.get_mut(h).unwrap().status(0);
            assert_eq!(
                (st.remaining, st.reset_after_ns),
                (10, 0),
                "{kind:?}: full stays full"
            );
            assert_eq!(bank.charge(h, 0, 15, u64::MAX), Some(Ok(0)));
            assert_eq!(bank.refund(h, 0, 3, 0), Some(Ok(())));
            assert_eq!(offer_now(&mut bank, h, 0, 1), limited(3 * SEC), "{kind:?}");
            // One refund gives back at most the capacity: 12 owed, 10 back, 8 left.
            assert_eq!(bank.refund(h, 0, 100, 0), Some(Ok(())));
            assert_eq!(remaining(&mut bank, h, 0), 8, "{kind:?}");
            assert_eq!(bank.refund(h, 0, 100, 0), Some(Ok(())));
            let st = bank.get_mut(h).unwrap().status(0);
            assert_eq!((st.remaining, st.reset_after_ns), (10, 0), "{kind:?}");
        }
        for kind in WINDOWS {
            let mut bank = Bank::default();
            let h = bank.create(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            let _ = offer_now(&mut bank, h, 0, 6);
            assert_eq!(bank.refund(h, SEC, 4, SEC), Some(Ok(())));
            assert_eq!(remaining(&mut bank, h, SEC), 8, "{kind:?}");
            assert_eq!(bank.refund(h, SEC, 100, SEC), Some(Ok(())));
            assert_eq!(remaining(&mut bank, h, SEC), 10, "{kind:?}");
        }
    }

    #[test]
    fn charge_and_refund_are_refused_while_requests_wait() {
        let mut bank = Bank::default();
        let h = bank.create(
            Kind::Gcra,
            Quota::parse(1, "1/s").unwrap(),
            queue(4, 10 * SEC),
        );
        let l = bank.get_mut(h).unwrap();
        let _ = l.offer(0, 1, 0, Priority::Normal, None);
        let Verdict::Queued { ticket, .. } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!("queued")
        };
        assert_eq!(bank.charge(h, 0, 3, u64::MAX), Some(Err(Busy)));
        assert_eq!(bank.refund(h, 0, 1, 0), Some(Err(Busy)));
        assert!(bank.get_mut(h).unwrap().cancel(ticket));
        assert_eq!(bank.charge(h, 0, 3, u64::MAX), Some(Ok(0)));
        assert_eq!(bank.charge(99, 0, 3, u64::MAX), None);
        assert_eq!(bank.refund(99, 0, 3, 0), None);
        // A charge of nothing takes nothing.
        assert_eq!(bank.charge(h, 0, 0, 0), Some(Ok(0)));
    }

    /// A small deterministic generator (xorshift64*), for the model test below.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn charges_through_the_bank_are_the_cores_step_for_step() {
        // The bank carries the bucket out of the driven limiter and back for each charge and
        // refund: every decision after them must be the one sluice-core's own step makes on a
        // state it holds itself.
        for kind in Kind::ALL {
            let quota = Quota::parse(8, "4/s").unwrap();
            let core = AnyAlgorithm::new(kind, quota);
            let mut state = core.initial_state();
            let mut bank = Bank::default();
            let h = bank.create(kind, quota, QueueConfig::NONE);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ kind as u64);
            let mut now = 0;
            for step in 0..3000 {
                now += rng.below(SEC / 2);
                let what = format!("{kind:?}, step {step}, at {now}");
                match rng.below(4) {
                    0 | 1 => {
                        let cost = rng.below(9);
                        let d = core.check(&mut state, now, cost).unwrap();
                        let v = offer_now(&mut bank, h, now, cost);
                        assert_eq!(
                            matches!(v, Verdict::Admitted { .. }),
                            d.allowed,
                            "{what}: {v:?} {d:?}"
                        );
                    }
                    2 => {
                        let cost = rng.below(41);
                        let max_debt = [0, 3, 20, u64::MAX][rng.below(4) as usize];
                        let forgiven = core.charge(&mut state, now, cost, max_debt);
                        assert_eq!(
                            bank.charge(h, now, cost, max_debt),
                            Some(Ok(forgiven)),
                            "{what}"
                        );
                    }
                    _ => {
                        let cost = rng.below(12);
                        let ago = rng.below(3 * SEC);
                        core.refund(&mut state, now.saturating_sub(ago), now, cost);
                        assert_eq!(bank.refund(h, now, cost, ago), Some(Ok(())), "{what}");
                    }
                }
                let d = core.check(&mut state.clone(), now, 0).unwrap();
                let st = bank.get_mut(h).unwrap().status(now);
                assert_eq!(
                    (st.remaining, st.reset_after_ns),
                    (d.remaining, d.reset_after_ns),
                    "{what}"
                );
            }
        }
    }
}
