//! Predictions: when a waiter or a newcomer would be admitted, found by replaying the queue in
//! service order on a copy of the limiter state; the state after the last waiter is cached as
//! the tail, so that a newcomer served last costs one check instead of a replay.
//!
//! Reads the live state and never changes it; writes only the waiters' predicted times and the
//! cached tail. Whoever changes the state or the order behind its back drops the tail.

use alloc::vec::Vec;

use crate::algorithm::Algorithm;
use crate::queue::{Priority, StateAccess, Ticket, WaitQueue};

/// The prediction for the request that would be served last, kept so that appending to a
/// single-flow queue costs O(1) instead of a replay.
#[derive(Debug, Clone)]
pub(super) struct Tail<S> {
    state: S,
    at: u64,
}

impl<S: Clone, P: Default> WaitQueue<S, P> {
    /// Whether `ticket` will be served after every current waiter, so the cached tail applies.
    fn is_last_in_service(&self, ticket: Ticket) -> bool {
        self.would_be_last(ticket.priority(), ticket.flow)
    }

    /// Whether a request of `priority` and `flow` would be served after every current waiter.
    fn would_be_last(&self, priority: Priority, flow: u64) -> bool {
        let p = priority.index();
        let lower_empty = self.levels[p + 1..].iter().all(|l| l.waiters.is_empty());
        lower_empty && self.levels[p].flows.keys().all(|&f| f == flow)
    }

    /// Replays the queue from `now`, records every waiter's predicted admission and caches
    /// the state after everyone as the tail.
    fn schedule<A, C>(&mut self, algorithm: &A, cell: &C, now: u64)
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        let mut schedule = Vec::with_capacity(self.len);
        let (state, at) = self.replay(algorithm, cell.load(), now, |id, at| {
            schedule.push((id, at));
        });
        for (id, at) in schedule {
            let level = &mut self.levels[Priority::from_index(id & 3).index()];
            if let Some(w) = level.waiters.get_mut(&id) {
                w.predicted = at;
            }
        }
        // What a newcomer served last starts from.
        self.tail = Some(Tail { state, at });
    }

    /// Predicted admission time of the (already inserted) `ticket`. With `keep`, a replay of
    /// the queue also records every waiter's predicted admission (the ticket stays).
    pub(super) fn predict<A, C>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        ticket: Ticket,
        keep: bool,
    ) -> u64
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        let cost = self.levels[ticket.priority().index()].waiters[&ticket.id].cost;
        if self.len > 1
            && self.tail.is_some()
            && self.is_last_in_service(ticket)
            && self.on_schedule(algorithm, cell, now)
        {
            if let Some(tail) = &mut self.tail {
                let at = simulate_one(algorithm, &mut tail.state, tail.at.max(now), cost);
                tail.at = at;
                return at;
            }
        }
        if keep {
            self.schedule(algorithm, cell, now);
            return self.levels[ticket.priority().index()].waiters[&ticket.id].predicted;
        }
        let mut found = now;
        self.replay(algorithm, cell.load(), now, |id, at| {
            if id == ticket.id {
                found = at;
            }
        });
        found
    }

    /// Whether the cached tail is what a replay of the queue from `now` would give.
    ///
    /// While a tail is cached, every waiter's `predicted` is exact and they rise in service
    /// order. If the head's has not gone by, a replay from `now` gives every waiter the time
    /// it gave them (none could have gone earlier). If some are overdue (their turn came and
    /// nobody polled yet), a replay admits those at `now` or later instead: the tail still
    /// holds if that leaves the limiter in the state their turns would have, and the first
    /// waiter on schedule can still go at its time. Only the overdue ones are replayed.
    fn on_schedule<A, C>(&mut self, algorithm: &A, cell: &C, now: u64) -> bool
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        match self.head() {
            Some((level, id)) if self.levels[level].waiters[&id].predicted < now => {}
            _ => return true,
        }
        let mut overdue = Vec::new();
        let mut next = None;
        for level in &self.levels {
            let stopped = level.service_order_while(|id| {
                let w = &level.waiters[&id];
                if w.predicted < now {
                    overdue.push((w.predicted, w.cost));
                    true
                } else {
                    next = Some(w.predicted);
                    false
                }
            });
            if stopped {
                break;
            }
        }
        let Some(next) = next else {
            return false;
        };
        let mut on_time = cell.load();
        let mut late = on_time.clone();
        let mut at = now;
        for (predicted, cost) in overdue {
            if !algorithm
                .check(&mut on_time, predicted, cost)
                .is_ok_and(|d| d.allowed)
            {
                return false;
            }
            at = simulate_one(algorithm, &mut late, at, cost);
        }
        same_state::<A>(&on_time, &late) && at <= next
    }

    /// Predicted nanoseconds until a request of `cost` could be admitted, as if offered now.
    /// Zero when it would be admitted at once.
    pub fn peek_wait<A, C>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        cost: u64,
        priority: Priority,
        flow: u64,
    ) -> u64
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        if !self.is_empty()
            && self.would_be_last(priority, flow)
            && !(self.tail.is_some() && self.on_schedule(algorithm, cell, now))
        {
            // The queue's own schedule, kept: a newcomer served last is then predicted from
            // its tail, and so are the next ones (a full queue answers every newcomer here).
            self.schedule(algorithm, cell, now);
        }
        let saved_tail = self.tail.clone();
        let ticket = self.insert(now, cost, priority, flow, u64::MAX);
        let at = self.predict(algorithm, cell, now, ticket, false);
        // The latest arrival leaves no trace when it goes.
        self.remove(ticket);
        self.tail = saved_tail;
        at - now
    }

    /// Replays every waiter in service order on `state` from `now`, telling `each` when it
    /// would be admitted; returns the state after everyone and the last admission time.
    pub(super) fn replay<A>(
        &self,
        algorithm: &A,
        mut state: S,
        now: u64,
        mut each: impl FnMut(u64, u64),
    ) -> (S, u64)
    where
        A: Algorithm<State = S>,
    {
        let mut order = Vec::with_capacity(self.len);
        for level in &self.levels {
            level.service_order(&mut order);
        }
        let mut at = now;
        for id in order {
            let w = &self.levels[Priority::from_index(id & 3).index()].waiters[&id];
            at = simulate_one(algorithm, &mut state, at, w.cost);
            each(id, at);
        }
        (state, at)
    }
}

/// Whether two states of `A` are equal (`A::State: PartialEq`, which a bound on `S` alone would
/// not carry).
pub(super) fn same_state<A: Algorithm>(a: &A::State, b: &A::State) -> bool {
    a == b
}

/// Advances a copy of the state to the moment `cost` is admitted at or after `at`, admits it
/// there, and returns that moment.
pub(super) fn simulate_one<A: Algorithm>(
    algorithm: &A,
    state: &mut A::State,
    at: u64,
    cost: u64,
) -> u64 {
    let mut t = at;
    // Each algorithm's retry_after is exact, so the second check admits; the bound only
    // guards against a state shared with someone else.
    for _ in 0..8 {
        match algorithm.check(state, t, cost) {
            Ok(d) if d.allowed => return t,
            Ok(d) => t = t.saturating_add(d.retry_after_ns.max(1)),
            Err(_) => return t,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use crate::decision::Decision;
    use crate::error::CheckError;
    use crate::queue::test_support::{cfg, run_until, tiny, S};
    use crate::queue::{
        Offer, Outcome, Owned, Priority, QueueConfig, Rejection, Ticket, WaitQueue,
    };
    use crate::{Algorithm, Gcra, Quota, SlidingLog, TokenBucket};
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn fifo_and_exact_admission_times() {
        let alg = TokenBucket::new(Quota::parse(2, "2/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 10));
        let mut tickets = vec![];
        for _ in 0..6 {
            match q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0) {
                Offer::Admitted(_) => {}
                Offer::Queued { ticket, wait_ns } => tickets.push((ticket, wait_ns)),
                Offer::Rejected(r) => panic!("{r:?}"),
            }
        }
        assert_eq!(tickets.len(), 4);
        let waits: Vec<u64> = tickets.iter().map(|t| t.1).collect();
        assert_eq!(waits, vec![S / 2, S, 3 * S / 2, 2 * S]);
        let out = run_until(&mut q, &alg, &mut st, 0, 10 * S);
        let got: Vec<(u64, Ticket)> = out.iter().map(|&(at, t, _)| (at, t)).collect();
        let want: Vec<(u64, Ticket)> = tickets.iter().map(|&(t, w)| (w, t)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn sliding_log_queue_is_exact() {
        let alg = SlidingLog::new(Quota::parse(3, "1/s").unwrap()); // 3 per 3 s
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 10));
        let mut waits = vec![];
        for i in 0..7u64 {
            if let Offer::Queued { wait_ns, .. } = q.offer(
                &alg,
                &mut Owned(&mut st),
                i * 100_000_000,
                1,
                Priority::Normal,
                0,
            ) {
                waits.push(i * 100_000_000 + wait_ns);
            }
        }
        assert_eq!(
            waits,
            vec![3 * S, 3 * S + 100_000_000, 3 * S + 200_000_000, 6 * S]
        );
        let out = run_until(&mut q, &alg, &mut st, 700_000_000, 100 * S);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, waits);
    }

    #[test]
    fn predictions_start_from_now_when_the_head_is_overdue() {
        // Capacity 3: a waiter of cost 3 is due at 10; nobody polls until 11. A newcomer's
        // prediction replays the queue from 11 (the waiter goes at 11, then the newcomer at
        // 21), not from the schedule made at 0.
        let alg = tiny(3);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 3, Priority::High, 0),
            Offer::Queued { wait_ns: 10, .. }
        ));
        assert_eq!(
            q.peek_wait(&alg, &Owned(&mut st), 11, 1, Priority::Normal, 0),
            10
        );
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 11, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::QueueFull { retry_after_ns: 10 })
        ));
    }

    /// GCRA that counts its checks, to measure the work a queue operation does.
    #[derive(Debug)]
    struct Counting {
        gcra: Gcra,
        checks: core::cell::Cell<u64>,
    }

    impl Algorithm for Counting {
        type State = u64;
        fn kind(&self) -> crate::Kind {
            self.gcra.kind()
        }
        fn quota(&self) -> Quota {
            self.gcra.quota()
        }
        fn initial_state(&self) -> u64 {
            self.gcra.initial_state()
        }
        fn exhausted_state(&self, now: u64) -> u64 {
            self.gcra.exhausted_state(now)
        }
        fn check(&self, state: &mut u64, now: u64, cost: u64) -> Result<Decision, CheckError> {
            self.checks.set(self.checks.get() + 1);
            self.gcra.check(state, now, cost)
        }
        fn refund(&self, state: &mut u64, admitted_at: u64, now: u64, cost: u64) {
            self.gcra.refund(state, admitted_at, now, cost)
        }
        fn charge(&self, state: &mut u64, now: u64, cost: u64, max_debt: u64) -> u64 {
            self.gcra.charge(state, now, cost, max_debt)
        }
        fn idle_at(&self, state: &u64) -> u64 {
            self.gcra.idle_at(state)
        }
        fn save(&self, state: &u64, now: u64) -> crate::SavedState {
            self.gcra.save(state, now)
        }
        fn restore(
            &self,
            saved: &crate::SavedState,
            now: u64,
            elapsed_ns: u64,
        ) -> Result<u64, crate::SnapshotError> {
            self.gcra.restore(saved, now, elapsed_ns)
        }
    }

    #[test]
    fn a_full_queue_polled_late_answers_newcomers_without_replaying_it() {
        // Capacity 4, a token per 10 ns, 1,000 waiters in one flow: the queue is full. The
        // poller is 3 ns late for every turn (less than the bucket's slack of three tokens, so
        // each late admission leaves the state its turn would have). Around each poll, two
        // newcomers are turned away (one while the head is overdue) and one takes the place
        // the poll freed. Each answer comes from the cached tail: a few checks, not a replay
        // of 1,000 waiters.
        const N: usize = 1000;
        let alg = Counting {
            gcra: tiny(4),
            checks: core::cell::Cell::new(0),
        };
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(QueueConfig {
            depth: N,
            max_wait_ns: u64::MAX,
        });
        q.offer(&alg, &mut Owned(&mut st), 0, 4, Priority::Normal, 0);
        for _ in 0..N {
            assert!(matches!(
                q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
                Offer::Queued { .. }
            ));
        }
        let mut wake = q.poll(&alg, &mut Owned(&mut st), 0, |_, _| {}).unwrap();
        alg.checks.set(0);
        for _ in 0..N {
            for at in [wake - 1, wake + 1] {
                assert!(matches!(
                    q.offer(&alg, &mut Owned(&mut st), at, 1, Priority::Normal, 0),
                    Offer::Rejected(Rejection::QueueFull { .. })
                ));
            }
            let now = wake + 3;
            let mut admitted = 0;
            wake = q
                .poll(&alg, &mut Owned(&mut st), now, |_, o| {
                    assert!(matches!(o, Outcome::Admitted(_)));
                    admitted += 1;
                })
                .unwrap();
            assert_eq!(admitted, 1);
            assert!(matches!(
                q.offer(&alg, &mut Owned(&mut st), now, 1, Priority::Normal, 0),
                Offer::Queued { .. }
            ));
        }
        let per_step = alg.checks.get() / N as u64;
        assert!(
            per_step <= 20,
            "{per_step} checks per poll and three newcomers"
        );
    }
}
