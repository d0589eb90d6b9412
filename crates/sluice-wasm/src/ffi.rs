//! The `extern "C"` exports: numbers in, numbers out, over one [`Limiter`] per instance.
//!
//! Compiled for wasm32 only. Each export converts its arguments, calls the safe layer and
//! writes results into buffers in linear memory that JavaScript reads with typed arrays:
//!
//! - `out`: [`OUT_SLOTS`] `f64` at a fixed address (`sluice_out`), for single results;
//! - `list`: a growable `f64` list (`sluice_list`, `sluice_list_len`) for poll outcomes and
//!   snapshots. Its address may change on every call: read it again after each one;
//! - `input` / `input_f64`: buffers JavaScript fills before a call that reads them;
//! - `error`: the UTF-8 message of the last failed call.
//!
//! The full table, with codes and slot meanings, is in `web/README.md`.

use alloc::vec::Vec;

use sluice_core::driven::{Delivery, Limiter, Reason, RestoreError, Verdict};
use sluice_core::queue::QueueConfig;
use sluice_core::{Kind, Quota, Rate};
use sluice_wasm_rt::{Buffers, Global};

use crate::codes::{
    interval_from_per_second, kind_code, kind_from_code, ms_to_ns, ns_to_ms, ns_to_ms_ceil,
    priority_from_code, up_f64, whole, OfferCode, OutcomeCode,
};
use crate::record;

sluice_wasm_rt::runtime!();

/// The version of this ABI; the JavaScript wrapper refuses a module of another version.
pub const ABI_VERSION: u32 = 2;

/// Slots in the `out` area.
pub const OUT_SLOTS: usize = 8;

/// Floats per outcome record in `list` after `sluice_poll` / `sluice_close`:
/// `ticket, code, retry_after_ms`.
pub const OUTCOME_STRIDE: usize = 3;

struct Globals {
    limiter: Option<Limiter>,
    io: Buffers<OUT_SLOTS>,
    input_f64: Vec<f64>,
}

static GLOBALS: Global<Globals> = Global::new(Globals {
    limiter: None,
    io: Buffers::new(),
    input_f64: Vec::new(),
});

/// Runs `f` on the module's state.
fn with<R>(f: impl FnOnce(&mut Globals) -> R) -> R {
    GLOBALS.with(f)
}

impl Globals {
    fn create(
        &mut self,
        kind: u32,
        capacity: f64,
        rate: Result<Rate, sluice_core::QuotaError>,
        depth: u32,
        max_wait_ms: f64,
    ) -> i32 {
        let Some(kind) = kind_from_code(kind) else {
            self.io.fail(format_args!("unknown algorithm code {kind}"));
            return -1;
        };
        let Some(capacity) = whole(capacity) else {
            self.io.fail(format_args!(
                "capacity must be a whole number of at least 1"
            ));
            return -1;
        };
        if max_wait_ms.is_nan() || max_wait_ms < 0.0 {
            self.io
                .fail(format_args!("max_wait_ms must be zero or more"));
            return -1;
        }
        match rate.and_then(|r| Quota::new(capacity, r)) {
            Ok(quota) => {
                let queue = QueueConfig {
                    depth: depth as usize,
                    max_wait_ns: ms_to_ns(max_wait_ms),
                };
                self.limiter = Some(Limiter::new(kind, quota, queue));
                0
            }
            Err(e) => {
                self.io.fail(e);
                -1
            }
        }
    }
}

/// The ABI version, [`ABI_VERSION`].
#[no_mangle]
pub extern "C" fn sluice_abi_version() -> u32 {
    ABI_VERSION
}

/// The address of the `out` area ([`OUT_SLOTS`] `f64`); it never moves.
#[no_mangle]
pub extern "C" fn sluice_out() -> *const f64 {
    with(|g| g.io.out.as_ptr())
}

/// The address of the `list` (valid until the next call).
#[no_mangle]
pub extern "C" fn sluice_list() -> *const f64 {
    with(|g| g.io.list.as_ptr())
}

/// Floats in the `list`.
#[no_mangle]
pub extern "C" fn sluice_list_len() -> u32 {
    with(|g| g.io.list.len() as u32)
}

/// Makes room for `len` input bytes and returns their address, for JavaScript to write UTF-8
/// text into before `sluice_parse_rate` / `sluice_parse_kind`.
#[no_mangle]
pub extern "C" fn sluice_input_bytes(len: u32) -> *mut u8 {
    with(|g| g.io.input(len))
}

/// Makes room for `len` input floats and returns their address, for `sluice_restore`.
#[no_mangle]
pub extern "C" fn sluice_input_f64(len: u32) -> *mut f64 {
    with(|g| {
        g.input_f64.clear();
        g.input_f64.resize(len as usize, 0.0);
        g.input_f64.as_mut_ptr()
    })
}

/// The address of the last error message (UTF-8, `sluice_error_len` bytes).
#[no_mangle]
pub extern "C" fn sluice_error_ptr() -> *const u8 {
    with(|g| g.io.error.as_ptr())
}

/// The length in bytes of the last error message.
#[no_mangle]
pub extern "C" fn sluice_error_len() -> u32 {
    with(|g| g.io.error.len() as u32)
}

/// Reads the first `len` input bytes as an algorithm name (`token_bucket`, `gcra`, ...):
/// its code, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sluice_parse_kind(len: u32) -> i32 {
    with(|g| {
        let parsed = g.io.input_str(len).map(str::parse::<Kind>);
        match parsed {
            Some(Ok(kind)) => kind_code(kind) as i32,
            Some(Err(e)) => {
                g.io.fail(e);
                -1
            }
            None => {
                g.io.fail("algorithm name is not UTF-8");
                -1
            }
        }
    })
}

/// Reads the first `len` input bytes as a rate (`"5/s"`, `"10 per 90s"`) with the parser the
/// gateway uses: the interval between tokens in ns, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sluice_parse_rate(len: u32) -> f64 {
    with(|g| {
        let parsed = g.io.input_str(len).map(str::parse::<Rate>);
        match parsed {
            Some(Ok(rate)) => up_f64(rate.interval_ns()),
            Some(Err(e)) => {
                g.io.fail(e);
                -1.0
            }
            None => {
                g.io.fail("rate is not UTF-8");
                -1.0
            }
        }
    })
}

/// Creates the instance's limiter (replacing any): algorithm code, capacity, one token every
/// `interval_ns`, queue depth (0: no queue) and maximum wait. 0, or -1 (message in `error`).
#[no_mangle]
pub extern "C" fn sluice_create(
    kind: u32,
    capacity: f64,
    interval_ns: f64,
    depth: u32,
    max_wait_ms: f64,
) -> i32 {
    with(|g| {
        let rate = match whole(interval_ns) {
            Some(ns) => Rate::from_interval_ns(ns),
            None => Rate::from_interval_ns(0),
        };
        g.create(kind, capacity, rate, depth, max_wait_ms)
    })
}

/// As `sluice_create`, with the rate as tokens per second (`f64`, e.g. `0.5`), converted as
/// the core's `Rate::from_per_second_f64` does.
#[no_mangle]
pub extern "C" fn sluice_create_per_second(
    kind: u32,
    capacity: f64,
    per_second: f64,
    depth: u32,
    max_wait_ms: f64,
) -> i32 {
    with(|g| {
        let rate = match interval_from_per_second(per_second) {
            Some(ns) => Rate::from_interval_ns(ns),
            None => {
                g.io.fail(
                    "rate must be a finite number of tokens per second, above 0 and at most 1e9",
                );
                return -1;
            }
        };
        g.create(kind, capacity, rate, depth, max_wait_ms)
    })
}

/// Offers a request at monotonic `now_ms` of `cost` from `flow` at `priority` (0 high, 1
/// normal, 2 low). `max_wait_ms` below zero (or NaN) means the queue's own; 0 means never
/// queue. Returns an [`OfferCode`]; `out[0]` ticket, `out[1]` predicted wait (queued) or retry
/// after (denied) in whole ms rounded up, `out[2]` remaining tokens, `out[3]` capacity.
#[no_mangle]
pub extern "C" fn sluice_offer(
    now_ms: f64,
    cost: f64,
    flow: u32,
    priority: u32,
    max_wait_ms: f64,
) -> i32 {
    with(|g| {
        let Some(cost) = whole(cost) else {
            g.io.fail(format_args!("cost must be a whole number"));
            return OfferCode::Invalid as i32;
        };
        let Some(limiter) = g.limiter.as_mut() else {
            g.io.fail("no limiter: call sluice_create first");
            return OfferCode::Invalid as i32;
        };
        let max_wait = (max_wait_ms >= 0.0).then(|| ms_to_ns(max_wait_ms));
        let verdict = limiter.offer(
            ms_to_ns(now_ms),
            cost,
            u64::from(flow),
            priority_from_code(priority),
            max_wait,
        );
        let limit = limiter.quota().capacity();
        g.io.out = [0.0; OUT_SLOTS];
        g.io.out[3] = up_f64(limit);
        match verdict {
            Verdict::Admitted { remaining, .. } => {
                g.io.out[2] = up_f64(remaining);
                OfferCode::Admitted as i32
            }
            Verdict::Queued { ticket, wait_ns } => {
                g.io.out[0] = ticket as f64;
                g.io.out[1] = ns_to_ms_ceil(wait_ns);
                OfferCode::Queued as i32
            }
            Verdict::Rejected {
                reason,
                retry_after_ns,
            } => {
                g.io.out[1] = ns_to_ms_ceil(retry_after_ns);
                (match reason {
                    Reason::Limited => OfferCode::Limited,
                    Reason::QueueFull => OfferCode::QueueFull,
                    Reason::Timeout => OfferCode::Timeout,
                    Reason::TooCostly => OfferCode::TooCostly,
                    Reason::Closed => OfferCode::Closed,
                }) as i32
            }
        }
    })
}

fn write_outcomes(g: &mut Globals) {
    g.io.list.clear();
    let Some(limiter) = g.limiter.as_ref() else {
        return;
    };
    for d in limiter.outcomes() {
        let (code, retry_after_ns) = match d.delivery {
            Delivery::Admitted => (OutcomeCode::Admitted, 0),
            Delivery::TimedOut { retry_after_ns } => (OutcomeCode::TimedOut, retry_after_ns),
            Delivery::Closed => (OutcomeCode::Closed, 0),
        };
        g.io.list.extend([
            d.ticket as f64,
            f64::from(code as u32),
            ns_to_ms_ceil(retry_after_ns),
        ]);
    }
}

/// Admits and times out waiters as of `now_ms`. Returns the monotonic ms at which to poll
/// next, or -1 when nobody waits. The outcomes are in `list`, [`OUTCOME_STRIDE`] floats each:
/// ticket, [`OutcomeCode`], retry after in ms (timed out).
#[no_mangle]
pub extern "C" fn sluice_poll(now_ms: f64) -> f64 {
    with(|g| {
        let wake = match g.limiter.as_mut() {
            Some(limiter) => limiter.poll(ms_to_ns(now_ms)),
            None => None,
        };
        write_outcomes(g);
        wake.map_or(-1.0, ns_to_ms)
    })
}

/// Withdraws a waiting request: 1 if it was waiting, 0 if not.
#[no_mangle]
pub extern "C" fn sluice_cancel(ticket: f64) -> i32 {
    with(|g| match (g.limiter.as_mut(), whole(ticket)) {
        (Some(limiter), Some(ticket)) => i32::from(limiter.cancel(ticket)),
        _ => 0,
    })
}

/// Turns every waiter away (outcomes in `list`) and refuses new offers. Returns the number of
/// outcomes.
#[no_mangle]
pub extern "C" fn sluice_close() -> u32 {
    with(|g| {
        if let Some(limiter) = g.limiter.as_mut() {
            limiter.close();
        }
        write_outcomes(g);
        (g.io.list.len() / OUTCOME_STRIDE) as u32
    })
}

/// The bucket as of `now_ms` into `out`: `[0]` whole tokens now, `[1]` capacity, `[2]` requests
/// waiting, `[3]` ms until full (rounded up), `[4]` ms until one token (rounded up), `[5]`
/// algorithm code, `[6]` interval between tokens in ns. 0, or -1 without a limiter.
#[no_mangle]
pub extern "C" fn sluice_status(now_ms: f64) -> i32 {
    with(|g| {
        let Some(limiter) = g.limiter.as_ref() else {
            return -1;
        };
        let st = limiter.status(ms_to_ns(now_ms));
        g.io.out = [
            up_f64(st.remaining),
            up_f64(st.limit),
            up_f64(st.queued),
            ns_to_ms_ceil(st.reset_after_ns),
            ns_to_ms_ceil(st.next_token_ns),
            f64::from(kind_code(limiter.kind())),
            up_f64(limiter.quota().interval_ns()),
            0.0,
        ];
        0
    })
}

/// Writes the bucket as of monotonic `now_ms`, stamped with wall-clock `unix_ms`
/// (`Date.now()`), into `list` in the layout of [`record`]. Returns its length (0 without a
/// limiter).
#[no_mangle]
pub extern "C" fn sluice_snapshot(now_ms: f64, unix_ms: f64) -> u32 {
    with(|g| {
        let Some(limiter) = g.limiter.as_ref() else {
            g.io.list.clear();
            return 0;
        };
        // `as` truncates, saturates and maps NaN to 0.
        let snapshot = limiter.snapshot(ms_to_ns(now_ms), unix_ms as u64);
        record::encode(&snapshot, &mut g.io.list);
        g.io.list.len() as u32
    })
}

/// Restores the bucket from the first `len` floats of `input_f64` (a list from
/// `sluice_snapshot`) at monotonic `now_ms` and wall-clock `unix_ms`. A snapshot taken under
/// another algorithm, capacity or rate is converted so that no client gains tokens
/// ([`Limiter::restore`]). 0, or -1 (message in `error`; the bucket is unchanged, and the
/// caller should call `sluice_exhaust`).
#[no_mangle]
pub extern "C" fn sluice_restore(len: u32, now_ms: f64, unix_ms: f64) -> i32 {
    with(|g| {
        let Some(limiter) = g.limiter.as_mut() else {
            g.io.fail("no limiter: call sluice_create first");
            return -1;
        };
        let values = g.input_f64.get(..len as usize).unwrap_or(&[]);
        let restored = record::decode(values)
            .map_err(RestoreError::Snapshot)
            .and_then(|snap| limiter.restore(&snap, ms_to_ns(now_ms), unix_ms as u64));
        match restored {
            Ok(()) => 0,
            Err(e) => {
                g.io.fail(e);
                -1
            }
        }
    })
}

/// Empties the bucket as of `now_ms` (it refills at the rate). 0, or -1 while requests wait or
/// without a limiter.
#[no_mangle]
pub extern "C" fn sluice_exhaust(now_ms: f64) -> i32 {
    with(|g| match g.limiter.as_mut() {
        Some(limiter) => match limiter.exhaust(ms_to_ns(now_ms)) {
            Ok(()) => 0,
            Err(_) => {
                g.io.fail("cannot empty the bucket while requests wait");
                -1
            }
        },
        None => -1,
    })
}

/// Writes into `list` (layout of [`record`]) the bucket for a record to store now: this one
/// with the next `block` admissions (at most what is left) already spent. Call
/// `sluice_written` once that record is stored or failed, in order. Returns its length (0
/// without a limiter).
#[no_mangle]
pub extern "C" fn sluice_reserve(now_ms: f64, unix_ms: f64, block: f64) -> u32 {
    with(|g| {
        let Some(limiter) = g.limiter.as_mut() else {
            g.io.list.clear();
            return 0;
        };
        let snapshot = limiter.reserve(ms_to_ns(now_ms), unix_ms as u64, block as u64);
        record::encode(&snapshot, &mut g.io.list);
        g.io.list.len() as u32
    })
}

/// The oldest record of `sluice_reserve` is stored (`ok` 1) or could not be (0).
#[no_mangle]
pub extern "C" fn sluice_written(ok: u32) {
    with(|g| {
        if let Some(limiter) = g.limiter.as_mut() {
            limiter.written(ok == 1);
        }
    })
}

/// 1 if the stored record (and every one being written) is at least as empty as the live
/// bucket at `now_ms` after `more` further admissions; else 0. With `more` 0: whether the
/// admissions so far may go without a write.
#[no_mangle]
pub extern "C" fn sluice_covered(now_ms: f64, more: f64) -> u32 {
    with(|g| match g.limiter.as_mut() {
        Some(limiter) => u32::from(limiter.covered(ms_to_ns(now_ms), more as u64)),
        None => 0,
    })
}
