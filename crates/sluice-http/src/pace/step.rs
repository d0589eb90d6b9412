//! The pacing step: what a client may send now, given what servers said. Pure functions over
//! the state and a `now` in ms from the layer's start, handed in by the caller; no clock, no
//! timer. The same rules as the npm package's `src/pacing.js`.

use std::collections::BTreeMap;

use crate::pace::fields::{Family, Reading};

/// After a reset, wait this much longer before spending the new quota (the server's reset may
/// lag the client's reading of it).
pub(crate) const RESET_MARGIN_MS: f64 = 25.0;
/// A 429 without `Retry-After` and without a spent limit: wait this, doubling up to 60 s.
const BACKOFF_MS: f64 = 1000.0;
const BACKOFF_MAX_MS: f64 = 60_000.0;
/// Resets that moved by less than this name the same window (resets come in whole seconds).
const SAME_WINDOW_MS: f64 = 1100.0;

/// One quota a server announced, as the client keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Limit {
    pub(crate) unit: String,
    pub(crate) limit: Option<f64>,
    pub(crate) window_ms: Option<f64>,
    window_stated: bool,
    pub(crate) remaining: Option<f64>,
    pub(crate) reset_at: Option<f64>,
    next: Option<f64>,
    at: f64,
    pub(crate) inflight: f64,
    seq: u64,
    continuous: bool,
    /// The IETF fields' `t`: an effective window (draft 12), past which the quota is unknown
    /// until an answer tells, not a reset after which it is back.
    effective: bool,
    configured: bool,
}

/// Every limit of a server, and what holds them all back.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    seq: u64,
    /// The units the server announced a limit in: a configured limit of such a unit no longer
    /// applies (one of a unit the server is silent about still does).
    heard: Vec<String>,
    answered: bool,
    inflight: u32,
    pub(crate) blocked_until: f64,
    backoff_ms: f64,
    pub(crate) limits: BTreeMap<String, Limit>,
}

/// What a request spends, per unit: requests count 1 by themselves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cost {
    /// Declared tokens (an LLM call's estimate); they also stand for input and output tokens
    /// when those are not declared apart.
    pub tokens: Option<u64>,
    /// Other units by name (`input-tokens`, `output-tokens`, an IETF `qu`).
    pub other: Vec<(String, u64)>,
}

impl Cost {
    /// A cost of `tokens` tokens.
    pub fn tokens(tokens: u64) -> Cost {
        Cost {
            tokens: Some(tokens),
            other: Vec::new(),
        }
    }

    fn of(&self, unit: &str) -> f64 {
        if unit == "requests" {
            return 1.0;
        }
        if let Some((_, c)) = self.other.iter().find(|(u, _)| u == unit) {
            return *c as f64;
        }
        match (unit, self.tokens) {
            ("tokens" | "input-tokens" | "output-tokens", Some(t)) => t as f64,
            _ => 0.0,
        }
    }
}

/// What admit() granted: settled by observe() or abandon(), once.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    seq: u64,
    spent: Vec<(String, f64)>,
    /// Whether the request declared a cost besides its count (tokens, another unit).
    declared: bool,
}

impl Grant {
    /// Whether the request declared a cost besides its count, to be reconciled.
    pub(crate) fn declares_tokens(&self) -> bool {
        self.declared
    }
}

impl State {
    /// A state with the limits that hold while the server says nothing: `(unit, limit, window ms)`.
    pub(crate) fn new(configured: &[(String, u64, f64)], now: f64) -> State {
        let mut state = State::default();
        for (unit, limit, window) in configured {
            state.limits.insert(
                format!("configured:{unit}"),
                Limit {
                    unit: unit.clone(),
                    limit: Some(*limit as f64),
                    window_ms: Some(*window),
                    window_stated: true,
                    remaining: Some(*limit as f64),
                    reset_at: Some(now + window),
                    next: Some(now),
                    at: now,
                    inflight: 0.0,
                    seq: 0,
                    continuous: false,
                    effective: false,
                    configured: true,
                },
            );
        }
        state
    }
}

fn roll(l: &mut Limit, now: f64) {
    let Some(reset_at) = l.reset_at else { return };
    if now < reset_at + RESET_MARGIN_MS {
        if let (true, Some(limit), Some(rem)) = (l.continuous, l.limit, l.remaining) {
            if rem < limit && now > l.at {
                l.remaining =
                    Some(rem + (limit - rem) * (now - l.at) / (reset_at + RESET_MARGIN_MS - l.at));
                l.at = now;
            }
        }
        return;
    }
    // A quota never stated, or an IETF effective window past, is unknown again: the next
    // answer tells (one request at a time).
    if l.effective {
        l.remaining = None;
        l.reset_at = None;
        l.next = None; // the answer's figure starts a new spread, its request the first step
        l.at = now;
        return;
    }
    l.remaining = l.limit.map(|limit| (limit - l.inflight).max(0.0));
    l.reset_at = l
        .window_ms
        .filter(|w| *w > 0.0)
        .map(|w| reset_at + (((now - reset_at) / w).floor() + 1.0) * w);
    l.next = Some(now);
    l.at = now;
}

/// One try to send a request of `cost`: a grant, or the ms to wait (infinite: until an answer).
pub(crate) fn admit(state: &mut State, now: f64, cost: &Cost) -> Result<Grant, f64> {
    if now < state.blocked_until {
        return Err(state.blocked_until - now);
    }
    if !state.answered && state.inflight > 0 && state.limits.is_empty() {
        return Err(f64::INFINITY);
    }
    let mut wait = 0f64;
    let mut charges = Vec::new();
    for (key, l) in state.limits.iter_mut() {
        if l.configured && state.heard.contains(&l.unit) {
            continue;
        }
        let c = cost.of(&l.unit);
        if c == 0.0 && l.unit != "requests" {
            continue;
        }
        roll(l, now);
        if let Some(rem) = l.remaining.filter(|r| *r < c) {
            match (l.reset_at, l.continuous, l.limit) {
                (Some(reset), true, Some(limit)) if limit > rem => {
                    wait = wait.max((c - rem) * (reset + RESET_MARGIN_MS - now) / (limit - rem));
                }
                (Some(reset), _, _) => wait = wait.max(reset + RESET_MARGIN_MS - now),
                (None, _, _) if l.inflight > 0.0 => wait = f64::INFINITY,
                _ => {}
            }
            continue;
        }
        if l.remaining.is_none() && (l.limit.is_none() || l.effective) && l.inflight > 0.0 {
            wait = f64::INFINITY;
        }
        if let Some(next) = l.next.filter(|n| *n > now) {
            wait = wait.max(next - now);
        }
        charges.push((key.clone(), c));
    }
    if wait > 0.0 {
        return Err(wait);
    }
    state.seq += 1;
    for (key, c) in &charges {
        let l = state.limits.get_mut(key).expect("charged limits exist");
        let before = l.remaining;
        if let Some(b) = before {
            l.remaining = Some(b - c);
        }
        l.inflight += c;
        if let (Some(reset), Some(b)) = (l.reset_at, before.filter(|b| *b > 0.0)) {
            let step = (reset - now) * c / b;
            l.next = Some(l.next.unwrap_or(now).max(now - step) + step);
        }
    }
    state.inflight += 1;
    Ok(Grant {
        seq: state.seq,
        spent: charges,
        declared: cost.tokens.is_some_and(|t| t > 0) || cost.other.iter().any(|(_, c)| *c > 0),
    })
}

/// Gives back a grant's in-flight counts.
pub(crate) fn abandon(state: &mut State, grant: &Grant) {
    state.inflight = state.inflight.saturating_sub(1);
    for (key, c) in &grant.spent {
        if let Some(l) = state.limits.get_mut(key) {
            l.inflight = (l.inflight - c).max(0.0);
        }
    }
}

/// Reconciles a grant's declared cost with what the request used (`used`, e.g. from the
/// response's usage), for the limits whose latest figure came before the request (a figure
/// that came with its answer, or after, already counts what it used): the difference goes
/// back to (or is taken from) what remains.
pub(crate) fn reconcile(state: &mut State, grant: &Grant, used: &Cost) {
    for (key, declared) in &grant.spent {
        let Some(l) = state.limits.get_mut(key) else {
            continue;
        };
        if l.unit == "requests" || l.seq >= grant.seq {
            continue;
        }
        if let Some(rem) = l.remaining {
            l.remaining = Some((rem + declared - used.of(&l.unit)).max(0.0));
        }
    }
}

/// An answer to the request of `grant` (or to one the pacer did not send): its limits replace
/// what was known, less what else is in flight; a 429 or a `Retry-After` holds every request
/// back (Retry-After, else the reset of a spent limit, else a doubling backoff).
pub(crate) fn observe(
    state: &mut State,
    now: f64,
    reading: &Reading,
    status: u16,
    grant: Option<&Grant>,
) {
    if let Some(g) = grant {
        abandon(state, g);
    }
    state.answered = true;
    let seq = grant.map_or(state.seq, |g| g.seq);
    let mut spent_reset: Option<f64> = None;
    let family = reading.family.map_or("none", |f| f.name());
    for r in &reading.limits {
        let l = state
            .limits
            .entry(format!("{family}:{}", r.id))
            .or_insert_with(|| Limit {
                unit: r.unit.clone(),
                limit: None,
                window_ms: None,
                window_stated: false,
                remaining: None,
                reset_at: None,
                next: None,
                at: now,
                inflight: 0.0,
                seq: 0,
                continuous: false,
                effective: false,
                configured: false,
            });
        if !state.heard.contains(&r.unit) {
            state.heard.push(r.unit.clone());
        }
        l.continuous = r.continuous;
        l.effective = reading.family == Some(Family::Ietf);
        if let Some(limit) = r.limit {
            l.limit = Some(limit as f64);
        }
        let reset_ms = r.reset.map(|d| d.as_secs_f64() * 1000.0);
        if let Some(w) = r.window {
            l.window_ms = Some(w.as_secs_f64() * 1000.0);
            l.window_stated = true;
        } else if let Some(t) =
            reset_ms.filter(|t| !l.window_stated && *t > l.window_ms.unwrap_or(0.0))
        {
            l.window_ms = Some(t);
        }
        let reset_at = match reset_ms {
            Some(t) => Some(now + t),
            None => l.window_ms.map(|w| now + w),
        };
        let same =
            matches!((reset_at, l.reset_at), (Some(a), Some(b)) if (a - b).abs() <= SAME_WINDOW_MS);
        if seq < l.seq && (same || reset_at.is_none()) {
            continue;
        }
        l.seq = l.seq.max(seq);
        l.reset_at = reset_at;
        if let Some(rem) = r.remaining {
            let rem = (rem as f64 - l.inflight).max(0.0);
            l.remaining = Some(rem);
            l.at = now;
            if let (Some(reset), true) = (l.reset_at, rem > 0.0) {
                let slot = now + (reset - now) / (rem + 1.0);
                l.next = Some(l.next.map_or(slot, |n| n.min(slot)));
            }
            if r.remaining == Some(0) {
                if let Some(reset) = l.reset_at {
                    spent_reset = Some(spent_reset.map_or(reset, |s: f64| s.max(reset)));
                }
            }
        }
        if l.next.is_none() {
            l.next = Some(now);
        }
    }
    if let Some(ra) = reading.retry_after {
        state.blocked_until = state.blocked_until.max(now + ra.as_secs_f64() * 1000.0);
    } else if status == 429 {
        if let Some(reset) = spent_reset {
            state.blocked_until = state.blocked_until.max(reset + RESET_MARGIN_MS);
        } else {
            state.backoff_ms = if state.backoff_ms > 0.0 {
                (state.backoff_ms * 2.0).min(BACKOFF_MAX_MS)
            } else {
                BACKOFF_MS
            };
            state.blocked_until = state.blocked_until.max(now + state.backoff_ms);
        }
    }
    if status != 429 {
        state.backoff_ms = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pace::fields::{Family, ServerLimit};

    fn ietf(limit: u64, window_s: u64, remaining: u64, reset_s: u64) -> Reading {
        Reading {
            family: Some(Family::Ietf),
            limits: vec![ServerLimit {
                id: "p".into(),
                unit: "requests".into(),
                limit: Some(limit),
                window: Some(Duration::from_secs(window_s)),
                remaining: Some(remaining),
                reset: Some(Duration::from_secs(reset_s)),
                continuous: false,
            }],
            retry_after: None,
            skew_ms: None,
        }
    }

    /// Admission times of `n` requests from `from`, each admitted as soon as allowed.
    fn admissions(state: &mut State, n: usize, from: f64) -> Vec<f64> {
        let mut now = from;
        let mut out = Vec::new();
        while out.len() < n {
            match admit(state, now, &Cost::default()) {
                Ok(g) => {
                    out.push(now.round());
                    abandon(state, &g);
                }
                Err(w) => {
                    assert!(w.is_finite() && w > 0.0, "wait {w}");
                    now += w;
                }
            }
        }
        out
    }

    #[test]
    fn spreads_what_remains_until_the_reset() {
        let mut s = State::default();
        let g = admit(&mut s, 0.0, &Cost::default()).unwrap();
        assert_eq!(
            admit(&mut s, 0.0, &Cost::default()).unwrap_err(),
            f64::INFINITY,
            "one at a time before any answer"
        );
        observe(&mut s, 0.0, &ietf(5, 2, 4, 2), 200, Some(&g));
        // 4 left over 2 s after the first: every 400 ms.
        assert_eq!(
            admissions(&mut s, 4, 0.0),
            vec![400.0, 800.0, 1200.0, 1600.0]
        );
        // Spent: wait for the reset and its margin.
        assert_eq!(
            admit(&mut s, 1700.0, &Cost::default()).unwrap_err(),
            2000.0 + RESET_MARGIN_MS - 1700.0
        );
    }

    #[test]
    fn a_429_with_retry_after_wins_over_a_remaining() {
        let mut s = State::default();
        let g = admit(&mut s, 0.0, &Cost::default()).unwrap();
        let mut r = ietf(100, 60, 50, 60);
        r.retry_after = Some(Duration::from_secs(30));
        observe(&mut s, 0.0, &r, 429, Some(&g));
        assert_eq!(admit(&mut s, 0.0, &Cost::default()).unwrap_err(), 30_000.0);
        // And without anything: 1 s, then 2 s.
        let mut bare = State::default();
        for expected in [1000.0, 2000.0] {
            let now = bare.blocked_until;
            let g = admit(&mut bare, now, &Cost::default()).unwrap();
            observe(&mut bare, now, &Reading::default(), 429, Some(&g));
            assert_eq!(
                admit(&mut bare, now, &Cost::default()).unwrap_err(),
                expected
            );
        }
    }

    #[test]
    fn token_costs_wait_on_a_continuous_limit_for_the_part_missing() {
        let mut s = State::default();
        let g = admit(&mut s, 0.0, &Cost::default()).unwrap();
        let reading = Reading {
            family: Some(Family::OpenAi),
            limits: vec![ServerLimit {
                id: "tokens".into(),
                unit: "tokens".into(),
                limit: Some(10_000),
                window: None,
                remaining: Some(500),
                reset: Some(Duration::from_millis(9500)),
                continuous: true,
            }],
            retry_after: None,
            skew_ms: None,
        };
        observe(&mut s, 0.0, &reading, 200, Some(&g));
        let cost = Cost {
            tokens: Some(1000),
            other: vec![],
        };
        let wait = admit(&mut s, 0.0, &cost).unwrap_err();
        assert!(
            (wait - 500.0 * (9500.0 + RESET_MARGIN_MS) / 9500.0).abs() < 1e-6,
            "{wait}"
        );
        // A request without a token cost is not held by it.
        assert!(admit(&mut s, 0.0, &Cost::default()).is_ok());
    }

    #[test]
    fn past_an_ietf_effective_window_one_request_learns_the_quota() {
        let mut s = State::default();
        let g = admit(&mut s, 0.0, &Cost::default()).unwrap();
        observe(&mut s, 0.0, &ietf(2, 1, 1, 1), 200, Some(&g));
        let spent = admit(&mut s, 600.0, &Cost::default()).unwrap();
        abandon(&mut s, &spent);
        assert!(admit(&mut s, 700.0, &Cost::default()).is_err(), "spent");
        // Past the window (and its margin): the policy's q is not assumed back (draft 12).
        let probe = admit(&mut s, 1100.0, &Cost::default()).unwrap();
        assert_eq!(
            admit(&mut s, 1100.0, &Cost::default()).unwrap_err(),
            f64::INFINITY
        );
        observe(&mut s, 1110.0, &ietf(2, 1, 1, 1), 200, Some(&probe));
        assert_eq!(
            admit(&mut s, 1110.0, &Cost::default()).unwrap_err(),
            500.0,
            "its answer starts a new spread, its request the first step"
        );
    }

    #[test]
    fn a_declared_cost_is_reconciled_unless_the_server_counted_it_since() {
        let mut s = State::new(&[("tokens".to_owned(), 1000, 10_000.0)], 0.0);
        let g = admit(&mut s, 0.0, &Cost::tokens(300)).unwrap();
        // An answer without token fields: the configured token limit still holds.
        let requests_only = Reading {
            family: Some(Family::OpenAi),
            limits: vec![ServerLimit {
                id: "requests".into(),
                unit: "requests".into(),
                limit: Some(100),
                window: None,
                remaining: Some(99),
                reset: Some(Duration::from_secs(1)),
                continuous: true,
            }],
            retry_after: None,
            skew_ms: None,
        };
        observe(&mut s, 5.0, &requests_only, 200, Some(&g));
        assert_eq!(s.limits["configured:tokens"].remaining, Some(700.0));
        reconcile(&mut s, &g, &Cost::tokens(100));
        assert_eq!(s.limits["configured:tokens"].remaining, Some(900.0));
        // A token limit the server announced with the answer already counts the use.
        let mut with_tokens = requests_only.clone();
        with_tokens.limits.push(ServerLimit {
            id: "tokens".into(),
            unit: "tokens".into(),
            limit: Some(10_000),
            window: None,
            remaining: Some(9_000),
            reset: Some(Duration::from_secs(6)),
            continuous: true,
        });
        let first = admit(&mut s, 2000.0, &Cost::default()).unwrap();
        observe(&mut s, 2000.0, &with_tokens, 200, Some(&first));
        let t = admit(&mut s, 3000.0, &Cost::tokens(300)).unwrap();
        with_tokens.limits[1].remaining = Some(8_800);
        observe(&mut s, 3010.0, &with_tokens, 200, Some(&t));
        reconcile(&mut s, &t, &Cost::tokens(100));
        assert_eq!(s.limits["openai:tokens"].remaining, Some(8_800.0));
    }
}
