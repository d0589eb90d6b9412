//! The `extern "C"` exports: numbers in, numbers out, over the instance's [`Bank`].
//!
//! Compiled for wasm32 only. Times and durations are `i64` nanoseconds (JavaScript `BigInt`);
//! negative times count as 0. Single results go to `out`, [`OUT_SLOTS`] `f64` at a fixed
//! address (`sj_out`); poll outcomes to `list` (`sj_list`, `sj_list_len`; its address may
//! change on every call); text arguments are written into `input` (`sj_input`) first; the
//! last error's UTF-8 message is at `sj_error_ptr` / `sj_error_len`. The table is in
//! `packages/sluice-js/README.md` (section "The core").

use sluice_core::driven::{Delivery, Reason, Verdict};
use sluice_core::queue::{Priority, QueueConfig};
use sluice_core::{Kind, Quota, Rate};
use sluice_wasm_rt::{Buffers, Global};

use crate::bank::Bank;

sluice_wasm_rt::runtime!();

/// The version of this ABI; the JavaScript side refuses a module of another version.
///
/// 3: `sj_charge` and `sj_refund`.
pub const ABI_VERSION: u32 = 3;

/// Slots in the `out` area.
pub const OUT_SLOTS: usize = 4;

/// Floats per outcome in `list`: `ticket, code (0 admitted, 1 timed out, 2 closed),
/// retry_after_ns`.
pub const OUTCOME_STRIDE: usize = 3;

struct Globals {
    bank: Option<Bank>,
    io: Buffers<OUT_SLOTS>,
}

static GLOBALS: Global<Globals> = Global::new(Globals {
    bank: None,
    io: Buffers::new(),
});

/// Runs `f` on the module's state.
fn with<R>(f: impl FnOnce(&mut Globals) -> R) -> R {
    GLOBALS.with(f)
}

impl Globals {
    fn bank(&mut self) -> &mut Bank {
        self.bank.get_or_insert_with(Bank::default)
    }
}

/// Nanoseconds from JavaScript: negatives are 0.
fn ns(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The priority of a code: 0 high, 1 normal, 2 low; anything else is normal.
fn priority(code: u32) -> Priority {
    match code {
        0 => Priority::High,
        2 => Priority::Low,
        _ => Priority::Normal,
    }
}

/// The ABI version, [`ABI_VERSION`].
#[no_mangle]
pub extern "C" fn sj_abi_version() -> u32 {
    ABI_VERSION
}

/// The address of the `out` area; it never moves.
#[no_mangle]
pub extern "C" fn sj_out() -> *const f64 {
    with(|g| g.io.out.as_ptr())
}

/// The address of the `list` (valid until the next call).
#[no_mangle]
pub extern "C" fn sj_list() -> *const f64 {
    with(|g| g.io.list.as_ptr())
}

/// Floats in the `list`.
#[no_mangle]
pub extern "C" fn sj_list_len() -> u32 {
    with(|g| g.io.list.len() as u32)
}

/// Makes room for `len` input bytes and returns their address.
#[no_mangle]
pub extern "C" fn sj_input(len: u32) -> *mut u8 {
    with(|g| g.io.input(len))
}

/// The address of the last error message.
#[no_mangle]
pub extern "C" fn sj_error_ptr() -> *const u8 {
    with(|g| g.io.error.as_ptr())
}

/// The length in bytes of the last error message.
#[no_mangle]
pub extern "C" fn sj_error_len() -> u32 {
    with(|g| g.io.error.len() as u32)
}

/// The input as an algorithm name (`token_bucket`, `gcra`, ...): its index in the core's
/// `Kind::ALL`, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sj_parse_kind(len: u32) -> i32 {
    with(|g| match g.io.input_str(len).map(str::parse::<Kind>) {
        Some(Ok(kind)) => Kind::ALL
            .iter()
            .position(|k| *k == kind)
            .map_or(-1, |i| i as i32),
        Some(Err(e)) => {
            g.io.fail(e);
            -1
        }
        None => {
            g.io.fail("algorithm name is not UTF-8");
            -1
        }
    })
}

/// The input as a rate (`"5/s"`, `"10 per 90s"`), parsed as the gateway parses it: the
/// interval between tokens in ns, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sj_parse_rate(len: u32) -> i64 {
    with(|g| match g.io.input_str(len).map(str::parse::<Rate>) {
        Some(Ok(rate)) => i64::try_from(rate.interval_ns()).unwrap_or(i64::MAX),
        Some(Err(e)) => {
            g.io.fail(e);
            -1
        }
        None => {
            g.io.fail("rate is not UTF-8");
            -1
        }
    })
}

/// A new limiter: algorithm code, capacity, one token every `interval_ns`, queue depth (0: no
/// queue) and maximum wait. Its handle, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sj_create(
    kind: u32,
    capacity: i64,
    interval_ns: i64,
    depth: u32,
    max_wait_ns: i64,
) -> i32 {
    with(
        |g| match config(g, kind, capacity, interval_ns, depth, max_wait_ns) {
            Some((kind, quota, queue)) => g.bank().create(kind, quota, queue) as i32,
            None => -1,
        },
    )
}

/// The quota and queue of a limiter, from arguments as [`sj_create`] takes them.
fn config(
    g: &mut Globals,
    kind: u32,
    capacity: i64,
    interval_ns: i64,
    depth: u32,
    max_wait_ns: i64,
) -> Option<(Kind, Quota, QueueConfig)> {
    let Some(kind) = Kind::ALL.get(kind as usize).copied() else {
        g.io.fail(format_args!("unknown algorithm code {kind}"));
        return None;
    };
    let quota =
        Rate::from_interval_ns(ns(interval_ns)).and_then(|rate| Quota::new(ns(capacity), rate));
    match quota {
        Ok(quota) => Some((
            kind,
            quota,
            QueueConfig {
                depth: depth as usize,
                max_wait_ns: ns(max_wait_ns),
            },
        )),
        Err(e) => {
            g.io.fail(e);
            None
        }
    }
}

/// Changes a limiter's algorithm, quota and queue at `now_ns` (arguments as [`sj_create`]),
/// converting its bucket so that it gains no tokens. 0 done, -1 invalid (message in `error`)
/// or no such limiter, -2 requests wait on it (withdraw them first).
#[no_mangle]
pub extern "C" fn sj_reconfigure(
    handle: u32,
    now_ns: i64,
    kind: u32,
    capacity: i64,
    interval_ns: i64,
    depth: u32,
    max_wait_ns: i64,
) -> i32 {
    with(|g| {
        let Some((kind, quota, queue)) = config(g, kind, capacity, interval_ns, depth, max_wait_ns)
        else {
            return -1;
        };
        match g.bank().reconfigure(handle, ns(now_ns), kind, quota, queue) {
            Ok(true) => 0,
            Ok(false) => {
                g.io.fail("no such limiter");
                -1
            }
            Err(_) => -2,
        }
    })
}

/// Makes a limiter afresh, its configuration kept: a full bucket, or with `until_ns` later
/// than `now_ns` the fullest one that is full again no earlier than then (a forgotten key's
/// return). 0 done, -1 no such limiter.
#[no_mangle]
pub extern "C" fn sj_reset(handle: u32, now_ns: i64, until_ns: i64) -> i32 {
    with(|g| {
        if g.bank().reset(handle, ns(now_ns), ns(until_ns)) {
            0
        } else {
            -1
        }
    })
}

/// [`sj_reset`] for a limiter passed from one key to the next: returns the ns until its bucket
/// was full again as of `now_ns` (0: full; what the key it held must be remembered by), then
/// makes it afresh as `sj_reset` does. -1: no such limiter.
#[no_mangle]
pub extern "C" fn sj_recycle(handle: u32, now_ns: i64, until_ns: i64) -> i64 {
    with(|g| {
        let now = ns(now_ns);
        let Some(limiter) = g.bank().get_mut(handle) else {
            return -1;
        };
        let until_full = limiter.status(now).reset_after_ns;
        g.bank().reset(handle, now, ns(until_ns));
        i64::try_from(until_full).unwrap_or(i64::MAX)
    })
}

/// The gateway's keyed hash ([`crate::key_hash`]) of the input, read as `salt_len` bytes of
/// salt followed by `key_len` bytes of key. Its 16 bytes replace the input; returns their
/// address, or null when the input is shorter than said.
#[no_mangle]
pub extern "C" fn sj_key_hash(salt_len: u32, key_len: u32) -> *const u8 {
    with(|g| {
        let (salt_len, key_len) = (salt_len as usize, key_len as usize);
        let Some(end) = salt_len.checked_add(key_len) else {
            return core::ptr::null();
        };
        let Some(input) = g.io.input.get(..end) else {
            return core::ptr::null();
        };
        let digest = crate::key_hash(&input[..salt_len], &input[salt_len..]);
        g.io.input.clear();
        g.io.input.extend_from_slice(&digest);
        g.io.input.as_ptr()
    })
}

/// Removes a limiter: 1 if it existed.
#[no_mangle]
pub extern "C" fn sj_drop(handle: u32) -> i32 {
    with(|g| i32::from(g.bank().drop_limiter(handle)))
}

/// Offers `cost` at `now_ns` and `priority` (0 high, 1 normal, 2 low). `max_wait_ns` below
/// zero means the queue's own; 0 means never queue. Returns 0 admitted, 1 queued, 2 limited,
/// 3 queue full, 4 timeout, 5 cost above capacity, 6 closed, -1 no such limiter. `out[0]`
/// ticket, `out[1]` predicted wait (queued) or retry after (denied) in ns, `out[2]` tokens
/// left (admitted).
#[no_mangle]
pub extern "C" fn sj_offer(
    handle: u32,
    now_ns: i64,
    cost: i64,
    priority_code: u32,
    max_wait_ns: i64,
) -> i32 {
    with(|g| {
        let Some(limiter) = g.bank().get_mut(handle) else {
            return -1;
        };
        let max_wait = (max_wait_ns >= 0).then_some(max_wait_ns as u64);
        let verdict = limiter.offer(ns(now_ns), ns(cost), 0, priority(priority_code), max_wait);
        let (code, out) = verdict_out(verdict);
        g.io.out = out;
        code
    })
}

/// [`sj_offer`] for a request that may not wait, at normal priority (`tryAcquire`): the same
/// codes and `out`, refused with less work when too few tokens are left and nothing waits
/// ([`Bank::try_take`]).
#[no_mangle]
pub extern "C" fn sj_try(handle: u32, now_ns: i64, cost: i64) -> i32 {
    with(|g| {
        let Some(verdict) = g.bank().try_take(handle, ns(now_ns), ns(cost)) else {
            return -1;
        };
        let (code, out) = verdict_out(verdict);
        g.io.out = out;
        code
    })
}

/// Takes `cost` at `now_ns` without asking ([`Bank::charge`]): a bucket goes up to `max_debt`
/// tokens beyond empty (below zero: no cap) and refuses every offer until the refill has paid
/// the debt; a window takes what it has left. Returns the part of `cost` forgiven (0: all of
/// it taken), -1 without such a limiter, -2 while requests wait on it (withdraw them first,
/// then offer them again).
#[no_mangle]
pub extern "C" fn sj_charge(handle: u32, now_ns: i64, cost: i64, max_debt: i64) -> i64 {
    with(|g| {
        let max_debt = u64::try_from(max_debt).unwrap_or(u64::MAX);
        match g.bank().charge(handle, ns(now_ns), ns(cost), max_debt) {
            Some(Ok(forgiven)) => i64::try_from(forgiven).unwrap_or(i64::MAX),
            Some(Err(_)) => -2,
            None => -1,
        }
    })
}

/// Gives back `cost` admitted `ago_ns` before `now_ns` that will never be used
/// ([`Bank::refund`]: never beyond a full bucket). 0 done, -1 without such a limiter, -2 while
/// requests wait on it (withdraw them first, then offer them again).
#[no_mangle]
pub extern "C" fn sj_refund(handle: u32, now_ns: i64, cost: i64, ago_ns: i64) -> i32 {
    with(
        |g| match g.bank().refund(handle, ns(now_ns), ns(cost), ns(ago_ns)) {
            Some(Ok(())) => 0,
            Some(Err(_)) => -2,
            None => -1,
        },
    )
}

/// The code and `out` of a verdict, as [`sj_offer`] reports them.
fn verdict_out(verdict: Verdict) -> (i32, [f64; OUT_SLOTS]) {
    match verdict {
        Verdict::Admitted { remaining, .. } => (0, [0.0, 0.0, remaining as f64, 0.0]),
        Verdict::Queued { ticket, wait_ns } => (1, [ticket as f64, wait_ns as f64, 0.0, 0.0]),
        Verdict::Rejected {
            reason,
            retry_after_ns,
        } => {
            let code = match reason {
                Reason::Limited => 2,
                Reason::QueueFull => 3,
                Reason::Timeout => 4,
                Reason::TooCostly => 5,
                Reason::Closed => 6,
            };
            (code, [0.0, retry_after_ns as f64, 0.0, 0.0])
        }
    }
}

fn write_outcomes(g: &mut Globals, handle: u32) {
    let mut list = core::mem::take(&mut g.io.list);
    list.clear();
    if let Some(limiter) = g.bank().get_mut(handle) {
        for d in limiter.outcomes() {
            let (code, retry) = match d.delivery {
                Delivery::Admitted => (0.0, 0),
                Delivery::TimedOut { retry_after_ns } => (1.0, retry_after_ns),
                Delivery::Closed => (2.0, 0),
            };
            list.extend([d.ticket as f64, code, retry as f64]);
        }
    }
    g.io.list = list;
}

/// Admits and times out waiters as of `now_ns`. Returns when to poll next (ns), or -1 when
/// nobody waits. Outcomes in `list`, [`OUTCOME_STRIDE`] floats each.
#[no_mangle]
pub extern "C" fn sj_poll(handle: u32, now_ns: i64) -> i64 {
    with(|g| {
        let wake = match g.bank().get_mut(handle) {
            Some(limiter) => limiter.poll(ns(now_ns)),
            None => None,
        };
        write_outcomes(g, handle);
        wake.map_or(-1, |w| i64::try_from(w).unwrap_or(i64::MAX))
    })
}

/// Withdraws a waiting request (it spent nothing): 1 if it was waiting.
#[no_mangle]
pub extern "C" fn sj_cancel(handle: u32, ticket: f64) -> i32 {
    with(|g| match g.bank().get_mut(handle) {
        Some(limiter) if ticket >= 0.0 => i32::from(limiter.cancel(ticket as u64)),
        _ => 0,
    })
}

/// Turns every waiter away (outcomes in `list`) and refuses new offers. The number of
/// outcomes.
#[no_mangle]
pub extern "C" fn sj_close(handle: u32) -> u32 {
    with(|g| {
        if let Some(limiter) = g.bank().get_mut(handle) {
            limiter.close();
        }
        write_outcomes(g, handle);
        (g.io.list.len() / OUTCOME_STRIDE) as u32
    })
}

/// The bucket as of `now_ns` into `out`: `[0]` whole tokens, `[1]` capacity, `[2]` waiting,
/// `[3]` ns until full (0: full). 0, or -1 without such a limiter.
#[no_mangle]
pub extern "C" fn sj_status(handle: u32, now_ns: i64) -> i32 {
    with(|g| {
        let Some(limiter) = g.bank().get_mut(handle) else {
            return -1;
        };
        let st = limiter.status(ns(now_ns));
        g.io.out = [
            st.remaining as f64,
            st.limit as f64,
            st.queued as f64,
            st.reset_after_ns as f64,
        ];
        0
    })
}
