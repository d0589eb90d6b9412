//! HTTP/1.1 heads read as bytes, for a proxy that forwards them as bytes.
//!
//! A byte-forwarding proxy must know three things of a message it passes on: where its head
//! ends, how its body is framed, and whether the connection stays open after it. This module
//! finds them with [`httparse`] (the parser hyper itself uses) and with hyper's rules for
//! framing, so that a message read here as a **plain** one is one hyper reads the same way.
//! Everything else (a head httparse refuses, conflicting or invalid lengths, a
//! `Transfer-Encoding` on a request, `Expect`, `Upgrade`, `CONNECT`, a target not in origin
//! form, a head over the limit) is [`Request::Other`]: the caller leaves that message, and the
//! rest of its connection, to hyper, which answers it exactly as it does today. No HTTP
//! grammar is written here: only the choice of what is plain.
//!
//! The rules mirror hyper 1.x (`proto::h1::role`): at most [`MAX_HEADERS`] fields; one
//! `Content-Length`, or several equal ones, of digits only; `Connection: close` ends the
//! connection, HTTP/1.0 keeps it open only with `keep-alive`; a response's body is empty for
//! `HEAD`, `204` and `304`, chunked when its last `Transfer-Encoding` is `chunked`, read to
//! the close when there is neither a transfer coding nor a length. The differential tests
//! (`tests/wire_differential.rs`) and the `wire` fuzz target hold this module to hyper.

use std::mem::MaybeUninit;
use std::ops::Range;

use smallvec::SmallVec;

/// The most header fields a head may have (hyper's default).
pub const MAX_HEADERS: usize = 100;

/// The longest request target hyper takes.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// The largest length hyper's body decoder takes.
const MAX_LENGTH: u64 = u64::MAX - 2;

/// One header field of a head: where its name and value are in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The name's bytes.
    pub name: Range<usize>,
    /// The value's bytes (without the surrounding whitespace).
    pub value: Range<usize>,
}

/// How a message's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked (a request's only when `Transfer-Encoding: chunked` is its one coding field
    /// and it has no length).
    Chunked,
    /// Read until the connection closes (a response only).
    UntilClose,
}

/// A plain request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The head's length in bytes, blank line included: the body (or the next request)
    /// starts there.
    pub len: usize,
    /// The method's bytes.
    pub method: Range<usize>,
    /// The target's bytes (origin form: `/path?query`).
    pub target: Range<usize>,
    /// Whether the request said HTTP/1.0.
    pub http10: bool,
    /// The header fields, in order.
    pub fields: SmallVec<[Field; 16]>,
    /// The body's framing: [`Framing::Empty`], [`Framing::Length`] or [`Framing::Chunked`].
    pub framing: Framing,
    /// Whether the connection stays open after the exchange.
    pub keep_alive: bool,
}

/// Why a request is not plain: the caller hands it to hyper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Other {
    /// httparse refused the head (hyper answers 400).
    Invalid,
    /// The head is longer than the limit, or has more than [`MAX_HEADERS`] fields (431).
    TooLarge,
    /// The target is longer than hyper takes (414).
    TargetTooLong,
    /// The method or the target is not one `http` makes (400).
    BadTarget,
    /// The target is not in origin form (absolute form, `*`, an authority), or carries a
    /// fragment.
    NotOriginForm,
    /// `Content-Length` invalid, or several that differ (400).
    BadLength,
    /// A `Transfer-Encoding` (chunked, or invalid for a request).
    TransferEncoding,
    /// `Expect` (hyper answers `100 Continue` itself).
    Expect,
    /// `Upgrade`, or `CONNECT`.
    Upgrade,
}

/// What [`Request::parse`] read.
// The head is read once per message and taken out of the value at once: boxing it would
// cost an allocation per message on the forwarding path for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Request {
    /// The head is not complete yet: read more.
    Partial,
    /// A plain request.
    Plain(RequestHead),
    /// Not plain (see [`Other`]).
    Other(Other),
}

impl Request {
    /// Reads the request head at the start of `buf`, which may hold at most `max_head` bytes
    /// of head (hyper's `max_buf_size`).
    pub fn parse(buf: &[u8], max_head: usize) -> Request {
        // Left uninitialised, as hyper leaves them: httparse writes the ones it reads.
        let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(buf, &mut headers) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= max_head => {
                return Request::Other(Other::TooLarge)
            }
            Ok(httparse::Status::Partial) => return Request::Partial,
            Err(httparse::Error::TooManyHeaders) => return Request::Other(Other::TooLarge),
            Err(_) => return Request::Other(Other::Invalid),
        };
        if len > max_head {
            return Request::Other(Other::TooLarge);
        }
        let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version)
        else {
            return Request::Other(Other::Invalid);
        };
        if target.len() > MAX_TARGET {
            return Request::Other(Other::TargetTooLong);
        }
        if http::Method::from_bytes(method.as_bytes()).is_err() {
            return Request::Other(Other::BadTarget);
        }
        if method == "CONNECT" {
            return Request::Other(Other::Upgrade);
        }
        // `http` reads a fragment off a target, which a byte forwarder would pass on.
        if !target.starts_with('/') || target.contains('#') {
            return Request::Other(Other::NotOriginForm);
        }
        if http::uri::PathAndQuery::try_from(target.as_bytes()).is_err() {
            return Request::Other(Other::BadTarget);
        }
        let http10 = version == 0;
        let mut keep_alive = !http10;
        let mut saw_close = false;
        let mut length: Option<u64> = None;
        // `Transfer-Encoding` fields seen, and whether the one seen says `chunked` alone.
        let mut codings = 0;
        let mut chunked = false;
        let mut fields = SmallVec::new();
        for header in req.headers.iter() {
            let name = header.name.as_bytes();
            let value = header.value;
            if http::HeaderName::from_bytes(name).is_err() {
                return Request::Other(Other::Invalid);
            }
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                codings += 1;
                chunked = value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            } else if name.eq_ignore_ascii_case(b"content-length") {
                let Some(n) = digits(value).filter(|n| *n <= MAX_LENGTH) else {
                    return Request::Other(Other::BadLength);
                };
                if length.is_some_and(|prev| prev != n) {
                    return Request::Other(Other::BadLength);
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case(b"connection") {
                if saw_close || has_token(value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(value, "keep-alive");
                }
            } else if name.eq_ignore_ascii_case(b"expect") {
                return Request::Other(Other::Expect);
            } else if name.eq_ignore_ascii_case(b"upgrade") {
                return Request::Other(Other::Upgrade);
            }
            fields.push(Field {
                name: offset(buf, name),
                value: offset(buf, value),
            });
        }
        // One `Transfer-Encoding: chunked`, on HTTP/1.1, without a length: the chunked body
        // the byte path reads. Any other coding, several fields, one beside a length (a
        // request smuggling's classic shape) or on HTTP/1.0: hyper decides.
        let framing = match (codings, length) {
            (0, None | Some(0)) => Framing::Empty,
            (0, Some(n)) => Framing::Length(n),
            (1, None) if chunked && !http10 => Framing::Chunked,
            _ => return Request::Other(Other::TransferEncoding),
        };
        Request::Plain(RequestHead {
            len,
            method: offset(buf, method.as_bytes()),
            target: offset(buf, target.as_bytes()),
            http10,
            fields,
            framing,
            keep_alive,
        })
    }
}

/// A response head from an upstream.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// The head's length in bytes, blank line included.
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// Whether the response said HTTP/1.0.
    pub http10: bool,
    /// The header fields, in order.
    pub fields: SmallVec<[Field; 16]>,
    /// The body's framing.
    pub framing: Framing,
    /// Whether the upstream connection may carry another request after this one.
    pub keep_alive: bool,
}

/// What [`Response::parse`] read.
// The head is read once per message and taken out of the value at once: boxing it would
// cost an allocation per message on the forwarding path for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Response {
    /// The head is not complete yet: read more.
    Partial,
    /// An informational (`1xx`, not `101`) head of this length: skip it and read the next.
    Informational(usize),
    /// A final response head.
    Final(ResponseHead),
    /// A head hyper's client would refuse, or a `101` (no upgrade was asked for): the
    /// exchange fails (502).
    Refused,
}

impl Response {
    /// Reads the response head at the start of `buf` to a request whose method was `HEAD` or
    /// not, allowing at most `max_head` bytes of head.
    pub fn parse(buf: &[u8], head_request: bool, max_head: usize) -> Response {
        let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            buf,
            &mut headers,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) if len <= max_head => len,
            Ok(httparse::Status::Partial) if buf.len() < max_head => return Response::Partial,
            _ => return Response::Refused,
        };
        let (Some(status), Some(version)) = (res.code, res.version) else {
            return Response::Refused;
        };
        if !(100..=999).contains(&status) {
            return Response::Refused;
        }
        match status {
            101 => return Response::Refused,
            100..=199 => return Response::Informational(len),
            _ => {}
        }
        let http10 = version == 0;
        let mut keep_alive = !http10;
        let mut saw_close = false;
        let mut chunked = None;
        // Every value of every `Content-Length` line must be the same number.
        let mut length: Option<u64> = None;
        let mut bad_length = false;
        let mut fields = SmallVec::new();
        for header in res.headers.iter() {
            let name = header.name.as_bytes();
            let value = header.value;
            if http::HeaderName::from_bytes(name).is_err() {
                return Response::Refused;
            }
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                // The last line decides, as the last coding of a line does.
                chunked = Some(last_token_is(value, "chunked"));
            } else if name.eq_ignore_ascii_case(b"content-length") {
                match std::str::from_utf8(value) {
                    Ok(text) => {
                        for v in text.split(',') {
                            match digits(v.trim().as_bytes()) {
                                Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                                _ => bad_length = true,
                            }
                        }
                    }
                    Err(_) => bad_length = true,
                }
            } else if name.eq_ignore_ascii_case(b"connection") {
                // Once a line says close, a later keep-alive does not undo it (as hyper's
                // client reads it, and as the request's `Connection` is read above).
                if saw_close || has_token(value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if http10 && has_token(value, "keep-alive") {
                    keep_alive = true;
                }
            }
            fields.push(Field {
                name: offset(buf, name),
                value: offset(buf, value),
            });
        }
        let framing = if head_request || status == 204 || status == 304 {
            Framing::Empty
        } else if let Some(chunked) = chunked {
            if http10 {
                return Response::Refused;
            }
            if chunked {
                Framing::Chunked
            } else {
                Framing::UntilClose
            }
        } else {
            match length {
                _ if bad_length => return Response::Refused,
                Some(n) if n <= MAX_LENGTH => Framing::Length(n),
                Some(_) => return Response::Refused,
                None => Framing::UntilClose,
            }
        };
        if framing == Framing::UntilClose {
            keep_alive = false;
        }
        Response::Final(ResponseHead {
            len,
            status,
            http10,
            fields,
            framing,
            keep_alive,
        })
    }
}

/// A chunked body's progress, read with `httparse::parse_chunk_size` on lines held to the
/// grammar of hyper's decoder (CRLF line ends only): how many of the bytes at the start of a
/// buffer belong to the body, so that they can be passed on as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunks {
    /// At a chunk's size line.
    Size,
    /// Inside a chunk's data: this many bytes, then its line end.
    Data(u64),
    /// At the line end after a chunk's data.
    DataEnd,
    /// After the last chunk: the trailer section.
    Trailers,
    /// The body is over.
    Done,
}

/// What [`Chunks::advance`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// This many bytes at the start of the buffer are the body's: pass them on.
    Take(usize),
    /// Nothing can be decided before more bytes arrive.
    More,
    /// The framing is broken: the exchange fails.
    Broken,
}

impl Chunks {
    /// Reads as far as `buf` allows, from the state `self`.
    pub fn advance(&mut self, buf: &[u8]) -> Step {
        match *self {
            Chunks::Size => {
                let line = match size_line(buf) {
                    Ok(Some(line)) => line,
                    Ok(None) => return Step::More,
                    Err(()) => return Step::Broken,
                };
                match httparse::parse_chunk_size(&buf[..line]) {
                    Ok(httparse::Status::Complete((used, 0))) => {
                        *self = Chunks::Trailers;
                        Step::Take(used)
                    }
                    Ok(httparse::Status::Complete((used, size))) => {
                        *self = Chunks::Data(size);
                        Step::Take(used)
                    }
                    Ok(httparse::Status::Partial) | Err(_) => Step::Broken,
                }
            }
            Chunks::Data(left) => {
                if buf.is_empty() {
                    return Step::More;
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let left = left - n as u64;
                *self = if left == 0 {
                    Chunks::DataEnd
                } else {
                    Chunks::Data(left)
                };
                Step::Take(n)
            }
            Chunks::DataEnd => match buf {
                [] | [b'\r'] => Step::More,
                // hyper's decoder takes nothing but CRLF here.
                [b'\r', b'\n', ..] => {
                    *self = Chunks::Size;
                    Step::Take(2)
                }
                _ => Step::Broken,
            },
            Chunks::Trailers => {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(buf, &mut headers) {
                    // hyper's decoder finds the end of the trailers by CRLFs alone: a bare LF
                    // would end them here and not there.
                    Ok(httparse::Status::Complete((used, _)))
                        if used > MAX_TRAILERS || bare_lf(&buf[..used]) =>
                    {
                        Step::Broken
                    }
                    Ok(httparse::Status::Complete((used, _))) => {
                        *self = Chunks::Done;
                        Step::Take(used)
                    }
                    Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILERS => Step::Broken,
                    Ok(httparse::Status::Partial) => Step::More,
                    Err(_) => Step::Broken,
                }
            }
            Chunks::Done => Step::Take(0),
        }
    }
}

/// A chunked body read whole by [`dechunk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dechunked {
    /// The body, read whole.
    Whole {
        /// Its content (chunk extensions and trailers dropped, as hyper's decoder drops them).
        data: Vec<u8>,
        /// How many bytes of the buffer it took.
        len: usize,
        /// Whether its trailer section had fields.
        trailers: bool,
    },
    /// Not all of it is in the buffer, or it is longer than the bound.
    Partial,
    /// The framing is broken.
    Broken,
}

/// The chunked body at the start of `buf`, if it is all there within `max` bytes.
pub fn dechunk(buf: &[u8], max: usize) -> Dechunked {
    let buf = &buf[..buf.len().min(max)];
    let mut state = Chunks::Size;
    let mut data = Vec::new();
    let mut used = 0;
    let mut trailers = false;
    while state != Chunks::Done {
        let before = state;
        match state.advance(&buf[used..]) {
            Step::Take(n) => {
                match before {
                    Chunks::Data(_) => data.extend_from_slice(&buf[used..used + n]),
                    // More than the blank line that ends the section.
                    Chunks::Trailers => trailers = n > 2,
                    _ => {}
                }
                used += n;
            }
            Step::More => return Dechunked::Partial,
            Step::Broken => return Dechunked::Broken,
        }
    }
    Dechunked::Whole {
        data,
        len: used,
        trailers,
    }
}

/// The longest chunk-size line taken (hyper takes 16 KiB of extensions).
const MAX_SIZE_LINE: usize = 4096;

/// The longest trailer section taken (hyper takes 16 KiB).
const MAX_TRAILERS: usize = 8192;

/// The length of the chunk-size line at the start of `buf`, CRLF included, checked with the
/// grammar of hyper's decoder, which is stricter than `httparse::parse_chunk_size`: at least
/// one hex digit, then spaces or tabs, then an extension after `;` without a bare LF, then
/// CRLF. `Ok(None)`: the line is not complete yet.
fn size_line(buf: &[u8]) -> Result<Option<usize>, ()> {
    #[derive(PartialEq)]
    enum At {
        Start,
        Digits,
        Space,
        Extension,
    }
    let mut at = At::Start;
    for (i, &b) in buf.iter().enumerate() {
        if i >= MAX_SIZE_LINE {
            return Err(());
        }
        at = match (at, b) {
            (At::Start | At::Digits, b) if b.is_ascii_hexdigit() => At::Digits,
            (At::Digits | At::Space, b' ' | b'\t') => At::Space,
            (At::Digits | At::Space, b';') => At::Extension,
            (At::Digits | At::Space | At::Extension, b'\r') => {
                return match buf.get(i + 1) {
                    None => Ok(None),
                    Some(b'\n') => Ok(Some(i + 2)),
                    Some(_) => Err(()),
                };
            }
            (At::Extension, b'\n') => return Err(()),
            (At::Extension, _) => At::Extension,
            _ => return Err(()),
        };
    }
    Ok(None)
}

/// Whether `bytes` has an LF that no CR precedes.
fn bare_lf(bytes: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', bytes).any(|i| i == 0 || bytes[i - 1] != b'\r')
}

/// Where `part` (a slice of `buf`) lies in `buf`.
fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// A length of decimal digits only (no sign, no space), as hyper reads one.
fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// `value` as text when it is visible ASCII, tabs and spaces only: hyper reads the tokens of
/// `Connection` and `Transfer-Encoding` with `HeaderValue::to_str`, and a value with any other
/// byte (obs-text such as UTF-8) has no tokens for it.
fn text(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// Whether the comma-separated `value` has `token` (case-insensitive).
pub(crate) fn has_token(value: &[u8], token: &str) -> bool {
    text(value).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// Whether the last comma-separated token of `value` is `token`.
fn last_token_is(value: &[u8], token: &str) -> bool {
    text(value).is_some_and(|v| {
        v.rsplit(',')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(bytes: &[u8]) -> RequestHead {
        match Request::parse(bytes, 8192) {
            Request::Plain(head) => head,
            other => panic!("{other:?}"),
        }
    }

    fn other(bytes: &[u8]) -> Other {
        match Request::parse(bytes, 8192) {
            Request::Other(why) => why,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plain_get_is_read_with_its_fields() {
        let b = b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\n\r\nnext";
        let head = plain(b);
        assert_eq!(&b[head.method.clone()], b"GET");
        assert_eq!(&b[head.target.clone()], b"/a?b=1");
        assert_eq!(head.len, b.len() - 4);
        assert_eq!(head.fields.len(), 2);
        assert_eq!(&b[head.fields[1].value.clone()], b"10.0.0.1");
        assert_eq!(head.framing, Framing::Empty);
        assert!(head.keep_alive);
    }

    #[test]
    fn lengths_follow_hyper() {
        let h = plain(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(5));
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
        ] {
            assert_eq!(
                other(bad),
                Other::BadLength,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for smuggling in [
            &b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(
                other(smuggling),
                Other::TransferEncoding,
                "{:?}",
                String::from_utf8_lossy(smuggling)
            );
        }
        let head = plain(b"POST / HTTP/1.1\r\nTransfer-Encoding:  Chunked \r\n\r\n");
        assert_eq!(head.framing, Framing::Chunked);
    }

    #[test]
    fn a_chunked_body_is_read_whole_or_not_at_all() {
        let body = b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        assert_eq!(
            dechunk(body, 1024),
            Dechunked::Whole {
                data: b"wikipedia".to_vec(),
                len: body.len() - 4,
                trailers: true,
            }
        );
        assert_eq!(
            dechunk(b"0\r\n\r\n", 1024),
            Dechunked::Whole {
                data: Vec::new(),
                len: 5,
                trailers: false,
            }
        );
        assert_eq!(dechunk(&body[..12], 1024), Dechunked::Partial);
        assert_eq!(dechunk(body, 12), Dechunked::Partial, "beyond the bound");
        assert_eq!(dechunk(b"zz\r\nok\r\n0\r\n\r\n", 1024), Dechunked::Broken);
        assert_eq!(dechunk(b"2\r\nokX\r\n0\r\n\r\n", 1024), Dechunked::Broken);
    }

    #[test]
    fn connection_and_version_decide_keep_alive() {
        assert!(!plain(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(plain(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(!plain(b"GET / HTTP/1.1\r\nConnection: x, close\r\n\r\n").keep_alive);
        assert!(
            !plain(b"GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n")
                .keep_alive
        );
    }

    #[test]
    fn what_is_not_plain_is_named() {
        assert_eq!(
            other(b"GET http://a/ HTTP/1.1\r\n\r\n"),
            Other::NotOriginForm
        );
        assert_eq!(other(b"OPTIONS * HTTP/1.1\r\n\r\n"), Other::NotOriginForm);
        assert_eq!(other(b"GET /a#f HTTP/1.1\r\n\r\n"), Other::NotOriginForm);
        assert_eq!(other(b"CONNECT a:443 HTTP/1.1\r\n\r\n"), Other::Upgrade);
        assert_eq!(
            other(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"),
            Other::Upgrade
        );
        assert_eq!(
            other(b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n"),
            Other::Expect
        );
        assert_eq!(
            other(b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n"),
            Other::Invalid
        );
        assert_eq!(other(b"GET / HTTP/2.0\r\n\r\n"), Other::Invalid);
    }

    #[test]
    fn a_head_over_the_limit_is_too_large_complete_or_not() {
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
        assert_eq!(other(long.as_bytes()), Other::TooLarge);
        assert_eq!(other(&long.as_bytes()[..8500]), Other::TooLarge);
        assert!(matches!(
            Request::parse(&long.as_bytes()[..100], 8192),
            Request::Partial
        ));
    }

    #[test]
    fn response_framing_follows_hyper() {
        let framing = |b: &[u8], head: bool| match Response::parse(b, head, 8192) {
            Response::Final(h) => Some((h.framing, h.keep_alive)),
            _ => None,
        };
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(framing(ok, false), Some((Framing::Length(3), true)));
        assert_eq!(framing(ok, true), Some((Framing::Empty, true)));
        let te =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(framing(te, false), Some((Framing::Chunked, true)));
        let close = b"HTTP/1.1 200 OK\r\n\r\n";
        assert_eq!(framing(close, false), Some((Framing::UntilClose, false)));
        let undone = b"HTTP/1.0 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(framing(undone, false), Some((Framing::Length(3), false)));
        let listed = b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n";
        assert_eq!(framing(listed, false), Some((Framing::Length(3), true)));
        let differ = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(framing(differ, false), None);
        assert!(matches!(
            Response::parse(b"HTTP/1.1 100 Continue\r\n\r\n", false, 8192),
            Response::Informational(25)
        ));
    }

    #[test]
    fn chunks_are_passed_on_to_the_end_of_the_trailers() {
        let body = b"4;ext=1\r\nwiki\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let mut state = Chunks::Size;
        let mut at = 0;
        while state != Chunks::Done {
            match state.advance(&body[at..]) {
                Step::Take(n) => at += n,
                other => panic!("{other:?} at {at}"),
            }
        }
        assert_eq!(&body[at..], b"NEXT");
        let mut state = Chunks::Size;
        assert_eq!(state.advance(b"zz\r\n"), Step::Broken);
        let mut state = Chunks::DataEnd;
        assert_eq!(state.advance(b"xx"), Step::Broken);
    }

    #[test]
    fn tokens_in_values_with_obs_text_are_not_read() {
        // hyper reads no token of a value that is not visible ASCII.
        assert!(plain(b"GET / HTTP/1.1\r\nConnection: close, \xc3\xa9\r\n\r\n").keep_alive);
        assert!(!plain(b"GET / HTTP/1.0\r\nConnection: keep-alive, \xc3\xa9\r\n\r\n").keep_alive);
        let te = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \xc3\xa9, chunked\r\n\r\n";
        assert!(matches!(
            Response::parse(te, false, 8192),
            Response::Final(ResponseHead {
                framing: Framing::UntilClose,
                ..
            })
        ));
    }

    #[test]
    fn chunk_lines_follow_hyper_s_decoder() {
        let step = |mut state: Chunks, buf: &[u8]| state.advance(buf);
        for broken in [
            &b"\r\n"[..],
            b";a\r\n",
            b" 3\r\n",
            b"3\nabc",
            b"3;a\nb\r\n",
            b"3 4\r\n",
            b"3\rx",
        ] {
            assert_eq!(
                step(Chunks::Size, broken),
                Step::Broken,
                "{:?}",
                String::from_utf8_lossy(broken)
            );
        }
        assert_eq!(step(Chunks::Size, b"3 \t;a=\"b\"\r\nabc"), Step::Take(11));
        assert_eq!(step(Chunks::Size, b"3;a"), Step::More);
        assert_eq!(step(Chunks::Size, &[b'3'; 5000]), Step::Broken);
        assert_eq!(step(Chunks::DataEnd, b"\n0\r\n"), Step::Broken);
        assert_eq!(step(Chunks::Trailers, b"X: 1\n\n"), Step::Broken);
        assert_eq!(step(Chunks::Trailers, b"\n"), Step::Broken);
        assert_eq!(step(Chunks::Trailers, b"X: 1\r\n\r\n"), Step::Take(8));
    }
}
