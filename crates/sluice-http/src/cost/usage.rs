//! Finds an OpenAI-compatible `usage` object in a response body as it streams past, in
//! bounded memory.
//!
//! - **JSON** (`application/json`): the top-level object's `"usage"` member, wherever it
//!   stands. The scanner follows strings (skipped with `memchr`, so a `"usage"` in the
//!   generated text is never taken for the member), nesting, member names and values, and
//!   copies only the member's value, at most [`MAX_USAGE`] bytes.
//! - **Server-sent events** (`text/event-stream`): each `data:` line that mentions `"usage"`
//!   is read as JSON, and the last `usage` object seen wins (with
//!   `stream_options.include_usage`, the last chunk before `[DONE]` carries it; the others
//!   carry `null`). A line is held until its end, at most [`MAX_LINE`] bytes; a longer one is
//!   skipped.
//!
//! Nothing is ever held back from the client: the scanner reads a copy of each chunk's
//! reference, after which the chunk goes on unchanged.

use memchr::{memchr, memchr2, memmem, memrchr};
use serde_json::{Map, Value};

/// The largest `usage` value kept (real ones are a few hundred bytes).
pub const MAX_USAGE: usize = 16 * 1024;
/// The longest server-sent event line read.
pub const MAX_LINE: usize = 64 * 1024;

/// A body's format, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON document.
    Json,
    /// `text/event-stream`.
    EventStream,
}

impl Format {
    /// The format of a body with `content_type`; `None` for a body the scanner does not read.
    pub fn of(content_type: Option<&[u8]>) -> Option<Format> {
        let value = content_type?;
        let essence = value.split(|&b| b == b';').next()?.trim_ascii();
        if essence.eq_ignore_ascii_case(b"text/event-stream") {
            Some(Format::EventStream)
        } else if essence.eq_ignore_ascii_case(b"application/json")
            || (essence.len() > 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json"))
        {
            Some(Format::Json)
        } else {
            None
        }
    }
}

/// The scanner of one body.
#[derive(Debug)]
pub struct UsageScanner {
    format: Format,
    json: JsonState,
    line: Vec<u8>,
    line_too_long: bool,
    found: Option<Map<String, Value>>,
}

#[derive(Debug, Default)]
struct JsonState {
    /// Open objects and arrays: a member of the top-level object is at 1.
    nest: u32,
    /// At nesting 1, the next string is a member name.
    expect_key: bool,
    in_string: bool,
    /// The last byte was a backslash inside a string.
    escape: bool,
    /// The string being read is a member name of the top-level object: its bytes so far
    /// (up to 16; `None` once it cannot be `usage`).
    key: Option<Vec<u8>>,
    /// The top-level member just named is `usage`: its value comes next.
    want_value: bool,
    /// The `usage` object being copied, and whether it overflowed.
    capture: Option<Vec<u8>>,
}

impl UsageScanner {
    /// A scanner for a body in `format`.
    pub fn new(format: Format) -> UsageScanner {
        UsageScanner {
            format,
            json: JsonState::default(),
            line: Vec::new(),
            line_too_long: false,
            found: None,
        }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        match self.format {
            Format::Json => self.feed_json(chunk),
            Format::EventStream => self.feed_events(chunk),
        }
    }

    /// Reads what is left at the end of the body (an event line without its newline).
    pub fn finish(&mut self) {
        if self.format == Format::EventStream && !self.line.is_empty() && !self.line_too_long {
            let line = std::mem::take(&mut self.line);
            self.event_line(&line);
        }
    }

    /// The `usage` object found, if any.
    pub fn usage(&self) -> Option<&Map<String, Value>> {
        self.found.as_ref()
    }

    /// `field` of the usage found, as a whole number. `total_tokens` missing is the sum of
    /// `prompt_tokens` and `completion_tokens` (or `input_tokens` and `output_tokens`).
    pub fn field(&self, field: &str) -> Option<u64> {
        usage_field(self.found.as_ref()?, field)
    }

    fn feed_events(&mut self, chunk: &[u8]) {
        let Some(first) = memchr(b'\n', chunk) else {
            self.hold(chunk);
            return;
        };
        // The line an earlier chunk began ends here.
        if self.line.is_empty() && !self.line_too_long {
            self.event_line(&chunk[..first]);
        } else {
            if !self.line_too_long && self.line.len() + first <= MAX_LINE {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..first]);
                self.event_line(&line);
                line.clear();
                self.line = line;
            }
            self.line.clear();
            self.line_too_long = false;
        }
        // The whole lines after it: only those that mention "usage" are looked at, found in
        // one pass over the chunk.
        let last = memrchr(b'\n', chunk).unwrap_or(first);
        if last > first {
            let whole = &chunk[first + 1..=last];
            let mut read_to = 0;
            for at in usage_finder().find_iter(whole) {
                if at < read_to || !object_follows(&whole[at + USAGE.len()..]) {
                    continue;
                }
                let start = memrchr(b'\n', &whole[..at]).map_or(0, |i| i + 1);
                let end = memchr(b'\n', &whole[at..]).map_or(whole.len(), |i| at + i);
                self.event_line(&whole[start..end]);
                read_to = end;
            }
        }
        self.hold(&chunk[last + 1..]);
    }

    /// Keeps the start of a line that the next chunk ends (at most [`MAX_LINE`] bytes).
    fn hold(&mut self, part: &[u8]) {
        if self.line.len() + part.len() > MAX_LINE {
            self.line.clear();
            self.line_too_long = true;
        } else if !self.line_too_long {
            self.line.extend_from_slice(part);
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        // Most events carry `"usage":null` (or nothing): parsed only when one is an object.
        if !has_usage_object(data) {
            return;
        }
        if let Ok(Value::Object(mut event)) = serde_json::from_slice::<Value>(data.trim_ascii()) {
            if let Some(Value::Object(usage)) = event.remove("usage") {
                self.found = Some(usage);
            }
        }
    }

    fn feed_json(&mut self, chunk: &[u8]) {
        let s = &mut self.json;
        // Where, in this chunk, the `usage` value being copied starts.
        let mut from = s.capture.is_some().then_some(0);
        let mut i = 0;
        while i < chunk.len() {
            if s.in_string {
                if s.escape {
                    s.escape = false;
                    push_key(&mut s.key, &chunk[i..=i]);
                    i += 1;
                    continue;
                }
                let Some(at) = memchr2(b'"', b'\\', &chunk[i..]) else {
                    push_key(&mut s.key, &chunk[i..]);
                    break;
                };
                let end = i + at;
                push_key(&mut s.key, &chunk[i..end]);
                i = end + 1;
                if chunk[end] == b'\\' {
                    s.escape = true;
                    push_key(&mut s.key, b"\\");
                    continue;
                }
                s.in_string = false;
                if let Some(key) = s.key.take() {
                    s.want_value = key == b"usage";
                }
                continue;
            }
            // Outside strings the bytes are punctuation, numbers and spaces: read one by one.
            let at = i;
            i += 1;
            match chunk[at] {
                b'"' => {
                    s.in_string = true;
                    if s.nest == 1 && s.expect_key && s.capture.is_none() {
                        s.key = Some(Vec::new());
                    } else {
                        s.want_value = false;
                    }
                }
                b':' if s.nest == 1 => s.expect_key = false,
                b',' if s.nest == 1 => {
                    s.expect_key = true;
                    s.want_value = false;
                }
                b'{' | b'[' => {
                    if chunk[at] == b'{' && s.want_value && s.nest == 1 {
                        s.capture = Some(Vec::new());
                        from = Some(at);
                    }
                    s.want_value = false;
                    s.nest += 1;
                    if s.nest == 1 {
                        s.expect_key = true;
                    }
                }
                b'}' | b']' => {
                    s.want_value = false;
                    s.nest = s.nest.saturating_sub(1);
                    if s.nest == 1 {
                        if let (Some(mut value), Some(start)) = (s.capture.take(), from.take()) {
                            if value.len() + (i - start) <= MAX_USAGE {
                                value.extend_from_slice(&chunk[start..i]);
                                if let Ok(Value::Object(usage)) = serde_json::from_slice(&value) {
                                    self.found = Some(usage);
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if let (Some(value), Some(start)) = (&mut s.capture, from) {
            if value.len() + (chunk.len() - start) <= MAX_USAGE {
                value.extend_from_slice(&chunk[start..]);
            } else {
                // Too large to be a usage object: not kept.
                s.capture = None;
            }
        }
    }
}

/// Adds `bytes` to a member name being read; past 16 bytes it cannot be `usage`.
fn push_key(key: &mut Option<Vec<u8>>, bytes: &[u8]) {
    if let Some(k) = key {
        if k.len() + bytes.len() > 16 {
            *key = None;
        } else {
            k.extend_from_slice(bytes);
        }
    }
}

/// The member name looked for.
const USAGE: &[u8] = b"\"usage\"";

/// The searcher for [`USAGE`], built once (building one costs more than a search of a line).
fn usage_finder() -> &'static memmem::Finder<'static> {
    static FINDER: std::sync::OnceLock<memmem::Finder<'static>> = std::sync::OnceLock::new();
    FINDER.get_or_init(|| memmem::Finder::new(USAGE))
}

/// Whether `rest`, what follows a `"usage"`, is a colon and an opening brace (spaces allowed
/// between): a usage object rather than `null`.
fn object_follows(rest: &[u8]) -> bool {
    match rest.trim_ascii_start().strip_prefix(b":") {
        Some(after) => after.trim_ascii_start().first() == Some(&b'{'),
        None => false,
    }
}

/// Whether `data` holds a `"usage"` member whose value is an object.
fn has_usage_object(data: &[u8]) -> bool {
    usage_finder()
        .find_iter(data)
        .any(|at| object_follows(&data[at + USAGE.len()..]))
}

/// `field` of `usage` as a whole number (see [`UsageScanner::field`]).
pub fn usage_field(usage: &Map<String, Value>, field: &str) -> Option<u64> {
    if let Some(n) = usage.get(field).and_then(Value::as_u64) {
        return Some(n);
    }
    if field != "total_tokens" {
        return None;
    }
    let sum = |a: &str, b: &str| {
        let a = usage.get(a).and_then(Value::as_u64)?;
        let b = usage.get(b).and_then(Value::as_u64)?;
        a.checked_add(b)
    };
    sum("prompt_tokens", "completion_tokens").or_else(|| sum("input_tokens", "output_tokens"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `body` cut at every `step` bytes.
    fn scan(format: Format, body: &[u8], step: usize) -> UsageScanner {
        let mut scanner = UsageScanner::new(format);
        for chunk in body.chunks(step) {
            scanner.feed(chunk);
        }
        scanner.finish();
        scanner
    }

    fn every_cut(format: Format, body: &str) -> Option<u64> {
        let whole = scan(format, body.as_bytes(), body.len()).field("total_tokens");
        for step in 1..=body.len().min(40) {
            assert_eq!(
                scan(format, body.as_bytes(), step).field("total_tokens"),
                whole,
                "cut every {step} bytes: {body}"
            );
        }
        whole
    }

    #[test]
    fn the_top_level_usage_member_of_a_json_body() {
        let completion = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\": {\"total_tokens\": 999} you asked for"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(every_cut(Format::Json, completion), Some(42));
        let first =
            r#"{ "usage" : { "prompt_tokens" : 5, "completion_tokens" : 6 } , "choices" : [ ] }"#;
        assert_eq!(every_cut(Format::Json, first), Some(11), "total summed");
        let anthropic = r#"{"content":[],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(every_cut(Format::Json, anthropic), Some(7));
        // A value that is the word "usage", then the member itself.
        let tricky = r#"{"model":"usage","usage":{"total_tokens":8}}"#;
        assert_eq!(every_cut(Format::Json, tricky), Some(8));
        // Only the top-level member counts.
        let nested =
            r#"{"choices":[{"usage":{"total_tokens":5}}],"data":{"usage":{"total_tokens":6}}}"#;
        assert_eq!(every_cut(Format::Json, nested), None);
        assert_eq!(every_cut(Format::Json, r#"{"usage":null}"#), None);
        assert_eq!(every_cut(Format::Json, r#"{"error":"busy"}"#), None);
        let scanner = scan(Format::Json, completion.as_bytes(), 7);
        assert_eq!(scanner.field("completion_tokens"), Some(30));
        assert_eq!(scanner.field("cached_tokens"), None);
    }

    #[test]
    fn a_usage_value_too_large_is_not_kept() {
        let padding = "x".repeat(MAX_USAGE);
        let body = format!(r#"{{"usage":{{"total_tokens":1,"pad":"{padding}"}},"n":1}}"#);
        assert_eq!(scan(Format::Json, body.as_bytes(), 1000).usage(), None);
    }

    #[test]
    fn the_last_event_with_usage_in_an_event_stream() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}],\"usage\":null}\r\n\r\n\
                      : a comment\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n\
                      data: [DONE]\n\n";
        assert_eq!(every_cut(Format::EventStream, stream), Some(11));
        let unterminated = "data: {\"usage\":{\"total_tokens\":4}}";
        assert_eq!(every_cut(Format::EventStream, unterminated), Some(4));
        let long = format!(
            "data: {{\"pad\":\"{}\",\"usage\":{{\"total_tokens\":1}}}}\ndata: {{\"usage\":{{\"total_tokens\":2}}}}\n",
            "y".repeat(MAX_LINE)
        );
        let scanner = scan(Format::EventStream, long.as_bytes(), 4096);
        assert_eq!(
            scanner.field("total_tokens"),
            Some(2),
            "the long line is skipped"
        );
    }

    #[test]
    fn formats_from_content_type() {
        assert_eq!(Format::of(Some(b"application/json")), Some(Format::Json));
        assert_eq!(
            Format::of(Some(b"application/json; charset=utf-8")),
            Some(Format::Json)
        );
        assert_eq!(
            Format::of(Some(b"application/problem+json")),
            Some(Format::Json)
        );
        assert_eq!(
            Format::of(Some(b"Text/Event-Stream")),
            Some(Format::EventStream)
        );
        assert_eq!(Format::of(Some(b"text/plain")), None);
        assert_eq!(Format::of(None), None);
    }
}
