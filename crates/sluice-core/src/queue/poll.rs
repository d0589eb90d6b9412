//! Serving: [`WaitQueue::poll`] admits the waiters whose tokens are there at `now`, in service
//! order, times out those past their deadline, and says when to poll next; and it keeps the
//! deadlines and the levels' bookkeeping from outgrowing the waiters.
//!
//! Admits no newcomer (that is the door's) and predicts nothing itself: the waits it reports
//! come from `predict`.

use alloc::collections::{BTreeMap, BinaryHeap};
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::algorithm::Algorithm;
use crate::queue::predict::{same_state, simulate_one};
use crate::queue::{Outcome, Priority, StateAccess, Ticket, WaitQueue};

impl<S: Clone, P: Default> WaitQueue<S, P> {
    /// Admits the waiters whose turn has come, times out those past their deadline, and
    /// returns when to poll next (`None`: nothing waits). Each outcome is passed to `emit`.
    pub fn poll<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        mut emit: F,
    ) -> Option<u64>
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome),
    {
        self.poll_timed(algorithm, cell, now, |t, o, _, _| emit(t, o))
    }

    /// [`WaitQueue::poll`], handing back each finished waiter's payload and the moment its
    /// outcome took effect.
    ///
    /// Every outcome takes effect at `now`, the moment the caller hands it over, and each
    /// admission is checked against what the limiter holds at `now`. A caller whose timer
    /// fired late therefore gets no more than the limiter holds then (at most its capacity);
    /// the waiters whose turns went by follow one by one at the limiter's rate. So the
    /// admissions handed over stay within capacity + rate·T in every window of length T,
    /// whatever the timer does; the price of a late timer is throughput, never the bound.
    /// The moment is what [`Algorithm::refund`] needs if the admission is handed back.
    ///
    /// Deadlines: the head is admitted whenever the limiter holds its cost at `now`, even if
    /// its deadline went by while the timer was late (a turn due at the deadline itself is
    /// not lost to a timer that fires a little after it); a waiter that cannot be admitted
    /// at `now` and whose deadline is `now` or earlier times out.
    pub fn poll_timed<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        mut emit: F,
    ) -> Option<u64>
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        let mut admit_at = None;
        while let Some((level, id)) = self.head() {
            let (cost, flow, deadline, predicted) = {
                let w = &self.levels[level].waiters[&id];
                (w.cost, w.flow, w.deadline, w.predicted)
            };
            // Late for its turn with a schedule cached: the state before, to tell whether the
            // schedule still holds after this admission.
            let before = (predicted < now && self.tail.is_some()).then(|| cell.load());
            // Checked at `now`, never at the earlier moment its turn came: a late poll finds
            // only what the limiter holds now, so it cannot release a burst.
            let outcome = match cell.check(algorithm, now, cost) {
                Ok(decision) if decision.allowed => Outcome::Admitted(decision),
                Ok(_) if now > deadline => {
                    // No token for it and its deadline went by: it waits no longer.
                    self.expire_one(algorithm, cell, now, level, id, &mut emit);
                    continue;
                }
                Ok(decision) => {
                    admit_at = Some(now.saturating_add(decision.retry_after_ns.max(1)));
                    break;
                }
                // Unreachable for costs checked at the door; never leave it stuck.
                Err(_) => Outcome::Closed,
            };
            let popped = self.levels[level].pop_head(id);
            self.len -= 1;
            // The cached schedule holds if this admission left the state its turn would have.
            let as_scheduled = predicted == now
                || before.is_some_and(|mut state| {
                    algorithm
                        .check(&mut state, predicted, cost)
                        .is_ok_and(|d| d.allowed)
                        && same_state::<A>(&state, &cell.load())
                });
            if !as_scheduled || self.len == 0 || !matches!(outcome, Outcome::Admitted(_)) {
                self.tail = None;
            }
            if let Some(w) = popped {
                emit(Ticket { id, flow }, outcome, w.payload, now);
            }
        }
        self.expire(algorithm, cell, now.saturating_add(1), &mut emit);
        self.compact();
        if self.len == 0 {
            return None;
        }
        let deadline = self.next_deadline();
        match (admit_at, deadline) {
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        }
    }

    /// Times out every waiter whose deadline is before `cutoff`.
    fn expire<A, C, F>(&mut self, algorithm: &A, cell: &C, cutoff: u64, emit: &mut F)
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        let now = cutoff.saturating_sub(1);
        let mut expired = Vec::new();
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if deadline >= cutoff {
                break;
            }
            self.deadlines.pop();
            let level = &self.levels[Priority::from_index(id & 3).index()];
            if let Some(w) = level.waiters.get(&id) {
                if w.deadline == deadline {
                    expired.push(Ticket { id, flow: w.flow });
                }
            }
        }
        if expired.is_empty() {
            return;
        }
        // Tell each how much longer it would have waited: replay the queue once.
        let mut predicted = BTreeMap::new();
        self.replay(algorithm, cell.load(), now, |id, at| {
            predicted.insert(id, at);
        });
        for ticket in expired {
            if let Some(w) = self.remove(ticket) {
                let retry_after_ns = predicted.get(&ticket.id).map_or(0, |at| at - now);
                emit(ticket, Outcome::TimedOut { retry_after_ns }, w.payload, now);
            }
        }
        self.tail = None;
    }

    /// Times out the head `id` of `level`, whose deadline has passed.
    fn expire_one<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        level: usize,
        id: u64,
        emit: &mut F,
    ) where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        if let Some(w) = self.levels[level].pop_head(id) {
            self.len -= 1;
            self.tail = None;
            let mut state = cell.load();
            let retry_after_ns = simulate_one(algorithm, &mut state, now, w.cost) - now;
            emit(
                Ticket { id, flow: w.flow },
                Outcome::TimedOut { retry_after_ns },
                w.payload,
                now,
            );
        }
    }

    fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            let level = &self.levels[Priority::from_index(id & 3).index()];
            match level.waiters.get(&id) {
                Some(w) if w.deadline == deadline => return Some(deadline),
                _ => {
                    self.deadlines.pop();
                }
            }
        }
        None
    }

    /// Drops the bookkeeping of waiters that left, once it outweighs the live entries.
    fn compact(&mut self) {
        if self.deadlines.len() > 2 * self.len + 64 {
            let mut live = Vec::with_capacity(self.len);
            for level in &self.levels {
                for (&id, w) in &level.waiters {
                    live.push(Reverse((w.deadline, id)));
                }
            }
            self.deadlines = BinaryHeap::from(live);
        }
        for level in &mut self.levels {
            level.compact();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::queue::test_support::{cfg, run_until, tiny, S};
    use crate::queue::{Offer, Outcome, Owned, Priority, WaitQueue};
    use crate::{Algorithm, Gcra, Quota, TokenBucket};
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn deadline_enforced_when_the_schedule_slips() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 2));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let Offer::Queued { ticket: low, .. } =
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Low, 0)
        else {
            panic!()
        };
        // Two high-priority arrivals push the low one past its 2 s deadline.
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        let out = run_until(&mut q, &alg, &mut st, 0, 10 * S);
        let (at, t, o) = out.iter().find(|(_, t, _)| *t == low).copied().unwrap();
        assert_eq!(t, low);
        assert_eq!(at, 2 * S);
        assert!(matches!(o, Outcome::TimedOut { retry_after_ns } if retry_after_ns == S));
        let highs: Vec<_> = out
            .iter()
            .filter(|(_, t, _)| t.priority() == Priority::High)
            .map(|x| x.0)
            .collect();
        assert_eq!(highs, vec![S, 2 * S]);
    }

    /// Panics unless every window `[times[i], times[j]]` holds at most `capacity` plus the
    /// tokens one per `interval` adds over its length.
    fn assert_within_bound(times: &[u64], capacity: u64, interval: u64) {
        for i in 0..times.len() {
            for j in i..times.len() {
                let count = (j - i + 1) as u64;
                let span = times[j] - times[i];
                assert!(
                    count <= capacity || (count - capacity) * interval <= span,
                    "{count} admissions within {span} ns: above {capacity} + rate·T ({times:?})"
                );
            }
        }
    }

    #[test]
    fn a_late_poll_admits_only_what_the_bucket_holds_at_now() {
        // One token per millisecond, capacity 1, 31 waiters behind a spent bucket: a timer
        // that fires 20 ms late finds one token, not the twenty whose turns went by.
        const MS: u64 = 1_000_000;
        let alg = Gcra::new(Quota::new(1, crate::Rate::from_interval_ns(MS).unwrap()).unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(100, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let mut tickets = Vec::new();
        for _ in 0..30 {
            if let Offer::Queued { ticket, .. } =
                q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0)
            {
                tickets.push(ticket);
            }
        }
        let mut out = Vec::new();
        let wake = q.poll_timed(&alg, &mut Owned(&mut st), 20 * MS, |t, o, _, at| {
            assert!(matches!(o, Outcome::Admitted(_)));
            out.push((at, t));
        });
        assert_eq!(out, vec![(20 * MS, tickets[0])]);
        assert_eq!(wake, Some(21 * MS));
        assert_eq!(q.len(), 29);
        // From then on one per millisecond, in arrival order, within the bound throughout.
        out.extend(
            run_until(&mut q, &alg, &mut st, 21 * MS, 100 * MS)
                .into_iter()
                .map(|(at, t, _)| (at, t)),
        );
        let times: Vec<u64> = out.iter().map(|&(at, _)| at).collect();
        assert_eq!(times, (20..50).map(|k| k * MS).collect::<Vec<_>>());
        assert_eq!(out.iter().map(|&(_, t)| t).collect::<Vec<_>>(), tickets);
        assert_within_bound(&times, 1, MS);
    }

    #[test]
    fn polls_late_by_any_amount_stay_within_capacity_plus_rate() {
        // Capacity 3, one token per 10 ms; the caller polls at its own pace, often long after
        // the wake it was asked for. Whatever the lateness, the admissions it hands over never
        // exceed capacity + rate·T in any window.
        const MS: u64 = 1_000_000;
        let alg = TokenBucket::new(
            Quota::new(3, crate::Rate::from_interval_ns(10 * MS).unwrap()).unwrap(),
        );
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1000, 100));
        let mut times = Vec::new();
        let mut now = 0;
        for step in 0..200u64 {
            for _ in 0..step % 7 {
                if let Offer::Admitted(_) = q.offer(
                    &alg,
                    &mut Owned(&mut st),
                    now,
                    1,
                    Priority::Normal,
                    step % 2,
                ) {
                    times.push(now);
                }
            }
            // The caller hands each admission over when the poll returns: at `now`.
            let wake = q.poll_timed(&alg, &mut Owned(&mut st), now, |_, o, _, at| {
                assert!(at <= now);
                if let Outcome::Admitted(_) = o {
                    times.push(now);
                }
            });
            // Late by 0 to 57 ms, in a fixed irregular pattern.
            let late = (step * 37 % 58) * MS;
            now = wake.unwrap_or(now + MS).max(now + 1) + late;
        }
        assert!(times.len() > 100, "{}", times.len());
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert_within_bound(&times, 3, 10 * MS);
    }

    #[test]
    fn a_late_poll_still_admits_a_head_past_its_deadline_if_the_tokens_are_there() {
        // Capacity 1, one token per 10 ns: the waiter's turn (10) is its deadline (10). A
        // poll at 12 finds the token: admitted. The next waiter (deadline 20; its turn is now
        // 22, after that late admission) gets no token at 21 and times out.
        let alg = tiny(1);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 0));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let Offer::Queued { ticket: a, .. } =
            q.offer_with_max_wait(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0, 10)
        else {
            panic!()
        };
        let Offer::Queued { ticket: b, .. } =
            q.offer_with_max_wait(&alg, &mut Owned(&mut st), 5, 1, Priority::Normal, 0, 15)
        else {
            panic!()
        };
        let mut out = Vec::new();
        q.poll(&alg, &mut Owned(&mut st), 12, |t, o| out.push((t, o)));
        assert!(
            matches!(out[..], [(t, Outcome::Admitted(_))] if t == a),
            "{out:?}"
        );
        out.clear();
        q.poll(&alg, &mut Owned(&mut st), 21, |t, o| out.push((t, o)));
        assert!(
            matches!(out[..], [(t, Outcome::TimedOut { retry_after_ns: 1 })] if t == b),
            "{out:?}"
        );
    }
}
