//! Synthetic load: a small language for `--pattern`.
//!
//! ```text
//! pattern := phase ( "then" phase )*          phases run one after another
//! phase   := shape ( "+" shape )*             shapes of a phase start together; it lasts
//!                                             as long as its longest shape
//! shape   := "constant" RATE "for" DURATION option*
//!          | "poisson"  RATE "for" DURATION option*
//!          | "bursts" COUNT "every" DURATION "for" DURATION option*
//!          | "idle" DURATION
//! option  := "keys" COUNT                     spread requests over keys key-1 .. key-COUNT,
//!                                             in turn (default: no key)
//!          | "cost" COUNT                     tokens per request (default 1)
//! RATE    := as in the config: 5/s, 300/min, 0.5/s, 2/100ms
//! DURATION:= as in the config: 500ms, 10s, 1.5min, 2h
//! ```
//!
//! - `constant 5/s for 10s`: one request every 200 ms, at 0, 0.2 s, ... 9.8 s (50 requests).
//! - `poisson 4/s for 30s`: exponential gaps of mean 250 ms (seeded: `--seed`, default 1),
//!   the first one gap after the start.
//! - `bursts 20 every 5s for 60s`: 20 requests at once at 0, 5 s, ... 55 s (240 requests).
//! - `constant 2/s for 10s then idle 5s then bursts 30 every 1s for 3s keys 3`.

use sluice_core::Rate;

use crate::config::units::parse_duration;
use crate::simulate::arrival::Arrival;

/// The most requests one pattern may make.
pub const MAX_REQUESTS: u64 = 10_000_000;

/// A `--pattern` that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: {message}")]
pub struct PatternError {
    /// 1-based column (in characters) of the offending word.
    pub column: usize,
    /// What is wrong, and what was expected.
    pub message: String,
}

/// A parsed pattern. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    phases: Vec<Vec<Shape>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    kind: Kind,
    for_ns: u64,
    keys: u64,
    cost: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Constant { interval_ns: u64 },
    Poisson { interval_ns: u64 },
    Bursts { count: u64, every_ns: u64 },
    Idle,
}

impl Shape {
    /// Requests this shape makes (an upper estimate for Poisson).
    fn estimate(&self) -> u64 {
        match self.kind {
            Kind::Constant { interval_ns } => self.for_ns.div_ceil(interval_ns),
            Kind::Poisson { interval_ns } => {
                let mean = self.for_ns / interval_ns;
                mean + mean / 4 + 64
            }
            Kind::Bursts { count, every_ns } => {
                count.saturating_mul(self.for_ns.div_ceil(every_ns))
            }
            Kind::Idle => 0,
        }
    }
}

struct Words<'a> {
    words: Vec<(usize, &'a str)>,
    next: usize,
    end_column: usize,
}

impl<'a> Words<'a> {
    fn new(text: &'a str) -> Words<'a> {
        let mut words = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices() {
            match (c.is_whitespace(), start) {
                (true, Some(s)) => {
                    words.push((s, &text[s..i]));
                    start = None;
                }
                (false, None) => start = Some(i),
                _ => {}
            }
        }
        if let Some(s) = start {
            words.push((s, &text[s..]));
        }
        let column = |byte: usize| text[..byte].chars().count() + 1;
        Words {
            words: words.into_iter().map(|(b, w)| (column(b), w)).collect(),
            next: 0,
            end_column: text.chars().count() + 1,
        }
    }

    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.next).map(|&(_, w)| w)
    }

    fn column(&self) -> usize {
        self.words
            .get(self.next)
            .map_or(self.end_column, |&(c, _)| c)
    }

    fn take(&mut self, what: &str) -> Result<(usize, &'a str), PatternError> {
        match self.words.get(self.next) {
            Some(&(c, w)) => {
                self.next += 1;
                Ok((c, w))
            }
            None => Err(PatternError {
                column: self.end_column,
                message: format!("the pattern ends where {what} was expected"),
            }),
        }
    }

    fn keyword(&mut self, keyword: &str) -> Result<(), PatternError> {
        let (column, word) = self.take(&format!("`{keyword}`"))?;
        if word == keyword {
            Ok(())
        } else {
            Err(PatternError {
                column,
                message: format!("expected `{keyword}`, found `{word}`"),
            })
        }
    }

    fn count(&mut self, what: &str) -> Result<u64, PatternError> {
        let (column, word) = self.take(what)?;
        match word.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(PatternError {
                column,
                message: format!(
                    "cannot read `{word}` as {what}: expected a whole number, at least 1"
                ),
            }),
        }
    }

    fn duration(&mut self, what: &str) -> Result<u64, PatternError> {
        let (column, word) = self.take(what)?;
        let d = parse_duration(word).map_err(|message| PatternError { column, message })?;
        match u64::try_from(d.as_nanos()) {
            Ok(0) => Err(PatternError {
                column,
                message: format!("{what} `{word}` must be longer than zero"),
            }),
            Ok(ns) => Ok(ns),
            Err(_) => Err(PatternError {
                column,
                message: format!("{what} `{word}` is too long"),
            }),
        }
    }

    fn rate(&mut self) -> Result<u64, PatternError> {
        let (column, word) = self.take("a rate")?;
        word.parse::<Rate>()
            .map(|r| r.interval_ns())
            .map_err(|e| PatternError {
                column,
                message: format!("cannot read `{word}` as a rate: {e}"),
            })
    }
}

impl std::str::FromStr for Pattern {
    type Err = PatternError;

    fn from_str(text: &str) -> Result<Pattern, PatternError> {
        Pattern::parse(text)
    }
}

impl Pattern {
    /// Reads a pattern.
    ///
    /// # Errors
    ///
    /// [`PatternError`] with the column of the first word that does not fit the grammar.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_server::simulate::pattern::Pattern;
    ///
    /// let p = Pattern::parse("bursts 20 every 5s for 60s").unwrap();
    /// assert_eq!(p.arrivals(1).unwrap().len(), 240);
    /// assert_eq!(p.duration_ns(), 60_000_000_000);
    /// assert_eq!(Pattern::parse("constant 5 for 1s").unwrap_err().column, 10);
    /// ```
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        let mut words = Words::new(text);
        let mut phases = Vec::new();
        let mut phase = Vec::new();
        loop {
            phase.push(Self::shape(&mut words)?);
            match words.peek() {
                None => {
                    phases.push(phase);
                    break;
                }
                Some("+") => {
                    words.next += 1;
                }
                Some("then") => {
                    words.next += 1;
                    phases.push(std::mem::take(&mut phase));
                }
                Some(other) => {
                    return Err(PatternError {
                        column: words.column(),
                        message: format!(
                            "unexpected `{other}`: expected `keys N`, `cost N`, `+` (at the same time) or `then` (afterwards)"
                        ),
                    })
                }
            }
        }
        let pattern = Pattern { phases };
        let total = pattern
            .phases
            .iter()
            .flatten()
            .fold(0u64, |n, s| n.saturating_add(s.estimate()));
        if total > MAX_REQUESTS {
            return Err(PatternError {
                column: 1,
                message: format!(
                    "the pattern makes about {total} requests; at most {MAX_REQUESTS}"
                ),
            });
        }
        Ok(pattern)
    }

    fn shape(words: &mut Words<'_>) -> Result<Shape, PatternError> {
        let (column, word) = words.take("a shape (constant, poisson, bursts or idle)")?;
        let (kind, for_ns) = match word {
            "constant" | "poisson" => {
                let interval_ns = words.rate()?;
                words.keyword("for")?;
                let for_ns = words.duration("a duration")?;
                let kind = if word == "constant" {
                    Kind::Constant { interval_ns }
                } else {
                    Kind::Poisson { interval_ns }
                };
                (kind, for_ns)
            }
            "bursts" => {
                let count = words.count("a burst size")?;
                words.keyword("every")?;
                let every_ns = words.duration("a burst interval")?;
                words.keyword("for")?;
                let for_ns = words.duration("a duration")?;
                (Kind::Bursts { count, every_ns }, for_ns)
            }
            "idle" => (Kind::Idle, words.duration("a duration")?),
            other => {
                return Err(PatternError {
                    column,
                    message: format!(
                        "unknown shape `{other}`: expected constant, poisson, bursts or idle, as in `poisson 4/s for 30s`"
                    ),
                })
            }
        };
        let mut shape = Shape {
            kind,
            for_ns,
            keys: 0,
            cost: 1,
        };
        while let Some(option @ ("keys" | "cost")) = words.peek() {
            let column = words.column();
            if kind == Kind::Idle {
                return Err(PatternError {
                    column,
                    message: format!("`idle` makes no requests and takes no `{option}`"),
                });
            }
            words.next += 1;
            if option == "keys" {
                shape.keys = words.count("a number of keys")?;
            } else {
                shape.cost = words.count("a cost")?;
            }
        }
        Ok(shape)
    }

    /// How long the pattern lasts: the sum of its phases.
    pub fn duration_ns(&self) -> u64 {
        self.phases
            .iter()
            .map(|p| p.iter().map(|s| s.for_ns).max().unwrap_or(0))
            .fold(0u64, u64::saturating_add)
    }

    /// The requests, in time order (ties in the order the shapes are written), with Poisson
    /// gaps drawn from `seed`.
    ///
    /// # Errors
    ///
    /// A message when it would make more than [`MAX_REQUESTS`].
    pub fn arrivals(&self, seed: u64) -> Result<Vec<Arrival>, String> {
        let mut rng = SplitMix64(seed);
        let mut out: Vec<Arrival> = Vec::new();
        let mut start = 0u64;
        for phase in &self.phases {
            let mut batch: Vec<(u64, usize, Arrival)> = Vec::new();
            for (index, shape) in phase.iter().enumerate() {
                let mut n = 0u64;
                let mut push = |at: u64, batch: &mut Vec<(u64, usize, Arrival)>| {
                    let key = if shape.keys == 0 {
                        String::new()
                    } else {
                        format!("key-{}", n % shape.keys + 1)
                    };
                    n += 1;
                    let at_ns = start.saturating_add(at);
                    batch.push((
                        at_ns,
                        index,
                        Arrival {
                            at_ns,
                            key,
                            cost: shape.cost,
                        },
                    ));
                };
                match shape.kind {
                    Kind::Constant { interval_ns } => {
                        let mut t = 0u64;
                        while t < shape.for_ns {
                            push(t, &mut batch);
                            t = t.saturating_add(interval_ns);
                        }
                    }
                    Kind::Poisson { interval_ns } => {
                        let mut t = 0f64;
                        loop {
                            t += rng.exponential() * interval_ns as f64;
                            if t >= shape.for_ns as f64 {
                                break;
                            }
                            push(t as u64, &mut batch);
                            if batch.len() as u64 + out.len() as u64 > MAX_REQUESTS {
                                return Err(format!(
                                    "the pattern makes more than {MAX_REQUESTS} requests"
                                ));
                            }
                        }
                    }
                    Kind::Bursts { count, every_ns } => {
                        let mut t = 0u64;
                        while t < shape.for_ns {
                            for _ in 0..count {
                                push(t, &mut batch);
                            }
                            t = t.saturating_add(every_ns);
                        }
                    }
                    Kind::Idle => {}
                }
            }
            // Stable: equal times keep shape order, and each shape's own order.
            batch.sort_by_key(|&(at, index, _)| (at, index));
            out.extend(batch.into_iter().map(|(_, _, a)| a));
            start = start.saturating_add(phase.iter().map(|s| s.for_ns).max().unwrap_or(0));
        }
        if out.len() as u64 > MAX_REQUESTS {
            return Err(format!(
                "the pattern makes more than {MAX_REQUESTS} requests"
            ));
        }
        Ok(out)
    }
}

/// SplitMix64: tiny, seedable, and the same on every platform and in every version.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// An exponential variate of mean 1.
    fn exponential(&mut self) -> f64 {
        // Uniform in (0, 1]: never ln(0).
        let u = ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        -u.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(p: &str) -> Vec<u64> {
        Pattern::parse(p)
            .unwrap()
            .arrivals(1)
            .unwrap()
            .iter()
            .map(|a| a.at_ns / 1_000_000)
            .collect()
    }

    #[test]
    fn shapes() {
        assert_eq!(times("constant 5/s for 1s"), [0, 200, 400, 600, 800]);
        assert_eq!(times("bursts 2 every 1s for 2s"), [0, 0, 1000, 1000]);
        assert_eq!(
            times("constant 1/s for 2s then idle 1s then constant 1/s for 1s"),
            [0, 1000, 3000]
        );
        assert_eq!(
            times("constant 2/s for 1s + bursts 2 every 1s for 1s"),
            [0, 0, 0, 500]
        );
        let p =
            Pattern::parse("constant 1/s for 2s then idle 1s + constant 1/s for 500ms").unwrap();
        assert_eq!(p.duration_ns(), 3_000_000_000);
    }

    #[test]
    fn options() {
        let a = Pattern::parse("bursts 3 every 1s for 1s keys 2 cost 4")
            .unwrap()
            .arrivals(1)
            .unwrap();
        let keys: Vec<&str> = a.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["key-1", "key-2", "key-1"]);
        assert!(a.iter().all(|a| a.cost == 4));
    }

    #[test]
    fn poisson_is_seeded_and_near_its_rate() {
        let p = Pattern::parse("poisson 100/s for 100s").unwrap();
        let a = p.arrivals(7).unwrap();
        assert_eq!(a, p.arrivals(7).unwrap());
        assert_ne!(a, p.arrivals(8).unwrap());
        assert!((9_500..10_500).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert!(a.last().unwrap().at_ns < 100_000_000_000);
    }

    #[test]
    fn errors_point_at_the_word() {
        let e = |p: &str| Pattern::parse(p).unwrap_err();
        assert_eq!(e("fast 5/s for 1s").column, 1);
        assert!(e("fast 5/s for 1s")
            .message
            .contains("unknown shape `fast`"));
        assert_eq!(e("constant 5 for 1s").column, 10);
        assert_eq!(e("constant 5/s during 1s").column, 14);
        assert_eq!(e("constant 5/s for").column, 17);
        assert!(e("constant 5/s for").message.contains("ends where"));
        assert_eq!(e("constant 5/s for 10").column, 18);
        assert_eq!(e("constant 5/s for 0s").column, 18);
        assert_eq!(e("bursts 0 every 1s for 1s").column, 8);
        assert_eq!(e("bursts x every 1s for 1s").column, 8);
        assert_eq!(e("idle 1s keys 2").column, 9);
        assert_eq!(e("constant 5/s for 1s and more").column, 21);
        assert_eq!(e("constant 5/s for 1s keys 0").column, 26);
        assert!(e("constant 1000000/s for 1h").message.contains("at most"));
        assert_eq!(e("").column, 1);
        assert_eq!(e("constant 1/s for 1s then").column, 25);
        assert_eq!(e("constant é/s for 1s").column, 10);
    }
}
