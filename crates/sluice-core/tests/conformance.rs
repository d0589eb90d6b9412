//! Conformance: every algorithm against its documented guarantee and against a plain reference
//! model written with exact integer arithmetic, over random quotas and arrival schedules.
//!
//! Each algorithm runs 10,000 random schedules of up to 40 arrivals. For every arrival:
//!
//! - `allowed`, `remaining` and `reset_after_ns` equal the reference model's (no false denials,
//!   no false admissions);
//! - a denial's `retry_after_ns` is exact: the model's earliest admitting time is `now + retry`,
//!   and the algorithm (on a cloned state) still denies at `now + retry − 1` and admits at
//!   `now + retry`;
//! - after `reset_after_ns` without traffic the limiter is full again, one nanosecond earlier it
//!   is not, and `idle_at` names the same moment.
//!
//! After the schedule, the admissions are checked against the guarantee of the algorithm's
//! family over every window that starts and ends at an admission, and a refund of one random
//! admission is checked to behave exactly as if that admission had never happened.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_core::{
    Algorithm, AnyAlgorithm, Decision, FixedWindow, Gcra, Kind, LeakyBucket, Quota, Rate,
    SlidingLog, SlidingWindow, TokenBucket,
};

const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    }
}

// === Schedules ===

/// One random schedule: a quota, non-decreasing arrivals `(now, cost)`, and which admission to
/// refund (and when) for the refund property.
#[derive(Debug, Clone)]
struct Case {
    capacity: u64,
    interval: u64,
    arrivals: Vec<(u64, u64)>,
    refund_pick: usize,
    refund_delay_pick: u64,
}

impl Case {
    fn quota(&self) -> Quota {
        Quota::new(
            self.capacity,
            Rate::from_interval_ns(self.interval).unwrap(),
        )
        .unwrap()
    }
}

/// Intervals from one nanosecond (where rounding and same-instant arrivals dominate) to an hour.
fn interval() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..=4,
        3 => 5u64..=1_000,
        2 => 1_000u64..=10_000_000,
        1 => Just(1_000_000_000u64),
        1 => Just(333_333_334u64), // "3/s", rounded up
        1 => 1_000_000_000u64..=3_600_000_000_000,
    ]
}

/// A gap between two arrivals, drawn from raw numbers (plain strategies generate and shrink
/// much faster than nested unions): bursts at one instant, a few nanoseconds, whole intervals
/// give or take one nanosecond (to hit the refill boundary), fractions of a window, and whole
/// windows give or take one.
fn gap(selector: u8, raw: u64, capacity: u64, interval: u64) -> u64 {
    let window = capacity * interval;
    let nudge = (raw >> 40) % 3; // -1, 0 or +1 ns, as 0..=2 then minus one
    match selector {
        0..=2 => 0,
        3..=4 => 1 + raw % 3,
        5..=7 => ((raw % (capacity + 2)) * interval + nudge).saturating_sub(1),
        8..=10 => (u128::from(window) * u128::from(raw % 161) / 64) as u64,
        _ => ((1 + raw % 3) * window + nudge).saturating_sub(1),
    }
}

/// Mostly single tokens, often any cost, sometimes the whole capacity.
fn cost(raw: u64, capacity: u64) -> u64 {
    match raw % 6 {
        0..=2 => 1,
        3..=4 => 1 + (raw >> 8) % capacity,
        _ => capacity,
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u64..=20,
        interval(),
        any::<u64>(),
        prop::collection::vec((0u8..12, any::<u64>(), any::<u64>()), 1..=40),
        any::<usize>(),
        any::<u64>(),
    )
        .prop_map(
            |(capacity, interval, start, steps, refund_pick, refund_delay_pick)| {
                // Half the schedules start at time 0, the rest up to three windows later.
                let mut now = if start % 2 == 0 {
                    0
                } else {
                    (start >> 1) % (3 * capacity * interval + 1)
                };
                let arrivals = steps
                    .into_iter()
                    .map(|(selector, raw_gap, raw_cost)| {
                        now += gap(selector, raw_gap, capacity, interval);
                        (now, cost(raw_cost, capacity))
                    })
                    .collect();
                Case {
                    capacity,
                    interval,
                    arrivals,
                    refund_pick,
                    refund_delay_pick,
                }
            },
        )
}

// === Reference models ===

/// The guarantee an algorithm gives, which also picks its reference model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// token_bucket, gcra, leaky_bucket.
    Bucket,
    SlidingLog,
    FixedWindow,
    SlidingWindow,
}

/// What the reference model decides for one arrival (`retry_after` is found by search).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    allowed: bool,
    remaining: u64,
    reset_after_ns: u64,
}

/// The reference models keep nothing but the list of admissions and decide by counting.
#[derive(Debug, Clone)]
struct Model {
    family: Family,
    n: u64,
    interval: u64,
    window: u64,
    admitted: Vec<(u64, u64)>,
}

impl Model {
    fn new(family: Family, quota: Quota) -> Model {
        Model {
            family,
            n: quota.capacity(),
            interval: quota.interval_ns(),
            window: quota.window_ns(),
            admitted: Vec::new(),
        }
    }

    fn admit(&mut self, now: u64, cost: u64) {
        self.admitted.push((now, cost));
    }

    /// Cost admitted at times satisfying `keep`.
    fn count(&self, keep: impl Fn(u64) -> bool) -> u64 {
        self.admitted
            .iter()
            .filter(|&&(t, _)| keep(t))
            .map(|&(_, c)| c)
            .sum()
    }

    fn decide(&self, now: u64, cost: u64) -> Outcome {
        match self.family {
            Family::Bucket => self.decide_bucket(now, cost),
            Family::SlidingLog => self.decide_log(now, cost),
            Family::FixedWindow => self.decide_fixed(now, cost),
            Family::SlidingWindow => self.decide_sliding(now, cost),
        }
    }

    /// The bucket in closed form, as the guarantee itself: with one token = `interval` ns of
    /// refill and `tau` = capacity × interval, the tokens held at `now` are
    /// `min(tau, min over admissions j of tau + (now − t_j) − interval × (cost admitted in
    /// [t_j, now]))` (the bucket was last full at some admission or never emptied). So a cost is
    /// admitted exactly when admitting it keeps every window `[t_j, now]` within
    /// `capacity + (now − t_j) / interval`: no denial without a window that would overflow.
    fn decide_bucket(&self, now: u64, cost: u64) -> Outcome {
        let tau = i128::from(self.window);
        let interval = i128::from(self.interval);
        let mut level = tau;
        let mut suffix = 0i128;
        for &(t, c) in self.admitted.iter().rev() {
            suffix += i128::from(c);
            level = level.min(tau + i128::from(now - t) - interval * suffix);
        }
        assert!(level >= 0, "reference bucket below empty: {level}");
        let need = i128::from(cost) * interval;
        let allowed = level >= need;
        let after = if allowed { level - need } else { level };
        Outcome {
            allowed,
            remaining: u64::try_from(after / interval).unwrap(),
            reset_after_ns: u64::try_from(tau - after).unwrap(),
        }
    }

    /// At most N in the half-open window `(now − W, now]`.
    fn decide_log(&self, now: u64, cost: u64) -> Outcome {
        let in_window = |t: u64| t + self.window > now;
        let used = self.count(in_window);
        let allowed = used + cost <= self.n;
        let used = if allowed { used + cost } else { used };
        let newest = if allowed && cost > 0 {
            Some(now)
        } else {
            self.admitted
                .iter()
                .rev()
                .map(|&(t, _)| t)
                .find(|&t| in_window(t))
        };
        Outcome {
            allowed,
            remaining: self.n - used,
            reset_after_ns: newest.map_or(0, |t| t + self.window - now),
        }
    }

    /// At most N in each window `[kW, (k+1)W)`.
    fn decide_fixed(&self, now: u64, cost: u64) -> Outcome {
        let k = now / self.window;
        let used = self.count(|t| t / self.window == k);
        let allowed = used + cost <= self.n;
        let used = if allowed { used + cost } else { used };
        let left = (k + 1) * self.window - now;
        Outcome {
            allowed,
            remaining: self.n - used,
            reset_after_ns: if used > 0 { left } else { 0 },
        }
    }

    /// The previous aligned window's count weighted by the part of it still inside `(now − W,
    /// now]`, plus the current window's count, must stay within N. Compared as `× W`, exactly.
    fn decide_sliding(&self, now: u64, cost: u64) -> Outcome {
        let w = self.window;
        let k = now / w;
        let previous = if k == 0 {
            0
        } else {
            self.count(|t| t / w == k - 1)
        };
        let current = self.count(|t| t / w == k);
        let left = (k + 1) * w - now;
        let scaled = |current: u64| {
            u128::from(previous) * u128::from(left) + u128::from(current) * u128::from(w)
        };
        let full = u128::from(self.n) * u128::from(w);
        let allowed = scaled(current + cost) <= full;
        let current = if allowed { current + cost } else { current };
        let remaining = (full.saturating_sub(scaled(current)) / u128::from(w)) as u64;
        let reset_after_ns = if current > 0 {
            left + w
        } else if previous > 0 {
            left
        } else {
            0
        };
        Outcome {
            allowed,
            remaining,
            reset_after_ns,
        }
    }

    /// The earliest time at which the model admits `cost` with no other traffic, by bisection
    /// (admission only gets easier as time passes, for every family).
    fn earliest(&self, now: u64, cost: u64) -> u64 {
        let (mut lo, mut hi) = (now, now + 2 * self.window + 1);
        assert!(!self.decide(lo, cost).allowed);
        assert!(self.decide(hi, cost).allowed, "model never admits {cost}");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.decide(mid, cost).allowed {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// The family's guarantee over the admissions, checked on every window that starts and ends
    /// at an admission (the fullest windows always do).
    fn check_guarantee(&self) -> Result<(), TestCaseError> {
        let a = &self.admitted;
        let (n, w, interval) = (
            u128::from(self.n),
            u128::from(self.window),
            u128::from(self.interval),
        );
        for i in 0..a.len() {
            let mut sum = 0u128;
            for j in i..a.len() {
                sum += u128::from(a[j].1);
                let span = u128::from(a[j].0 - a[i].0);
                match self.family {
                    Family::Bucket => prop_assert!(
                        sum * interval <= n * interval + span,
                        "{} admitted in [{}, {}], above capacity {} + {}/{}",
                        sum,
                        a[i].0,
                        a[j].0,
                        n,
                        span,
                        interval
                    ),
                    Family::SlidingLog => {
                        if span < w {
                            prop_assert!(
                                sum <= n,
                                "{} admitted within {} ns < W = {}",
                                sum,
                                span,
                                w
                            );
                        }
                    }
                    Family::FixedWindow => {
                        if a[i].0 / self.window == a[j].0 / self.window {
                            prop_assert!(sum <= n, "{} admitted in one aligned window", sum);
                        }
                        if span <= w {
                            prop_assert!(
                                sum <= 2 * n,
                                "{} admitted within {} ns <= W = {}",
                                sum,
                                span,
                                w
                            );
                        }
                    }
                    Family::SlidingWindow => {
                        if a[i].0 / self.window == a[j].0 / self.window {
                            prop_assert!(sum <= n, "{} admitted in one aligned window", sum);
                        }
                        if span < w {
                            prop_assert!(
                                sum < 2 * n,
                                "{} admitted within {} ns < W = {}",
                                sum,
                                span,
                                w
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

// === Drivers ===

fn check<A: Algorithm>(
    alg: &A,
    state: &mut A::State,
    now: u64,
    cost: u64,
) -> Result<Decision, TestCaseError> {
    alg.check(state, now, cost)
        .map_err(|e| TestCaseError::fail(format!("check at {now} of cost {cost} failed: {e}")))
}

/// Runs the schedule, checking every decision against the model, `retry_after` and
/// `reset_after` exactness and `idle_at`; then the family's guarantee. Returns the decisions.
fn conform<A: Algorithm>(
    alg: &A,
    family: Family,
    case: &Case,
) -> Result<Vec<Decision>, TestCaseError> {
    let n = alg.quota().capacity();
    let mut state = alg.initial_state();
    let mut model = Model::new(family, alg.quota());
    let mut decisions = Vec::with_capacity(case.arrivals.len());
    for (i, &(now, cost)) in case.arrivals.iter().enumerate() {
        let d = check(alg, &mut state, now, cost)?;
        let want = model.decide(now, cost);
        let got = Outcome {
            allowed: d.allowed,
            remaining: d.remaining,
            reset_after_ns: d.reset_after_ns,
        };
        prop_assert_eq!(got, want, "arrival #{} at {} of cost {}", i, now, cost);
        prop_assert_eq!(d.limit, n);
        if d.allowed {
            prop_assert_eq!(d.retry_after_ns, 0);
            model.admit(now, cost);
        } else {
            let retry = d.retry_after_ns;
            prop_assert!(retry > 0, "denied with no wait at #{}", i);
            prop_assert_eq!(
                now + retry,
                model.earliest(now, cost),
                "retry_after of #{} at {} of cost {}",
                i,
                now,
                cost
            );
            let mut probe = state.clone();
            prop_assert!(!check(alg, &mut probe, now + retry - 1, cost)?.allowed);
            prop_assert!(check(alg, &mut probe, now + retry, cost)?.allowed);
        }

        let reset = d.reset_after_ns;
        let idle = alg.idle_at(&state);
        if reset == 0 {
            prop_assert!(
                idle <= now,
                "idle_at {} after now {} with no reset",
                idle,
                now
            );
        } else {
            prop_assert_eq!(idle, now + reset, "idle_at after #{}", i);
            let mut probe = state.clone();
            let before = check(alg, &mut probe, now + reset - 1, 0)?;
            prop_assert!(before.remaining < n, "full before reset_after at #{}", i);
        }
        let mut probe = state.clone();
        let after = check(alg, &mut probe, now + reset, 0)?;
        prop_assert!(after.allowed);
        prop_assert_eq!(after.remaining, n, "not full at reset_after of #{}", i);
        prop_assert_eq!(after.reset_after_ns, 0);
        decisions.push(d);
    }
    model.check_guarantee()?;
    Ok(decisions)
}

/// Refunding one admission right after it (at any time up to the next arrival) must give the
/// same decisions from then on as never having made it, probed to the end of the schedule and
/// beyond with a query and a full-capacity request.
fn refund_undoes<A: Algorithm>(
    alg: &A,
    case: &Case,
    decisions: &[Decision],
) -> Result<(), TestCaseError> {
    let admitted: Vec<usize> = (0..decisions.len())
        .filter(|&i| decisions[i].allowed)
        .collect();
    prop_assert!(!admitted.is_empty(), "the first arrival is always admitted");
    let k = admitted[case.refund_pick % admitted.len()];
    let (t_k, c_k) = case.arrivals[k];
    let window = alg.quota().window_ns();
    let next = case.arrivals.get(k + 1).map_or(t_k + 2 * window, |a| a.0);
    let t_refund = t_k + case.refund_delay_pick % (next - t_k + 1);

    let mut refunded = alg.initial_state();
    let mut never = alg.initial_state();
    for &(now, cost) in &case.arrivals[..k] {
        check(alg, &mut refunded, now, cost)?;
        check(alg, &mut never, now, cost)?;
    }
    prop_assert!(check(alg, &mut refunded, t_k, c_k)?.allowed);
    alg.refund(&mut refunded, t_k, t_refund, c_k);

    let last = case.arrivals.last().map_or(0, |a| a.0).max(t_refund);
    let probes = [
        (last, 0),
        (last, alg.quota().capacity()),
        (last + window / 2, 1),
        (last + window + 1, 0),
    ];
    for (i, &(now, cost)) in case.arrivals[k + 1..].iter().chain(&probes).enumerate() {
        let a = check(alg, &mut refunded, now, cost)?;
        let b = check(alg, &mut never, now, cost)?;
        prop_assert_eq!(
            a,
            b,
            "after refunding #{} (at {}, cost {}) at {}: step {} at {} of cost {}",
            k,
            t_k,
            c_k,
            t_refund,
            i,
            now,
            cost
        );
        prop_assert!(a.remaining <= alg.quota().capacity());
    }
    Ok(())
}

fn conform_with_refund<A: Algorithm>(
    alg: &A,
    family: Family,
    case: &Case,
) -> Result<Vec<Decision>, TestCaseError> {
    let decisions = conform(alg, family, case)?;
    refund_undoes(alg, case, &decisions)?;
    Ok(decisions)
}

// === Properties ===

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket(case in case()) {
        conform_with_refund(&TokenBucket::new(case.quota()), Family::Bucket, &case)?;
    }

    #[test]
    fn gcra(case in case()) {
        conform_with_refund(&Gcra::new(case.quota()), Family::Bucket, &case)?;
    }

    #[test]
    fn leaky_bucket(case in case()) {
        conform_with_refund(&LeakyBucket::new(case.quota()), Family::Bucket, &case)?;
    }

    #[test]
    fn sliding_log(case in case()) {
        conform_with_refund(&SlidingLog::new(case.quota()), Family::SlidingLog, &case)?;
    }

    #[test]
    fn fixed_window(case in case()) {
        conform_with_refund(&FixedWindow::new(case.quota()), Family::FixedWindow, &case)?;
    }

    #[test]
    fn sliding_window(case in case()) {
        conform_with_refund(&SlidingWindow::new(case.quota()), Family::SlidingWindow, &case)?;
    }

    /// Token bucket, GCRA and leaky bucket are one meter written three ways: every field of
    /// every decision agrees.
    #[test]
    fn buckets_agree(case in case()) {
        let q = case.quota();
        let (tb, gcra, lb) = (TokenBucket::new(q), Gcra::new(q), LeakyBucket::new(q));
        let (mut s_tb, mut s_gcra, mut s_lb) =
            (tb.initial_state(), gcra.initial_state(), lb.initial_state());
        for (i, &(now, cost)) in case.arrivals.iter().enumerate() {
            let a = check(&tb, &mut s_tb, now, cost)?;
            let b = check(&gcra, &mut s_gcra, now, cost)?;
            let c = check(&lb, &mut s_lb, now, cost)?;
            prop_assert_eq!(a, b, "token_bucket vs gcra at #{}", i);
            prop_assert_eq!(a, c, "token_bucket vs leaky_bucket at #{}", i);
            prop_assert_eq!(tb.idle_at(&s_tb).max(now), gcra.idle_at(&s_gcra).max(now));
            prop_assert_eq!(tb.idle_at(&s_tb).max(now), lb.idle_at(&s_lb).max(now));
        }
    }

    /// Choosing by name changes nothing: `AnyAlgorithm` decides as the concrete type.
    #[test]
    fn any_algorithm_is_the_concrete_one(case in case(), which in 0..Kind::ALL.len()) {
        let kind = Kind::ALL[which];
        let q = case.quota();
        let any = AnyAlgorithm::new(kind, q);
        let mut state = any.initial_state();
        let mut concrete: Vec<Decision> = Vec::new();
        macro_rules! run {
            ($alg:expr) => {{
                let alg = $alg;
                let mut s = alg.initial_state();
                for &(now, cost) in &case.arrivals {
                    concrete.push(check(&alg, &mut s, now, cost)?);
                }
            }};
        }
        match kind {
            Kind::TokenBucket => run!(TokenBucket::new(q)),
            Kind::Gcra => run!(Gcra::new(q)),
            Kind::LeakyBucket => run!(LeakyBucket::new(q)),
            Kind::SlidingLog => run!(SlidingLog::new(q)),
            Kind::SlidingWindow => run!(SlidingWindow::new(q)),
            Kind::FixedWindow => run!(FixedWindow::new(q)),
        }
        for (i, &(now, cost)) in case.arrivals.iter().enumerate() {
            prop_assert_eq!(check(&any, &mut state, now, cost)?, concrete[i], "{} at #{}", kind, i);
        }
    }
}
