//! `sluice_http::wire` against hyper 1.x itself: a request `wire` reads as plain is one
//! hyper's server reads the same way (method, target, fields, body, keep-alive, where the
//! next request starts), and a final response head `wire` reads is one hyper's client reads
//! the same way (status, fields, body, keep-alive). A named corpus, printed as a table with
//! `-- --nocapture`, then generated requests.

#[path = "support/wire_harness.rs"]
mod wire_harness;

use proptest::prelude::*;
use wire_harness::{paused_runtime, request_differential, response_differential};

/// Named requests: the tricky corners of HTTP/1.1 framing.
fn request_corpus() -> Vec<(&'static str, Vec<u8>)> {
    let long_value = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
        "a".repeat(9000)
    );
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
    let hundred: String = (0..100).map(|i| format!("X-{i}: v\r\n")).collect();
    let hundred = format!("GET / HTTP/1.1\r\n{hundred}\r\n");
    let long_target = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(8100));
    let cases: Vec<(&'static str, String)> = vec![
        ("plain GET", "GET /a?b=1 HTTP/1.1\r\nHost: a\r\n\r\n".into()),
        (
            "pipelined, then bytes hyper refuses",
            "GET /1 HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /2 HTTP/1.0\r\n\
             Connection: keep-alive\r\n\r\n\rGb"
                .into(),
        ),
        (
            "HEAD, then a request hyper waits on",
            "HEAD / HTTP/1.1\n\nccbTEPUT /%zz HTTP/1.1\n\nGT".into(),
        ),
        (
            "HEAD with a body, HTTP/1.0 keep-alive, bytes hyper refuses",
            "HEAD / HTTP/1.1\nContent-Length: 5\nX:   padded   \n\n/TcGET //x HTTP/1.0\n\
             Connection: Keep-Alive, x\n\n\rGb"
                .into(),
        ),
        ("GET without fields", "GET / HTTP/1.1\r\n\r\n".into()),
        (
            "pipelined GETs",
            "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n".into(),
        ),
        (
            "pipelined POST, GET, POST",
            "POST /1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /2 HTTP/1.1\r\n\r\n\
             POST /3 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                .into(),
        ),
        (
            "pipelined, second incomplete",
            "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\nHo".into(),
        ),
        (
            "chunked POST, then a GET",
            "POST /1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
             GET /2 HTTP/1.1\r\n\r\n"
                .into(),
        ),
        (
            "chunked POST with an extension and a trailer",
            "POST / HTTP/1.1\r\nTransfer-Encoding:  chunked \r\n\r\n3;x=y\r\nabc\r\n0\r\n\
             X-Sum: 1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"
                .into(),
        ),
        (
            "chunked POST, broken chunks",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".into(),
        ),
        (
            "chunked POST, bytes no field is made of in its trailers",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\u{ff}\u{ff}\r\n".into(),
        ),
        (
            "chunked POST, cut",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab".into(),
        ),
        (
            "POST with a short body",
            "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc".into(),
        ),
        (
            "CL then TE",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n"
                .into(),
        ),
        (
            "TE then CL",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n"
                .into(),
        ),
        (
            "TE chunked",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
        ),
        (
            "TE gzip",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".into(),
        ),
        (
            "TE on HTTP/1.0",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(),
        ),
        (
            "chunk size zz",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".into(),
        ),
        (
            "chunk size overflow",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nx\r\n"
                .into(),
        ),
        (
            "chunk extension",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\n\r\n"
                .into(),
        ),
        (
            "chunk extension with LF",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n"
                .into(),
        ),
        (
            "duplicate equal CL",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".into(),
        ),
        (
            "duplicate differing CL",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!".into(),
        ),
        (
            "CL 5, 5",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello".into(),
        ),
        (
            "CL +5",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello".into(),
        ),
        (
            "CL empty",
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n".into(),
        ),
        (
            "CL huge",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n".into(),
        ),
        (
            "CL u64 max",
            "POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n".into(),
        ),
        (
            "CL 0 and 00",
            "GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 00\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"
                .into(),
        ),
        (
            "two hosts",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".into(),
        ),
        (
            "absolute form with another host",
            "GET http://a:8080/ HTTP/1.1\r\nHost: b\r\n\r\n".into(),
        ),
        (
            "CL zero",
            "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\n\r\n".into(),
        ),
        ("obs-fold", "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n".into()),
        (
            "bare LF everywhere",
            "GET /lf HTTP/1.1\nHost: a\nX: y\n\nGET /2 HTTP/1.1\n\n".into(),
        ),
        (
            "bare LF in fields only",
            "GET / HTTP/1.1\r\nHost: a\nX: y\r\n\n".into(),
        ),
        ("head over 8192", long_value.clone()),
        (
            "second head over 8192",
            format!("GET /1 HTTP/1.1\r\nHost: a\r\n\r\n{long_value}"),
        ),
        ("101 fields", many),
        ("100 fields", hundred),
        ("target of 8100 bytes", long_target),
        (
            "absolute form",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n".into(),
        ),
        (
            "asterisk form",
            "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n".into(),
        ),
        (
            "authority form",
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n".into(),
        ),
        (
            "Expect 100-continue",
            "PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi".into(),
        ),
        (
            "Upgrade websocket",
            "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".into(),
        ),
        (
            "HTTP/1.0",
            "GET / HTTP/1.0\r\n\r\nGET /never HTTP/1.0\r\n\r\n".into(),
        ),
        (
            "HTTP/1.0 keep-alive",
            "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n".into(),
        ),
        (
            "Connection close",
            "GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n".into(),
        ),
        (
            "close then keep-alive",
            "GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n".into(),
        ),
        (
            "Connection close with non-ASCII",
            "GET / HTTP/1.1\r\nConnection: close, \u{e9}\r\n\r\nGET /2 HTTP/1.1\r\n\r\n".into(),
        ),
        (
            "HTTP/1.0 keep-alive with non-ASCII",
            "GET / HTTP/1.0\r\nConnection: keep-alive, \u{e9}\r\n\r\nGET /2 HTTP/1.0\r\n\r\n"
                .into(),
        ),
        (
            "field name with (",
            "GET / HTTP/1.1\r\nA(b: c\r\n\r\n".into(),
        ),
        (
            "field name with space",
            "GET / HTTP/1.1\r\nA b: c\r\n\r\n".into(),
        ),
        (
            "space before colon",
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n".into(),
        ),
        ("fragment", "GET /a#frag HTTP/1.1\r\n\r\n".into()),
        (
            "non-ASCII value",
            "GET / HTTP/1.1\r\nX: caf\u{e9}\r\n\r\n".into(),
        ),
        ("HTTP/2.0 line", "GET / HTTP/2.0\r\n\r\n".into()),
        (
            "HTTP/2 preface after a request",
            "GET / HTTP/1.1\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".into(),
        ),
        (
            "the preface's first line after a request",
            "GET / HTTP/1.1\r\n\r\nPRI * HTTP/2.0\r\n\r\n".into(),
        ),
        ("lowercase method", "get / HTTP/1.1\r\n\r\n".into()),
        ("custom method", "PURGE /x HTTP/1.1\r\n\r\n".into()),
        ("two spaces in line", "GET  / HTTP/1.1\r\n\r\n".into()),
        ("target with braces", "GET /{a} HTTP/1.1\r\n\r\n".into()),
        ("target //", "GET //a HTTP/1.1\r\n\r\n".into()),
        ("empty", String::new()),
        ("garbage", "\x16\x03\x01\x02\x00".into()),
        ("leading CRLF", "\r\nGET / HTTP/1.1\r\n\r\n".into()),
        ("tab in value", "GET / HTTP/1.1\r\nX: a\tb\r\n\r\n".into()),
    ];
    cases
        .into_iter()
        .map(|(name, text)| (name, text.into_bytes()))
        .collect()
}

#[test]
fn the_request_corpus_agrees_with_hyper() {
    let runtime = paused_runtime();
    let (mut plain, mut handed) = (0, 0);
    let corpus = request_corpus();
    println!("{:<36} | {:<32} | wire", "request", "hyper");
    for (name, bytes) in &corpus {
        let (hyper, wire) = request_differential(&runtime, bytes);
        plain += wire.iter().filter(|v| *v == "Plain").count();
        handed += wire
            .iter()
            .filter(|v| v.ends_with("(handed to hyper)"))
            .count();
        println!("{name:<36} | {hyper:<32} | {}", wire.join(", "));
    }
    println!(
        "{} cases: {plain} requests plain, {handed} handed to hyper that hyper served",
        corpus.len()
    );
}

/// Named responses, each with whether the request was `HEAD`.
fn response_corpus() -> Vec<(&'static str, bool, Vec<u8>)> {
    let cases: Vec<(&'static str, bool, &str)> =
        vec![
        ("CL", false, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
        ("CL short", false, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc"),
        (
            "duplicate equal CL",
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        ),
        (
            "duplicate differing CL",
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        ),
        ("CL 3, 3", false, "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc"),
        ("CL +3", false, "HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc"),
        (
            "chunked with extensions and trailers",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
             4;ext=1\r\nwiki\r\n5 ; a=\"b\"\r\npedia\r\n0\r\nX-T: 1\r\n\r\n",
        ),
        (
            "TE gzip, chunked",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "TE chunked and CL",
            false,
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n\
             3\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "TE not chunked",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nuntil the close",
        ),
        (
            "TE non-ASCII then chunked",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: \u{e9}, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "HTTP/1.0 with TE",
            false,
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        ("HTTP/1.0 CL", false, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi"),
        (
            "HTTP/1.0 keep-alive",
            false,
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        ),
        (
            "HTTP/1.0, close then keep-alive",
            false,
            "HTTP/1.0 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        ),
        (
            "HTTP/1.1, close then keep-alive",
            false,
            "HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        ),
        (
            "Connection close, non-ASCII",
            false,
            "HTTP/1.1 200 OK\r\nConnection: close, \u{e9}\r\nContent-Length: 2\r\n\r\nhi",
        ),
        ("no length", false, "HTTP/1.1 200 OK\r\n\r\nto the close"),
        ("204 with a body", false, "HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n"),
        ("304 with a body", false, "HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n"),
        ("HEAD", true, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"),
        (
            "100 Continue then 200",
            false,
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        ),
        ("101 unasked", false, "HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        ("obs-fold", false, "HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
        ("bare LF", false, "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi"),
        ("status 600", false, "HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n"),
        ("status 99", false, "HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n"),
        (
            "chunk size zz",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "chunk size overflow",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc\r\n",
        ),
        (
            "missing CRLF after chunk data",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n",
        ),
        (
            "LF only after chunk data",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n",
        ),
        (
            "LF only after chunk size",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
        ),
        (
            "chunk size missing",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
        ),
        (
            "chunk extension with LF",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;a\nb\r\nabc\r\n0\r\n\r\n",
        ),
        (
            "trailers ended by LF",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX: 1\n\n",
        ),
        (
            "last chunk ended by LF",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n",
        ),
        (
            "chunked cut short",
            false,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        ),
    ];
    cases
        .into_iter()
        .map(|(name, head, text)| (name, head, text.as_bytes().to_vec()))
        .collect()
}

#[test]
fn the_response_corpus_agrees_with_hyper() {
    let runtime = paused_runtime();
    let corpus = response_corpus();
    println!("{:<36} | {:<44} | wire", "response", "hyper client");
    for (name, head, bytes) in &corpus {
        let (hyper, wire) = response_differential(&runtime, bytes, *head);
        println!("{name:<36} | {hyper:<44} | {wire}");
    }
    println!("{} response cases", corpus.len());
}

/// Header lines, ordinary and tricky, with `{}` where the line ending goes.
const LINES: &[&str] = &[
    "Host: a",
    "X-Forwarded-For: 10.0.0.1",
    "Content-Length: 0",
    "Content-Length: 3",
    "Content-Length: 3",
    "Content-Length: 5",
    "Content-Length: 3, 3",
    "Content-Length: +3",
    "Content-Length: ",
    "Content-Length: 99999999999999999999999",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: gzip",
    "Connection: close",
    "Connection: keep-alive",
    "Connection: Keep-Alive, x",
    "Connection: close, \u{e9}",
    "Expect: 100-continue",
    "Upgrade: websocket",
    "A(b: c",
    "Host : a",
    "X: caf\u{e9}",
    "X: a\tb",
    " folded",
    "X:no-space",
    "X:   padded   ",
];

const METHODS: &[&str] = &[
    "GET", "POST", "HEAD", "PUT", "CONNECT", "get", "PURGE", "OPTIONS",
];

const TARGETS: &[&str] = &[
    "/",
    "/a?b=1",
    "//x",
    "/a#f",
    "*",
    "http://a/",
    "a:443",
    "/%zz",
    "/{x}",
    "/a b",
];

fn request() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(METHODS),
        prop::sample::select(TARGETS),
        prop::sample::select(&["HTTP/1.1", "HTTP/1.0", "HTTP/1.2"][..]),
        prop::collection::vec(prop::sample::select(LINES), 0..5),
        prop::sample::select(&["\r\n", "\n"][..]),
        prop::collection::vec(prop::sample::select(&b"abc\r\nGET/ "[..]), 0..8),
    )
        .prop_map(|(method, target, version, lines, eol, body)| {
            let mut out = format!("{method} {target} {version}{eol}");
            for line in lines {
                out.push_str(line);
                out.push_str(eol);
            }
            out.push_str(eol);
            let mut out = out.into_bytes();
            out.extend_from_slice(&body);
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_requests_agree_with_hyper(
        first in request(),
        second in request(),
        pipelined in any::<bool>(),
    ) {
        let runtime = paused_runtime();
        let mut input = first;
        if pipelined {
            input.extend_from_slice(&second);
        }
        request_differential(&runtime, &input);
    }
}
