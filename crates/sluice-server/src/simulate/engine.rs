//! The replay: one policy, its per-key buckets and wait queues, on a virtual clock.
//!
//! This is the gateway's decision path with the clock taken out. The gateway keeps one state
//! per key and, while anyone waits on a key, one [`WaitQueue`] for it (sluice's `Keyed` and
//! `Limiter`); a request is offered to that queue (admitted at once, queued, or turned away)
//! and a driver polls the queue at the time it asks for. Here the same [`AnyAlgorithm`] and
//! the same [`WaitQueue`] are driven by an event loop instead of tokio timers: arrivals in
//! time order, and each key's next poll at exactly the time its queue named. At equal
//! times, a due poll goes before an arrival (the waiter came first).
//!
//! Not simulated: `concurrency` (it depends on how long the upstream takes), `max_keys`
//! eviction (every key is kept), and other policies of the same route.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use sluice_core::queue::{Offer, Outcome, Owned, Priority, QueueConfig, Rejection, WaitQueue};
use sluice_core::{Algorithm, AnyAlgorithm, AnyState, Kind};
use sluice_http::admit::Reason;

use crate::simulate::arrival::Arrival;

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Admitted at `at_ns`, after waiting `wait_ns` in the queue (zero: at once).
    Admitted {
        /// When.
        at_ns: u64,
        /// How long it waited.
        wait_ns: u64,
    },
    /// Denied at `at_ns`.
    Denied {
        /// When (its arrival, or its deadline for a waiter that timed out).
        at_ns: u64,
        /// Why, as the gateway's 429 body and metrics name it.
        reason: Reason,
    },
}

/// One point of the plotted key's bucket level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    /// Virtual time.
    pub at_ns: u64,
    /// Tokens available (fractional for the bucket algorithms, whole for the windows).
    pub tokens: f64,
}

/// The result of a replay.
#[derive(Debug, Clone)]
pub struct Run {
    /// One per arrival, in the same order.
    pub fates: Vec<Fate>,
    /// The distinct keys, in order of first appearance.
    pub keys: Vec<String>,
    /// The index in `keys` of each arrival's key.
    pub key_of: Vec<usize>,
    /// The key whose level is plotted (the one with the most requests).
    pub plotted: usize,
    /// Its level over time.
    pub levels: Vec<Level>,
    /// When the last thing happened (an arrival, an admission or a timeout).
    pub last_event_ns: u64,
}

/// A policy to replay.
#[derive(Debug, Clone, Copy)]
pub struct Engine {
    algorithm: AnyAlgorithm,
    queue: QueueConfig,
    keyed: bool,
}

struct KeySim {
    state: AnyState,
    queue: WaitQueue<AnyState, usize>,
    /// When its queue asked to be polled next (`u64::MAX`: nothing waits).
    scheduled: u64,
}

/// The plotted key's level: each event exactly (a point before and after it) and a grid of
/// samples for the refills in between; or, past [`MAX_EVENT_POINTS`] events, the lowest and
/// highest level of each grid cell, drawn as a band (a grid alone would alias a fast
/// sawtooth into a slow one).
struct Plot {
    exact: bool,
    step: u64,
    points: Vec<Level>,
    /// `(lowest, highest)` per cell of `step` nanoseconds.
    cells: Vec<(f64, f64)>,
}

impl Plot {
    fn add(&mut self, at_ns: u64, tokens: f64) {
        if self.exact {
            self.points.push(Level { at_ns, tokens });
            return;
        }
        let Ok(i) = usize::try_from(at_ns / self.step) else {
            return;
        };
        if i >= self.cells.len() {
            if i > 16 * GRID_POINTS as usize {
                return; // a drain far past the load: not drawn
            }
            self.cells.resize(i + 1, (f64::INFINITY, f64::NEG_INFINITY));
        }
        let cell = &mut self.cells[i];
        *cell = (cell.0.min(tokens), cell.1.max(tokens));
    }

    fn last_at(&self) -> Option<u64> {
        if self.exact {
            self.points.last().map(|l| l.at_ns)
        } else {
            self.cells
                .iter()
                .rposition(|(lo, hi)| lo <= hi)
                .map(|i| i as u64 * self.step)
        }
    }

    fn finish(self) -> Vec<Level> {
        if self.exact {
            return self.points;
        }
        let mut out = Vec::with_capacity(2 * self.cells.len());
        for (i, (lo, hi)) in self.cells.into_iter().enumerate() {
            if lo > hi {
                continue; // nothing happened in it
            }
            let at_ns = i as u64 * self.step;
            out.push(Level { at_ns, tokens: hi });
            if lo < hi {
                out.push(Level { at_ns, tokens: lo });
            }
        }
        out
    }
}

/// The bucket events plotted exactly (a point before and after each) up to this many; more
/// are plotted on the sampling grid only.
const MAX_EVENT_POINTS: usize = 20_000;

/// Grid points across the run for the plotted level.
const GRID_POINTS: u64 = 800;

impl Engine {
    /// An engine for `algorithm`, with a wait queue of `queue.depth` per key (zero: none);
    /// `keyed` false puts every request in one bucket (`key = "global"`).
    pub fn new(algorithm: AnyAlgorithm, queue: QueueConfig, keyed: bool) -> Engine {
        Engine {
            algorithm,
            queue,
            keyed,
        }
    }

    /// Tokens available in `state` at `now`, without consuming any.
    fn tokens(&self, state: &AnyState, now: u64) -> f64 {
        let mut copy = state.clone();
        let Ok(d) = self.algorithm.check(&mut copy, now, 0) else {
            return 0.0;
        };
        let quota = self.algorithm.quota();
        match self.algorithm.which() {
            Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => {
                let cap = quota.capacity() as f64;
                let used = d.reset_after_ns as f64 / quota.interval_ns() as f64;
                (cap - used).clamp(0.0, cap)
            }
            _ => d.remaining as f64,
        }
    }

    /// Replays `arrivals` (sorted by time) until every queue is empty; `horizon_ns` is the end
    /// of the load (a pattern's duration), for the level plot's grid.
    pub fn run(&self, arrivals: &[Arrival], horizon_ns: u64) -> Run {
        // Keys first: their indices, and the busiest one to plot.
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut keys: Vec<String> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let key_of: Vec<usize> = arrivals
            .iter()
            .map(|a| {
                let key = if self.keyed { a.key.as_str() } else { "" };
                let next = keys.len();
                let i = *index.entry(key).or_insert(next);
                if i == next {
                    keys.push(key.to_owned());
                    counts.push(0);
                }
                counts[i] += 1;
                i
            })
            .collect();
        let plotted = counts
            .iter()
            .enumerate()
            .max_by_key(|&(i, &n)| (n, Reverse(i)))
            .map_or(0, |(i, _)| i);

        let mut sims: Vec<KeySim> = (0..keys.len())
            .map(|_| KeySim {
                state: self.algorithm.initial_state(),
                queue: WaitQueue::with_payload(self.queue),
                scheduled: u64::MAX,
            })
            .collect();
        let mut fates: Vec<Option<Fate>> = vec![None; arrivals.len()];
        let mut wakes: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
        let step = (horizon_ns / GRID_POINTS).max(1);
        let mut plot = Plot {
            exact: counts.get(plotted).copied().unwrap_or(0) <= MAX_EVENT_POINTS,
            step,
            points: Vec::new(),
            cells: Vec::new(),
        };
        let mut next_sample = 0u64;
        let mut last_event_ns = 0u64;
        let mut next_arrival = 0usize;

        loop {
            let ta = arrivals.get(next_arrival).map_or(u64::MAX, |a| a.at_ns);
            let tw = wakes.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
            let busy = ta != u64::MAX || tw != u64::MAX;
            let ts = if busy || next_sample <= horizon_ns {
                next_sample
            } else {
                u64::MAX
            };
            let now = ta.min(tw).min(ts);
            if now == u64::MAX {
                break;
            }
            if tw == now {
                let Some(Reverse((_, k))) = wakes.pop() else {
                    break;
                };
                let sim = &mut sims[k];
                if sim.scheduled != now {
                    continue; // superseded
                }
                let before = (k == plotted).then(|| self.tokens(&sim.state, now));
                let next = sim.queue.poll_timed(
                    &self.algorithm,
                    &mut Owned(&mut sim.state),
                    now,
                    |_, outcome, i, at| {
                        let arrived = arrivals[i].at_ns;
                        fates[i] = Some(match outcome {
                            Outcome::Admitted(_) => Fate::Admitted {
                                at_ns: at,
                                wait_ns: at.saturating_sub(arrived),
                            },
                            Outcome::TimedOut { .. } => Fate::Denied {
                                at_ns: at,
                                reason: Reason::Timeout,
                            },
                            Outcome::Closed => Fate::Denied {
                                at_ns: at,
                                reason: Reason::Unavailable,
                            },
                        });
                        last_event_ns = last_event_ns.max(at);
                    },
                );
                sim.scheduled = next.unwrap_or(u64::MAX);
                if let Some(at) = next {
                    wakes.push(Reverse((at, k)));
                }
                if let Some(tokens) = before {
                    plot.add(now, tokens);
                    plot.add(now, self.tokens(&sim.state, now));
                }
            } else if ta == now {
                let i = next_arrival;
                next_arrival += 1;
                let a = &arrivals[i];
                let k = key_of[i];
                let sim = &mut sims[k];
                let before = (k == plotted).then(|| self.tokens(&sim.state, now));
                let offer = sim.queue.offer(
                    &self.algorithm,
                    &mut Owned(&mut sim.state),
                    now,
                    a.cost,
                    Priority::Normal,
                    0,
                );
                last_event_ns = last_event_ns.max(now);
                match offer {
                    Offer::Admitted(_) => {
                        fates[i] = Some(Fate::Admitted {
                            at_ns: now,
                            wait_ns: 0,
                        });
                    }
                    Offer::Queued { ticket, wait_ns } => {
                        if let Some(slot) = sim.queue.payload_mut(ticket) {
                            *slot = i;
                        }
                        // As the gateway: the driver wakes when the newcomer's turn is
                        // predicted, unless it is already due earlier.
                        let wake = now.saturating_add(wait_ns);
                        if wake < sim.scheduled {
                            sim.scheduled = wake;
                            wakes.push(Reverse((wake, k)));
                        }
                    }
                    Offer::Rejected(rejection) => {
                        let reason = match rejection {
                            Rejection::Limited { .. } => Reason::Limit,
                            Rejection::QueueFull { .. } => Reason::QueueFull,
                            Rejection::Timeout { .. } => Reason::Timeout,
                            Rejection::InsufficientCapacity { .. } => Reason::Capacity,
                            Rejection::Closed => Reason::Unavailable,
                        };
                        fates[i] = Some(Fate::Denied { at_ns: now, reason });
                    }
                }
                if let Some(tokens) = before {
                    plot.add(now, tokens);
                    plot.add(now, self.tokens(&sims[k].state, now));
                }
            } else {
                if let Some(sim) = sims.get(plotted) {
                    plot.add(now, self.tokens(&sim.state, now));
                }
                next_sample = next_sample.saturating_add(step);
            }
        }
        // The level where the plot ends.
        let end = horizon_ns.max(last_event_ns);
        if let (Some(sim), true) = (sims.get(plotted), plot.last_at() < Some(end)) {
            plot.add(end, self.tokens(&sim.state, end));
        }
        let fates = fates
            .into_iter()
            .zip(arrivals)
            .map(|(f, a)| {
                // Unreachable: every queue is drained above. Never leave a hole.
                f.unwrap_or(Fate::Denied {
                    at_ns: a.at_ns,
                    reason: Reason::Unavailable,
                })
            })
            .collect();
        Run {
            fates,
            keys,
            key_of,
            plotted,
            levels: plot.finish(),
            last_event_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Quota;

    fn engine(kind: Kind, capacity: u64, rate: &str, depth: usize, max_wait_ms: u64) -> Engine {
        Engine::new(
            AnyAlgorithm::new(kind, Quota::parse(capacity, rate).unwrap()),
            QueueConfig {
                depth,
                max_wait_ns: max_wait_ms * 1_000_000,
            },
            true,
        )
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn no_queue_denies_at_once() {
        let e = engine(Kind::TokenBucket, 2, "1/s", 0, 0);
        let run = e.run(
            &[
                Arrival::at(0),
                Arrival::at(0),
                Arrival::at(0),
                Arrival::at(1000 * MS),
            ],
            1000 * MS,
        );
        assert_eq!(
            run.fates,
            [
                Fate::Admitted {
                    at_ns: 0,
                    wait_ns: 0
                },
                Fate::Admitted {
                    at_ns: 0,
                    wait_ns: 0
                },
                Fate::Denied {
                    at_ns: 0,
                    reason: Reason::Limit
                },
                Fate::Admitted {
                    at_ns: 1000 * MS,
                    wait_ns: 0
                },
            ]
        );
    }

    #[test]
    fn the_queue_admits_in_turn_and_refuses_when_full_or_late() {
        // Capacity 2 at 1/s, 2 may wait at most 3 s: of 5 at once, 2 pass, 2 wait 1 s and
        // 2 s, 1 finds the queue full.
        let e = engine(Kind::TokenBucket, 2, "1/s", 2, 3000);
        let run = e.run(&vec![Arrival::at(0); 5], 1000 * MS);
        assert_eq!(
            run.fates[2..],
            [
                Fate::Admitted {
                    at_ns: 1000 * MS,
                    wait_ns: 1000 * MS
                },
                Fate::Admitted {
                    at_ns: 2000 * MS,
                    wait_ns: 2000 * MS
                },
                Fate::Denied {
                    at_ns: 0,
                    reason: Reason::QueueFull
                },
            ]
        );
        // The same with a 1.5 s maximum wait: the fourth would wait 2 s, refused at the door.
        let e = engine(Kind::TokenBucket, 2, "1/s", 2, 1500);
        let run = e.run(&vec![Arrival::at(0); 4], 1000 * MS);
        assert_eq!(
            run.fates[3],
            Fate::Denied {
                at_ns: 0,
                reason: Reason::Timeout
            }
        );
        assert_eq!(run.last_event_ns, 1000 * MS);
    }

    #[test]
    fn keys_are_independent_and_a_global_policy_ignores_them() {
        let mut a = Arrival::at(0);
        a.key = "x".into();
        let mut b = Arrival::at(0);
        b.key = "y".into();
        let e = engine(Kind::Gcra, 1, "1/s", 0, 0);
        let run = e.run(&[a.clone(), b.clone()], 0);
        assert!(run.fates.iter().all(|f| matches!(f, Fate::Admitted { .. })));
        assert_eq!(run.keys, ["x", "y"]);
        let global = Engine::new(e.algorithm, e.queue, false);
        let run = global.run(&[a, b], 0);
        assert!(matches!(
            run.fates[1],
            Fate::Denied {
                reason: Reason::Limit,
                ..
            }
        ));
        assert_eq!(run.keys, [""]);
    }

    #[test]
    fn a_cost_above_the_capacity_is_denied_for_capacity() {
        let e = engine(Kind::TokenBucket, 2, "1/s", 5, 10_000);
        let mut a = Arrival::at(0);
        a.cost = 3;
        let run = e.run(&[a], 0);
        assert_eq!(
            run.fates[0],
            Fate::Denied {
                at_ns: 0,
                reason: Reason::Capacity
            }
        );
    }

    #[test]
    fn many_events_are_plotted_as_a_band() {
        let e = engine(Kind::TokenBucket, 10, "5/s", 0, 0);
        let arrivals: Vec<Arrival> = (0..30_000).map(|i| Arrival::at(i * MS)).collect();
        let run = e.run(&arrivals, 30_000 * MS);
        assert!(
            run.levels.len() <= 2 * (GRID_POINTS as usize + 2),
            "{}",
            run.levels.len()
        );
        assert!(run.levels.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        // Past the burst, the level only climbs from 0 to 1 token and drops back to 0.
        let late: Vec<f64> = run
            .levels
            .iter()
            .filter(|l| l.at_ns > 5_000 * MS)
            .map(|l| l.tokens)
            .collect();
        assert!(late.iter().all(|&t| (0.0..=1.0).contains(&t)));
        assert!(late.contains(&0.0) && late.contains(&1.0));
    }

    #[test]
    fn the_level_is_plotted() {
        let e = engine(Kind::TokenBucket, 4, "2/s", 0, 0);
        let run = e.run(&vec![Arrival::at(0); 4], 2000 * MS);
        assert_eq!(run.levels.first().map(|l| l.tokens), Some(4.0));
        assert!(run.levels.iter().any(|l| l.tokens == 0.0));
        let last = run.levels.last().unwrap();
        assert!(last.at_ns >= 2000 * MS && last.tokens == 4.0, "{last:?}");
    }
}
