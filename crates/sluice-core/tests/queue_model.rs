//! A state-machine model test of [`WaitQueue`] against a plain reference model.
//!
//! The model keeps the waiters in vectors, one per priority, and the flows' turns in a list
//! per priority; it spends tokens through the same GCRA step on a state of its own. Random
//! sequences of offers, polls (on time or late), cancellations, predictions, clock moves and a
//! close run on both, and every answer must agree: who is admitted, timed out or closed, in
//! which order, with which decision and predicted wait, and when to poll next. After every
//! step the queue's length per priority and the limiter state must equal the model's, so a
//! cancel, an expiry or a close never loses or mints a token. Independently of the model, the
//! admissions of each priority and flow go in arrival order and every window of length T
//! holds at most capacity + rate·T.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use sluice_core::queue::{
    Offer, Outcome, Owned, Priority, QueueConfig, Rejection, Ticket, WaitQueue,
};
use sluice_core::{Algorithm, Decision, Gcra, Quota, Rate};

/// Nanoseconds between tokens.
const INTERVAL: u64 = 10;

const PRIORITIES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

fn level(priority: Priority) -> usize {
    PRIORITIES.iter().position(|&p| p == priority).unwrap()
}

fn gcra(capacity: u64) -> Gcra {
    Gcra::new(Quota::new(capacity, Rate::from_interval_ns(INTERVAL).unwrap()).unwrap())
}

/// The limits of one test case.
#[derive(Clone, Debug)]
struct Setup {
    capacity: u64,
    depth: usize,
    max_wait: u64,
}

#[derive(Clone, Debug)]
enum Step {
    /// An offer at the current time; `max_wait: None` uses the queue's own.
    Offer {
        cost: u64,
        priority: Priority,
        flow: u64,
        max_wait: Option<u64>,
    },
    /// The predicted wait of a newcomer, which must leave no trace.
    Peek {
        cost: u64,
        priority: Priority,
        flow: u64,
    },
    /// The clock moves on; nobody polls (so the next poll may be late).
    Advance(u64),
    Poll,
    /// Cancels the ticket issued `n`-th (modulo the tickets issued so far), waiting or not.
    Cancel(usize),
    Close,
}

/// What an offer should answer (a ticket's id is the queue's business).
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Admitted(Decision),
    Queued { wait_ns: u64 },
    Rejected(Rejection),
}

/// What the last step should have produced.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Nothing,
    Offer(Answer),
    Peek(u64),
    /// Outcomes by ticket number, in the order given, and when to poll next.
    Poll(Vec<(usize, Outcome)>, Option<u64>),
    Cancel(bool),
    Close(Vec<usize>),
}

#[derive(Clone, Debug)]
struct Waiter {
    /// Ticket number: the order of arrival among tickets.
    number: usize,
    cost: u64,
    flow: u64,
    deadline: u64,
}

#[derive(Clone, Debug)]
struct Model {
    setup: Setup,
    now: u64,
    /// The model's own GCRA state.
    tat: u64,
    /// Live waiters per priority, in arrival order.
    waiting: [Vec<Waiter>; 3],
    /// Per priority, the flows with live waiters, in the order they take turns. A flow joins
    /// at the back when it gets its first waiter and leaves when it has none.
    turns: [VecDeque<u64>; 3],
    closed: bool,
    /// Tickets issued so far.
    issued: usize,
    expect: Expect,
}

impl Model {
    fn gcra(&self) -> Gcra {
        gcra(self.setup.capacity)
    }

    fn len(&self) -> usize {
        self.waiting.iter().map(Vec::len).sum()
    }

    /// The waiters in the order they will be served: priority first; inside a priority the
    /// flows take turns one request each; inside a flow, arrival order. `extra` is a newcomer
    /// appended to its priority and flow.
    fn service_order(&self, extra: Option<(usize, Waiter)>) -> Vec<Waiter> {
        let mut order = Vec::new();
        for p in 0..3 {
            let mut waiting = self.waiting[p].clone();
            let mut turns = self.turns[p].clone();
            if let Some((ep, w)) = &extra {
                if *ep == p {
                    if !turns.contains(&w.flow) {
                        turns.push_back(w.flow);
                    }
                    waiting.push(w.clone());
                }
            }
            let per_flow: Vec<Vec<Waiter>> = turns
                .iter()
                .map(|&f| waiting.iter().filter(|w| w.flow == f).cloned().collect())
                .collect();
            let rounds = per_flow.iter().map(Vec::len).max().unwrap_or(0);
            for round in 0..rounds {
                for ws in &per_flow {
                    if let Some(w) = ws.get(round) {
                        order.push(w.clone());
                    }
                }
            }
        }
        order
    }

    /// When a request of `cost` is admitted at or after `at` on `state`, which it then spends.
    fn admit_on(&self, state: &mut u64, at: u64, cost: u64) -> u64 {
        let mut t = at;
        loop {
            let d = self.gcra().check(state, t, cost).unwrap();
            if d.allowed {
                return t;
            }
            t += d.retry_after_ns.max(1);
        }
    }

    /// Each waiter's predicted admission (by ticket number, `usize::MAX` for the newcomer).
    fn predict(&self, extra: Option<(usize, Waiter)>) -> BTreeMap<usize, u64> {
        let mut state = self.tat;
        let mut at = self.now;
        let mut out = BTreeMap::new();
        for w in self.service_order(extra) {
            at = self.admit_on(&mut state, at, w.cost);
            out.insert(w.number, at);
        }
        out
    }

    fn newcomer_wait(&self, cost: u64, priority: Priority, flow: u64) -> u64 {
        let w = Waiter {
            number: usize::MAX,
            cost,
            flow,
            deadline: u64::MAX,
        };
        self.predict(Some((level(priority), w)))[&usize::MAX] - self.now
    }

    /// Removes a waiter that is not being served; its flow leaves the turns if now empty.
    fn remove(&mut self, p: usize, number: usize) -> Option<Waiter> {
        let i = self.waiting[p].iter().position(|w| w.number == number)?;
        let w = self.waiting[p].remove(i);
        if !self.waiting[p].iter().any(|x| x.flow == w.flow) {
            self.turns[p].retain(|&f| f != w.flow);
        }
        Some(w)
    }

    /// The head: the first waiter of the flow whose turn it is, at the highest priority.
    fn head(&self) -> Option<(usize, Waiter)> {
        (0..3).find_map(|p| {
            let flow = *self.turns[p].front()?;
            let w = self.waiting[p].iter().find(|w| w.flow == flow)?;
            Some((p, w.clone()))
        })
    }

    /// Removes the head, passing the turn to the next flow.
    fn pop_head(&mut self, p: usize, number: usize) {
        let i = self.waiting[p]
            .iter()
            .position(|w| w.number == number)
            .unwrap();
        let w = self.waiting[p].remove(i);
        let flow = self.turns[p].pop_front().unwrap();
        assert_eq!(flow, w.flow, "model: the head's flow has the turn");
        if self.waiting[p].iter().any(|x| x.flow == flow) {
            self.turns[p].push_back(flow);
        }
    }

    fn offer(&mut self, cost: u64, priority: Priority, flow: u64, max_wait: u64) -> Answer {
        let capacity = self.setup.capacity;
        if self.closed {
            return Answer::Rejected(Rejection::Closed);
        }
        if cost > capacity {
            return Answer::Rejected(Rejection::InsufficientCapacity { cost, capacity });
        }
        let p = level(priority);
        let blocked = self.waiting[..=p].iter().any(|w| !w.is_empty());
        if !blocked {
            let mut state = self.tat;
            let decision = self.gcra().check(&mut state, self.now, cost).unwrap();
            if decision.allowed {
                self.tat = state;
                return Answer::Admitted(decision);
            }
            if self.setup.depth == 0 {
                return Answer::Rejected(Rejection::Limited { decision });
            }
        }
        let wait = self.newcomer_wait(cost, priority, flow);
        if self.setup.depth == 0 {
            return Answer::Rejected(Rejection::Limited {
                decision: Decision {
                    allowed: false,
                    limit: capacity,
                    remaining: 0,
                    retry_after_ns: wait,
                    reset_after_ns: wait,
                },
            });
        }
        if self.len() >= self.setup.depth {
            return Answer::Rejected(Rejection::QueueFull {
                retry_after_ns: wait,
            });
        }
        if wait > max_wait {
            return Answer::Rejected(Rejection::Timeout {
                retry_after_ns: wait,
            });
        }
        let number = self.issued;
        self.issued += 1;
        if !self.waiting[p].iter().any(|w| w.flow == flow) {
            self.turns[p].push_back(flow);
        }
        self.waiting[p].push(Waiter {
            number,
            cost,
            flow,
            deadline: self.now.saturating_add(max_wait),
        });
        Answer::Queued { wait_ns: wait }
    }

    fn poll(&mut self) -> (Vec<(usize, Outcome)>, Option<u64>) {
        let now = self.now;
        let mut out = Vec::new();
        let mut admit_at = None;
        // Heads go while the limiter holds their cost now (their deadline may have gone by
        // while nobody polled); a head it cannot admit times out if its deadline is past.
        while let Some((p, w)) = self.head() {
            let mut state = self.tat;
            let decision = self.gcra().check(&mut state, now, w.cost).unwrap();
            if !decision.allowed && now > w.deadline {
                let retry_after_ns = decision.retry_after_ns;
                self.pop_head(p, w.number);
                out.push((w.number, Outcome::TimedOut { retry_after_ns }));
                continue;
            }
            if !decision.allowed {
                admit_at = Some(now + decision.retry_after_ns.max(1));
                break;
            }
            self.tat = state;
            self.pop_head(p, w.number);
            out.push((w.number, Outcome::Admitted(decision)));
        }
        // Everyone whose deadline is now or past goes, earliest deadline first.
        let mut expired: Vec<(u64, usize, usize)> = (0..3)
            .flat_map(|p| {
                self.waiting[p]
                    .iter()
                    .filter(|w| w.deadline <= now)
                    .map(move |w| (w.deadline, w.number, p))
            })
            .collect();
        expired.sort();
        if !expired.is_empty() {
            let predicted = self.predict(None);
            for (_, number, p) in expired {
                self.remove(p, number);
                let retry_after_ns = predicted[&number] - now;
                out.push((number, Outcome::TimedOut { retry_after_ns }));
            }
        }
        let next = if self.len() == 0 {
            None
        } else {
            let deadline = self.waiting.iter().flatten().map(|w| w.deadline).min();
            match (admit_at, deadline) {
                (Some(a), Some(d)) => Some(a.min(d)),
                (a, d) => a.or(d),
            }
        };
        (out, next)
    }
}

struct QueueModel;

impl ReferenceStateMachine for QueueModel {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        (
            1..=3u64,
            prop_oneof![1 => Just(0usize), 6 => 1..=6usize],
            0..=120u64,
        )
            .prop_map(|(capacity, depth, max_wait)| Model {
                setup: Setup {
                    capacity,
                    depth,
                    max_wait,
                },
                now: 0,
                tat: gcra(capacity).initial_state(),
                waiting: Default::default(),
                turns: Default::default(),
                closed: false,
                issued: 0,
                expect: Expect::Nothing,
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let capacity = state.setup.capacity;
        let priority = prop_oneof![
            Just(Priority::High),
            Just(Priority::Normal),
            Just(Priority::Low)
        ];
        prop_oneof![
            8 => (1..=capacity + 1, priority.clone(), 0..3u64, proptest::option::of(0..=150u64))
                .prop_map(|(cost, priority, flow, max_wait)| Step::Offer {
                    cost,
                    priority,
                    flow,
                    max_wait,
                }),
            1 => (1..=capacity, priority, 0..3u64)
                .prop_map(|(cost, priority, flow)| Step::Peek { cost, priority, flow }),
            4 => (0..=40u64).prop_map(Step::Advance),
            4 => Just(Step::Poll),
            2 => any::<usize>().prop_map(Step::Cancel),
            1 => Just(Step::Close),
        ]
        .boxed()
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        state.expect = match *step {
            Step::Offer {
                cost,
                priority,
                flow,
                max_wait,
            } => {
                let max_wait = max_wait.unwrap_or(state.setup.max_wait);
                Expect::Offer(state.offer(cost, priority, flow, max_wait))
            }
            Step::Peek {
                cost,
                priority,
                flow,
            } => Expect::Peek(state.newcomer_wait(cost, priority, flow)),
            Step::Advance(ns) => {
                state.now += ns;
                Expect::Nothing
            }
            Step::Poll => {
                let (out, next) = state.poll();
                Expect::Poll(out, next)
            }
            Step::Cancel(n) => {
                if state.issued == 0 {
                    Expect::Cancel(false)
                } else {
                    let number = n % state.issued;
                    let removed = (0..3).any(|p| state.remove(p, number).is_some());
                    Expect::Cancel(removed)
                }
            }
            Step::Close => {
                let mut closed = Vec::new();
                for p in 0..3 {
                    closed.extend(state.waiting[p].drain(..).map(|w| w.number));
                    state.turns[p].clear();
                }
                state.closed = true;
                Expect::Close(closed)
            }
        };
        state
    }
}

/// The queue under test, with the bookkeeping for the model-free checks.
struct Sut {
    gcra: Gcra,
    capacity: u64,
    state: u64,
    queue: WaitQueue<u64, usize>,
    now: u64,
    /// Ticket and cost by ticket number.
    tickets: Vec<(Ticket, u64)>,
    /// Every admission: `(when, cost)`.
    admissions: Vec<(u64, u64)>,
    /// The last ticket number admitted per (priority, flow).
    last_admitted: BTreeMap<(usize, u64), usize>,
}

impl Sut {
    fn admitted(&mut self, number: usize, at: u64) {
        let (t, cost) = self.tickets[number];
        let key = (level(t.priority()), t.flow());
        if let Some(&before) = self.last_admitted.get(&key) {
            assert!(
                before < number,
                "ticket {number} admitted after {before} of the same priority and flow"
            );
        }
        self.last_admitted.insert(key, number);
        self.admissions.push((at, cost));
    }

    /// Every window between two admissions holds at most capacity + rate·T.
    fn check_bound(&self) {
        let a = &self.admissions;
        for i in 0..a.len() {
            let mut cost = 0;
            for (at, c) in &a[i..] {
                cost += c;
                let span = at - a[i].0;
                assert!(
                    cost <= self.capacity + span / INTERVAL,
                    "{cost} admitted within {span} ns: above capacity + rate·T ({a:?})"
                );
            }
        }
    }
}

struct QueueTest;

impl StateMachineTest for QueueTest {
    type SystemUnderTest = Sut;
    type Reference = QueueModel;

    fn init_test(model: &Model) -> Sut {
        let gcra = gcra(model.setup.capacity);
        Sut {
            gcra,
            capacity: model.setup.capacity,
            state: gcra.initial_state(),
            queue: WaitQueue::with_payload(QueueConfig {
                depth: model.setup.depth,
                max_wait_ns: model.setup.max_wait,
            }),
            now: 0,
            tickets: Vec::new(),
            admissions: Vec::new(),
            last_admitted: BTreeMap::new(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, step: Step) -> Sut {
        let now = sut.now;
        let got = match step {
            Step::Offer {
                cost,
                priority,
                flow,
                max_wait,
            } => {
                let cell = &mut Owned(&mut sut.state);
                let offer = match max_wait {
                    None => sut.queue.offer(&sut.gcra, cell, now, cost, priority, flow),
                    Some(m) => sut
                        .queue
                        .offer_with_max_wait(&sut.gcra, cell, now, cost, priority, flow, m),
                };
                Expect::Offer(match offer {
                    Offer::Admitted(decision) => {
                        sut.admissions.push((now, cost));
                        Answer::Admitted(decision)
                    }
                    Offer::Queued { ticket, wait_ns } => {
                        assert_eq!(ticket.priority(), priority);
                        assert_eq!(ticket.flow(), flow);
                        *sut.queue.payload_mut(ticket).unwrap() = sut.tickets.len();
                        sut.tickets.push((ticket, cost));
                        Answer::Queued { wait_ns }
                    }
                    Offer::Rejected(r) => Answer::Rejected(r),
                })
            }
            Step::Peek {
                cost,
                priority,
                flow,
            } => Expect::Peek(sut.queue.peek_wait(
                &sut.gcra,
                &Owned(&mut sut.state),
                now,
                cost,
                priority,
                flow,
            )),
            Step::Advance(ns) => {
                sut.now += ns;
                Expect::Nothing
            }
            Step::Poll => {
                let mut out = Vec::new();
                let mut at_times = Vec::new();
                let next = sut.queue.poll_timed(
                    &sut.gcra,
                    &mut Owned(&mut sut.state),
                    now,
                    |ticket, outcome, number, at| {
                        at_times.push(at);
                        out.push((ticket, outcome, number));
                    },
                );
                assert!(
                    at_times.iter().all(|&at| at == now),
                    "{at_times:?} at {now}"
                );
                let mut answer = Vec::new();
                for (ticket, outcome, number) in out {
                    assert_eq!(sut.tickets[number].0, ticket);
                    if let Outcome::Admitted(_) = outcome {
                        sut.admitted(number, now);
                    }
                    answer.push((number, outcome));
                }
                if let Some(next) = next {
                    assert!(next > now, "next poll {next} not after {now}");
                }
                Expect::Poll(answer, next)
            }
            Step::Cancel(n) => {
                if sut.tickets.is_empty() {
                    Expect::Cancel(false)
                } else {
                    let (ticket, _) = sut.tickets[n % sut.tickets.len()];
                    Expect::Cancel(sut.queue.cancel(ticket))
                }
            }
            Step::Close => {
                let mut closed = Vec::new();
                sut.queue.close_with(|ticket, outcome, number| {
                    assert_eq!(outcome, Outcome::Closed);
                    assert_eq!(sut.tickets[number].0, ticket);
                    closed.push(number);
                });
                Expect::Close(closed)
            }
        };
        assert_eq!(got, model.expect, "after {step:?} at {now}");
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        assert_eq!(sut.queue.len(), model.len());
        for (p, &priority) in PRIORITIES.iter().enumerate() {
            assert_eq!(sut.queue.len_at(priority), model.waiting[p].len());
        }
        // Cancels, expiries and closes neither spend nor give back tokens.
        assert_eq!(sut.state, model.tat, "limiter state");
        assert_eq!(sut.queue.is_closed(), model.closed);
        sut.check_bound();
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        .. ProptestConfig::default()
    })]

    #[test]
    fn wait_queue_agrees_with_its_model(sequential 1..80 => QueueTest);
}
