//! Building a breaker: the window, the thresholds and the timings, validated once.

use std::num::NonZeroU32;
use std::time::Duration;

/// Which calls the breaker judges the failure and slow-call rates over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    /// The last `n` calls.
    Count(NonZeroU32),
    /// The calls that ended in the last `t` (to a tenth of `t`: the window moves in ten steps,
    /// so a call ages out between `0.9 t` and `t` after it ended).
    Time(Duration),
}

/// The settings of a breaker, checked by [`BreakerBuilder::build`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) window: Window,
    pub(crate) failure_rate: f64,
    pub(crate) slow: Option<SlowCalls>,
    pub(crate) min_calls: u32,
    pub(crate) open_for: Duration,
    pub(crate) half_open_probes: u32,
}

/// What makes a call slow, and how many slow calls trip the breaker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowCalls {
    pub(crate) threshold: Duration,
    pub(crate) rate: f64,
}

/// Builds a [`CircuitBreaker`](super::CircuitBreaker).
///
/// | setting | default | meaning |
/// |---------|---------|---------|
/// | [`name`](Self::name) | `default` | the `breaker` label of the metrics |
/// | [`count_window`](Self::count_window) / [`time_window`](Self::time_window) | last 100 calls | the calls the rates are computed over |
/// | [`failure_rate`](Self::failure_rate) | 0.5 | open when at least this share of the calls failed |
/// | [`slow_calls`](Self::slow_calls) | off | open when at least this share of the calls took at least this long |
/// | [`min_calls`](Self::min_calls) | 10 | no verdict before the window holds this many calls |
/// | [`open_for`](Self::open_for) | 30 s | how long to reject before probing |
/// | [`half_open_probes`](Self::half_open_probes) | 3 | probes admitted when half-open; all must succeed to close |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::breaker::CircuitBreaker;
///
/// let breaker = CircuitBreaker::builder()
///     .name("payments")
///     .time_window(Duration::from_secs(60))
///     .failure_rate(0.5)
///     .slow_calls(Duration::from_secs(2), 0.8)
///     .min_calls(20)
///     .open_for(Duration::from_secs(10))
///     .half_open_probes(5)
///     .build()?;
/// # Ok::<(), sluice::breaker::InvalidBreakerConfig>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BreakerBuilder {
    name: String,
    window: WindowSetting,
    failure_rate: f64,
    slow: Option<(Duration, f64)>,
    min_calls: u32,
    open_for: Duration,
    half_open_probes: u32,
}

/// The window as given, checked in `build`.
#[derive(Debug, Clone, Copy)]
enum WindowSetting {
    Count(u32),
    Time(Duration),
}

/// A breaker could not be built from the given settings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidBreakerConfig {
    /// The count window was zero calls long.
    #[error("the count window must hold at least 1 call, got 0")]
    EmptyCountWindow,
    /// The time window was zero long.
    #[error("the time window must be longer than zero")]
    EmptyTimeWindow,
    /// A rate threshold was not in `(0, 1]`.
    #[error("{which} threshold must be above 0 and at most 1, got {value}")]
    RateOutOfRange {
        /// `failure rate` or `slow-call rate`.
        which: &'static str,
        /// The rejected threshold.
        value: f64,
    },
    /// The minimum number of calls was zero: a rate over no calls means nothing.
    #[error("the minimum number of calls must be at least 1, got 0")]
    ZeroMinCalls,
    /// The minimum number of calls exceeds what the count window can hold, so it could never
    /// be reached and the breaker could never open.
    #[error("the minimum number of calls ({min_calls}) exceeds the count window ({window} calls)")]
    MinCallsAboveWindow {
        /// The minimum that was given.
        min_calls: u32,
        /// The size of the count window.
        window: u32,
    },
    /// No probe would be admitted when half-open, so the breaker could never close again.
    #[error("at least 1 half-open probe is needed, got 0")]
    ZeroProbes,
}

// === impl BreakerBuilder ===

impl BreakerBuilder {
    pub(crate) fn new() -> BreakerBuilder {
        BreakerBuilder {
            name: "default".to_owned(),
            window: WindowSetting::Count(100),
            failure_rate: 0.5,
            slow: None,
            min_calls: 10,
            open_for: Duration::from_secs(30),
            half_open_probes: 3,
        }
    }

    /// The breaker's name, its `breaker` label in the metrics.
    pub fn name(mut self, name: impl Into<String>) -> BreakerBuilder {
        self.name = name.into();
        self
    }

    /// Judge the last `calls` calls.
    pub fn count_window(mut self, calls: u32) -> BreakerBuilder {
        self.window = WindowSetting::Count(calls);
        self
    }

    /// Judge the calls that ended in the last `period`.
    pub fn time_window(mut self, period: Duration) -> BreakerBuilder {
        self.window = WindowSetting::Time(period);
        self
    }

    /// Open when at least `rate` (0.5 is half) of the calls in the window failed.
    pub fn failure_rate(mut self, rate: f64) -> BreakerBuilder {
        self.failure_rate = rate;
        self
    }

    /// Count a call that took at least `threshold` as slow, and open when at least `rate` of
    /// the calls in the window were slow, failed or not.
    pub fn slow_calls(mut self, threshold: Duration, rate: f64) -> BreakerBuilder {
        self.slow = Some((threshold, rate));
        self
    }

    /// Give no verdict until the window holds at least `calls` calls.
    pub fn min_calls(mut self, calls: u32) -> BreakerBuilder {
        self.min_calls = calls;
        self
    }

    /// Stay open for `wait` before admitting probes.
    pub fn open_for(mut self, wait: Duration) -> BreakerBuilder {
        self.open_for = wait;
        self
    }

    /// Admit at most `probes` calls when half-open; close once that many have succeeded, and
    /// reopen on the first probe that fails or is slow.
    pub fn half_open_probes(mut self, probes: u32) -> BreakerBuilder {
        self.half_open_probes = probes;
        self
    }

    /// Checks the settings; `CircuitBreaker` builds on this.
    pub(crate) fn validate(self) -> Result<Config, InvalidBreakerConfig> {
        let window = match self.window {
            WindowSetting::Count(calls) => {
                let calls = NonZeroU32::new(calls).ok_or(InvalidBreakerConfig::EmptyCountWindow)?;
                Window::Count(calls)
            }
            WindowSetting::Time(period) if period.is_zero() => {
                return Err(InvalidBreakerConfig::EmptyTimeWindow)
            }
            WindowSetting::Time(period) => Window::Time(period),
        };
        let rate = |which: &'static str, value: f64| {
            if value > 0.0 && value <= 1.0 {
                Ok(value)
            } else {
                Err(InvalidBreakerConfig::RateOutOfRange { which, value })
            }
        };
        let failure_rate = rate("failure rate", self.failure_rate)?;
        let slow = match self.slow {
            Some((threshold, value)) => Some(SlowCalls {
                threshold,
                rate: rate("slow-call rate", value)?,
            }),
            None => None,
        };
        if self.min_calls == 0 {
            return Err(InvalidBreakerConfig::ZeroMinCalls);
        }
        if let Window::Count(size) = window {
            if self.min_calls > size.get() {
                return Err(InvalidBreakerConfig::MinCallsAboveWindow {
                    min_calls: self.min_calls,
                    window: size.get(),
                });
            }
        }
        if self.half_open_probes == 0 {
            return Err(InvalidBreakerConfig::ZeroProbes);
        }
        Ok(Config {
            name: self.name,
            window,
            failure_rate,
            slow,
            min_calls: self.min_calls,
            open_for: self.open_for,
            half_open_probes: self.half_open_probes,
        })
    }
}

impl Default for BreakerBuilder {
    fn default() -> BreakerBuilder {
        BreakerBuilder::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = BreakerBuilder::new().validate().unwrap();
        assert_eq!(config.window, Window::Count(NonZeroU32::new(100).unwrap()));
        assert_eq!(config.min_calls, 10);
        assert!(config.slow.is_none());
    }

    #[test]
    fn every_bad_setting_is_named() {
        let b = BreakerBuilder::new;
        assert_eq!(
            b().count_window(0).validate().unwrap_err(),
            InvalidBreakerConfig::EmptyCountWindow
        );
        assert_eq!(
            b().time_window(Duration::ZERO).validate().unwrap_err(),
            InvalidBreakerConfig::EmptyTimeWindow
        );
        for value in [0.0, -0.5, 1.01, f64::NAN] {
            let err = b().failure_rate(value).validate().unwrap_err();
            assert!(
                matches!(
                    err,
                    InvalidBreakerConfig::RateOutOfRange {
                        which: "failure rate",
                        ..
                    }
                ),
                "{err}"
            );
            let err = b()
                .slow_calls(Duration::from_secs(1), value)
                .validate()
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    InvalidBreakerConfig::RateOutOfRange {
                        which: "slow-call rate",
                        ..
                    }
                ),
                "{err}"
            );
        }
        assert_eq!(
            b().min_calls(0).validate().unwrap_err(),
            InvalidBreakerConfig::ZeroMinCalls
        );
        assert_eq!(
            b().count_window(5).min_calls(6).validate().unwrap_err(),
            InvalidBreakerConfig::MinCallsAboveWindow {
                min_calls: 6,
                window: 5
            }
        );
        assert_eq!(
            b().half_open_probes(0).validate().unwrap_err(),
            InvalidBreakerConfig::ZeroProbes
        );
        // A time window has no such ceiling on the minimum.
        assert!(b()
            .time_window(Duration::from_secs(1))
            .min_calls(1000)
            .validate()
            .is_ok());
        // Exactly 1 is a valid threshold: open only when every call failed.
        assert!(b().failure_rate(1.0).validate().is_ok());
    }
}
