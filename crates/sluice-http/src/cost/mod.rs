//! What a request costs a policy: a fixed amount, a number the request carries, or a number
//! learnt only when the response is over (settled cost).
//!
//! A policy with a [`CostSpec`] takes, before the request is forwarded, its request-side cost
//! (the body's length, a header a trusted proxy set) or else its estimate, `reserve`. If
//! the spec names a [`Settle`] source, the response body is watched as it streams through
//! ([`meter`]: never buffered, never held back) and, when it ends, the difference between
//! what was taken and what the upstream reported is settled on the same key: given back when
//! the request cost less, charged when it cost more (a charge takes whatever the bucket has
//! left, so later requests of the key wait for the refill that pays it; the finished
//! response is never refused). A response without a report, or a client gone before the
//! report arrived, is charged the estimate ([`settle`]).
//!
//! | source | where the cost is read |
//! |---|---|
//! | `header:NAME` | a response header |
//! | `trailer:NAME` | a response trailer (HTTP/2, chunked HTTP/1.1) |
//! | `openai`, `openai:FIELD` | the `usage` object of a JSON response, or of the last server-sent event carrying one (`stream_options.include_usage`); `FIELD` defaults to `total_tokens` |
//! | `response_bytes` | the bytes of the response body that reached the client |

pub mod meter;
pub mod settle;
pub mod usage;

use std::fmt;

use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName};

/// Where a policy's settled cost comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// A response header holding a whole number.
    Header(HeaderName),
    /// A response trailer holding a whole number.
    Trailer(HeaderName),
    /// A field of an OpenAI-compatible `usage` object (`total_tokens`, `completion_tokens`,
    /// ...).
    OpenAi(String),
    /// The response body's length in bytes, as far as the client read it.
    ResponseBytes,
}

impl Settle {
    /// Reads `header:NAME`, `trailer:NAME`, `openai`, `openai:FIELD` or `response_bytes`.
    ///
    /// # Errors
    ///
    /// What is wrong with `text`, for a configuration error.
    pub fn parse(text: &str) -> Result<Settle, String> {
        let name = |rest: &str| {
            HeaderName::from_bytes(rest.trim().as_bytes())
                .map_err(|_| format!("`{rest}` is not a header name"))
        };
        if let Some(rest) = text.strip_prefix("header:") {
            return name(rest).map(Settle::Header);
        }
        if let Some(rest) = text.strip_prefix("trailer:") {
            return name(rest).map(Settle::Trailer);
        }
        if text == "openai" {
            return Ok(Settle::OpenAi(String::from("total_tokens")));
        }
        if let Some(field) = text.strip_prefix("openai:") {
            let ok = !field.is_empty()
                && field.len() <= 64
                && field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            return if ok {
                Ok(Settle::OpenAi(field.to_owned()))
            } else {
                Err(format!(
                    "`{field}` is not a usage field: use letters, digits and _ (total_tokens, completion_tokens, ...)"
                ))
            };
        }
        if text == "response_bytes" {
            return Ok(Settle::ResponseBytes);
        }
        Err(format!(
            "`{text}`: use header:NAME, trailer:NAME, openai, openai:FIELD or response_bytes"
        ))
    }
}

impl fmt::Display for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Settle::Header(h) => write!(f, "header:{h}"),
            Settle::Trailer(h) => write!(f, "trailer:{h}"),
            Settle::OpenAi(field) if field == "total_tokens" => f.write_str("openai"),
            Settle::OpenAi(field) => write!(f, "openai:{field}"),
            Settle::ResponseBytes => f.write_str("response_bytes"),
        }
    }
}

/// A cost the request itself carries, known before it is forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestCost {
    /// The request body's length: its `Content-Length`, or, for a body of unknown length,
    /// the estimate first and the bytes read settled when the response ends.
    BodyBytes,
    /// A header holding a whole number, set by a trusted proxy in front of the gateway
    /// (missing, unreadable, or from a client that is not a trusted proxy: the estimate).
    Header(HeaderName),
}

impl RequestCost {
    /// Reads `body_bytes` or `header:NAME`.
    ///
    /// # Errors
    ///
    /// What is wrong with `text`, for a configuration error.
    pub fn parse(text: &str) -> Result<RequestCost, String> {
        if text == "body_bytes" {
            return Ok(RequestCost::BodyBytes);
        }
        if let Some(rest) = text.strip_prefix("header:") {
            return HeaderName::from_bytes(rest.trim().as_bytes())
                .map(RequestCost::Header)
                .map_err(|_| format!("`{rest}` is not a header name"));
        }
        Err(format!("`{text}`: use body_bytes or header:NAME"))
    }
}

impl fmt::Display for RequestCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestCost::BodyBytes => f.write_str("body_bytes"),
            RequestCost::Header(h) => write!(f, "header:{h}"),
        }
    }
}

/// What a request costs one policy: `cost = { reserve, request, settle }` in the
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostSpec {
    /// Taken before the request is forwarded when the request carries no cost of its own:
    /// the estimate a settlement corrects.
    pub reserve: u64,
    /// A cost the request carries.
    pub request: Option<RequestCost>,
    /// Where the real cost is read when the response ends.
    pub settle: Option<Settle>,
    /// A reservation computed from the request body instead of `reserve` (which then stands
    /// only for a request whose body was not read).
    pub from_body: Option<BodyReserve>,
    /// The most a key may owe beyond empty after a settled charge, in tokens: what a charge
    /// would take beyond it is forgiven. `u64::MAX` (the default) sets no cap, which is what
    /// the bound `capacity + rate × T` needs.
    pub max_debt: u64,
}

/// A reservation read from the request body (`cost.reserve = "openai"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyReserve {
    /// An OpenAI-compatible request (chat completions, completions, responses): the most
    /// tokens its answer may have (`max_completion_tokens`, else `max_tokens`, else
    /// `max_output_tokens`, else `default_max_tokens`), times `n` choices, plus an upper bound
    /// of its prompt's tokens: the body's length in bytes, since every token of a prompt is at
    /// least one byte of it and the body holds every byte of the prompt. An answer that keeps
    /// within its own limit then costs at most what was reserved: the settlement only refunds.
    OpenAi {
        /// The answer's budget for a request that does not give one.
        default_max_tokens: u64,
    },
}

impl BodyReserve {
    /// The tokens to reserve for a request whose whole body is `body`.
    pub fn reserve(&self, body: &[u8]) -> u64 {
        let BodyReserve::OpenAi { default_max_tokens } = *self;
        let parsed: Option<serde_json::Map<String, serde_json::Value>> =
            serde_json::from_slice(body).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|m| m.get(name))
                .and_then(serde_json::Value::as_u64)
        };
        let answer = field("max_completion_tokens")
            .or_else(|| field("max_tokens"))
            .or_else(|| field("max_output_tokens"))
            .unwrap_or(default_max_tokens);
        let choices = field("n").unwrap_or(1).max(1);
        (body.len() as u64).saturating_add(answer.saturating_mul(choices))
    }
}

/// What a request takes from a policy before it is forwarded, and whether that is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// Tokens taken now.
    pub cost: u64,
    /// Whether the real cost is learnt later (a settlement is owed).
    pub settles: bool,
    /// Whether that later cost is the request body's length.
    pub counts_request_body: bool,
}

impl CostSpec {
    /// What a request with `headers` takes now; `trusted`: it came from a trusted proxy,
    /// whose cost header is believed; `body`: its whole body, when it was read for a
    /// reservation computed from it.
    pub fn reserve_for(&self, headers: &HeaderMap, trusted: bool, body: Option<&[u8]>) -> Reserved {
        if let (Some(from_body), Some(body)) = (&self.from_body, body) {
            return Reserved {
                cost: from_body.reserve(body),
                settles: self.settle.is_some(),
                counts_request_body: false,
            };
        }
        let number = |name: &HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let (cost, unknown_body) = match &self.request {
            None => (None, false),
            Some(RequestCost::Header(name)) => (number(name).filter(|_| trusted), false),
            Some(RequestCost::BodyBytes) => {
                let length = number(&CONTENT_LENGTH);
                (length, length.is_none())
            }
        };
        Reserved {
            cost: cost.unwrap_or(self.reserve),
            settles: self.settle.is_some() || unknown_body,
            counts_request_body: unknown_body && self.settle.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_back_as_written() {
        for text in [
            "header:x-usage",
            "trailer:x-usage",
            "openai",
            "openai:completion_tokens",
            "response_bytes",
        ] {
            assert_eq!(Settle::parse(text).unwrap().to_string(), text);
        }
        assert!(Settle::parse("openai:bad field").is_err());
        assert!(Settle::parse("header:bad name").is_err());
        assert!(Settle::parse("body").unwrap_err().contains("openai"));
        assert_eq!(
            RequestCost::parse("body_bytes").unwrap().to_string(),
            "body_bytes"
        );
        assert!(RequestCost::parse("bytes").is_err());
    }

    #[test]
    fn the_request_side_cost_falls_back_to_the_estimate() {
        let spec = CostSpec {
            reserve: 7,
            request: Some(RequestCost::Header(HeaderName::from_static("x-cost"))),
            settle: None,
            from_body: None,
            max_debt: u64::MAX,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(spec.reserve_for(&headers, true, None).cost, 7);
        headers.insert("x-cost", "42".parse().unwrap());
        let r = spec.reserve_for(&headers, true, None);
        assert_eq!((r.cost, r.settles), (42, false));
        assert_eq!(
            spec.reserve_for(&headers, false, None).cost,
            7,
            "a client cannot set its own cost"
        );
        headers.insert("x-cost", "lots".parse().unwrap());
        assert_eq!(spec.reserve_for(&headers, true, None).cost, 7);

        let bytes = CostSpec {
            reserve: 1000,
            request: Some(RequestCost::BodyBytes),
            settle: None,
            from_body: None,
            max_debt: u64::MAX,
        };
        let mut headers = HeaderMap::new();
        let chunked = bytes.reserve_for(&headers, false, None);
        assert_eq!(
            (chunked.cost, chunked.settles, chunked.counts_request_body),
            (1000, true, true)
        );
        headers.insert(CONTENT_LENGTH, "512".parse().unwrap());
        let known = bytes.reserve_for(&headers, false, None);
        assert_eq!((known.cost, known.settles), (512, false));
    }
}
