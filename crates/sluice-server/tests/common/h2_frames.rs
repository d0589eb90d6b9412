//! HTTP/2 written by hand over a plain socket (prior-knowledge h2c), for the tests that
//! attack the listener with frames no well-behaved client sends: the frame and HPACK
//! vocabulary, an `Attack` connection with a task that records what the server sends back,
//! and an ordinary request beside it (the `h2` client). What each attack must lead to is
//! the tests' to say, not this module's.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

// Frame types (RFC 9113 section 6).
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

// Flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

// Error codes.
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// SETTINGS_MAX_CONCURRENT_STREAMS.
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// SETTINGS_MAX_HEADER_LIST_SIZE.
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The name of an HTTP/2 error code, for messages.
fn reason(code: u32) -> String {
    match code {
        0x0 => "NO_ERROR".into(),
        0x1 => "PROTOCOL_ERROR".into(),
        0x2 => "INTERNAL_ERROR".into(),
        0x3 => "FLOW_CONTROL_ERROR".into(),
        0x5 => "STREAM_CLOSED".into(),
        0x6 => "FRAME_SIZE_ERROR".into(),
        0x7 => "REFUSED_STREAM".into(),
        0x8 => "CANCEL".into(),
        0x9 => "COMPRESSION_ERROR".into(),
        0xb => "ENHANCE_YOUR_CALM".into(),
        other => format!("0x{other:x}"),
    }
}

/// One frame: the 9-byte header (24-bit length, type, flags, 31-bit stream id), then
/// `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    assert!(len < 1 << 24);
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

// === HPACK (RFC 7541), encoded by hand: no Huffman coding ===

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

/// A string literal, without Huffman coding.
fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// A literal field without indexing whose name is the static table's entry `index`.
fn literal_static_name(out: &mut Vec<u8>, index: usize, value: &[u8]) {
    hpack_int(out, 0x00, 4, index);
    hpack_str(out, value);
}

/// A literal field without indexing, with a new name.
pub fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_str(out, name);
    hpack_str(out, value);
}

/// A literal field with incremental indexing and a new name: the decoder adds it to its
/// dynamic table, as entry 62 (the newest).
pub fn literal_indexed(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x40);
    hpack_str(out, name);
    hpack_str(out, value);
}

/// The header block of `GET path` on `http://127.0.0.1`: `:method GET` and `:scheme http`
/// from the static table (0x82, 0x86), `:authority` (entry 1) and `:path` (entry 4) as
/// literals.
pub fn request_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86];
    literal_static_name(&mut b, 1, b"127.0.0.1");
    literal_static_name(&mut b, 4, path.as_bytes());
    b
}

/// The `:status` of a response header block, when it comes first, as h2 encodes it: an
/// indexed static entry (8 to 14), or a literal on the name `:status` (entry 8), its value
/// plain or Huffman-coded (digits only).
fn status_of(block: &[u8]) -> Option<u16> {
    let first = *block.first()?;
    let indexed = [200, 204, 206, 304, 400, 404, 500];
    if (0x88..=0x8e).contains(&first) {
        return Some(indexed[usize::from(first - 0x88)]);
    }
    // With incremental indexing (0x48), without (0x08), never indexed (0x18).
    if !matches!(first, 0x48 | 0x08 | 0x18) {
        return None;
    }
    let len_byte = *block.get(1)?;
    let len = usize::from(len_byte & 0x7f);
    let value = block.get(2..2 + len)?;
    let digits = if len_byte & 0x80 == 0 {
        String::from_utf8(value.to_vec()).ok()?
    } else {
        huffman_digits(value)?
    };
    digits.parse().ok()
}

/// Decodes a Huffman-coded string of decimal digits: `0`-`2` are 5-bit codes 00000-00010,
/// `3`-`9` 6-bit codes 011001-011111; the padding is all ones.
fn huffman_digits(bytes: &[u8]) -> Option<String> {
    let bits: Vec<u8> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
        .collect();
    let mut out = String::new();
    let mut at = 0;
    while at < bits.len() {
        if bits[at..].iter().all(|&b| b == 1) && bits.len() - at < 8 {
            break;
        }
        let code = |n: usize| -> Option<u8> {
            bits.get(at..at + n)
                .map(|s| s.iter().fold(0u8, |acc, &b| (acc << 1) | b))
        };
        let five = code(5)?;
        if five <= 0b00010 {
            out.push(char::from(b'0' + five));
            at += 5;
            continue;
        }
        let six = code(6)?;
        if (0b011001..=0b011111).contains(&six) {
            out.push(char::from(b'3' + (six - 0b011001)));
            at += 6;
            continue;
        }
        return None;
    }
    Some(out)
}

// === A hand-driven client connection ===

#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame<R: tokio::io::AsyncRead + Unpin>(read: &mut R) -> std::io::Result<Frame> {
    let mut head = [0u8; 9];
    read.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    read.read_exact(&mut payload).await?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

/// A GOAWAY the server sent.
#[derive(Debug, Clone)]
pub struct GoAway {
    pub last_stream: u32,
    pub code: u32,
    pub debug: String,
    pub at: Instant,
}

/// What the server sent on a connection, as it arrives.
#[derive(Debug, Default)]
pub struct Seen {
    pub frames: usize,
    pub settings_acks: usize,
    pub ping_acks: usize,
    /// RST_STREAM frames: stream id, error code.
    pub resets: Vec<(u32, u32)>,
    /// Response HEADERS: stream id, `:status` when it could be read.
    pub responses: Vec<(u32, Option<u16>)>,
    pub goaway: Option<GoAway>,
    /// When the server closed (or reset) the TCP connection.
    pub closed: Option<Instant>,
}

impl Seen {
    /// The connection is over: a GOAWAY with an error, or the socket closed.
    pub fn ended(&self) -> bool {
        self.closed.is_some() || self.goaway.as_ref().is_some_and(|g| g.code != 0)
    }

    pub fn resets_with(&self, code: u32) -> usize {
        self.resets.iter().filter(|(_, c)| *c == code).count()
    }

    /// How the connection ended, for messages.
    pub fn ending(&self, since: Instant) -> String {
        match (&self.goaway, self.closed) {
            (Some(g), _) => format!(
                "GOAWAY {} ({:?}, last stream {}) after {:?}",
                reason(g.code),
                g.debug,
                g.last_stream,
                g.at - since
            ),
            (None, Some(at)) => format!("closed without GOAWAY after {:?}", at - since),
            (None, None) => "still open".into(),
        }
    }
}

pub type Shared = Arc<Mutex<Seen>>;

/// What was seen so far; a test that failed while holding it does not hide its message
/// behind a poisoned lock in the reader.
pub fn lock(seen: &Shared) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection that has exchanged the preface and SETTINGS with the gateway.
pub struct Attack {
    pub read: BufReader<OwnedReadHalf>,
    pub write: OwnedWriteHalf,
    /// The parameters of the server's first SETTINGS frame.
    pub settings: Vec<(u16, u32)>,
}

impl Attack {
    /// Connects, sends the preface, an empty SETTINGS and a connection WINDOW_UPDATE of
    /// 16 MiB, reads the server's SETTINGS and acknowledges them.
    pub async fn open(port: u16) -> Attack {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let (read, mut write) = tcp.into_split();
        let mut read = BufReader::new(read);
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        hello.extend(frame(WINDOW_UPDATE, 0, 0, &(16u32 << 20).to_be_bytes()));
        write.write_all(&hello).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut read))
            .await
            .expect("no SETTINGS from the server within 5 s")
            .unwrap();
        assert_eq!(first.kind, SETTINGS, "{first:?}");
        assert_eq!(first.flags & ACK, 0, "{first:?}");
        let settings = first
            .payload
            .chunks_exact(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect();
        write
            .write_all(&frame(SETTINGS, ACK, 0, &[]))
            .await
            .unwrap();
        Attack {
            read,
            write,
            settings,
        }
    }

    /// Reads what the server sends in a task of its own, until it closes the connection.
    pub fn watch(self) -> (OwnedWriteHalf, Shared) {
        let seen = Shared::default();
        let record = Arc::clone(&seen);
        let mut read = self.read;
        tokio::spawn(async move {
            loop {
                let Ok(f) = read_frame(&mut read).await else {
                    lock(&record).closed = Some(Instant::now());
                    return;
                };
                let mut s = lock(&record);
                s.frames += 1;
                match f.kind {
                    SETTINGS if f.flags & ACK != 0 => s.settings_acks += 1,
                    PING if f.flags & ACK != 0 => s.ping_acks += 1,
                    RST_STREAM if f.payload.len() == 4 => {
                        let code = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
                        s.resets.push((f.stream, code));
                    }
                    HEADERS => s.responses.push((f.stream, status_of(&f.payload))),
                    GOAWAY if f.payload.len() >= 8 => {
                        s.goaway = Some(GoAway {
                            last_stream: u32::from_be_bytes(f.payload[..4].try_into().unwrap())
                                & 0x7fff_ffff,
                            code: u32::from_be_bytes(f.payload[4..8].try_into().unwrap()),
                            debug: String::from_utf8_lossy(&f.payload[8..]).into_owned(),
                            at: Instant::now(),
                        });
                    }
                    _ => {}
                }
            }
        });
        (self.write, seen)
    }
}

/// Waits until `done` holds for what the server sent, at most `limit`; whether it did.
pub async fn wait_for(seen: &Shared, limit: Duration, done: impl Fn(&Seen) -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done(&lock(seen)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An ordinary HTTP/2 request on a connection of its own (the `h2` client): its status and
/// how long it took.
pub async fn ordinary(port: u16, path: &str) -> Result<(u16, Duration), String> {
    let started = Instant::now();
    let exchange = async {
        let tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let (mut client, connection) = h2::client::handshake(tcp)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = http::Request::get(format!("http://127.0.0.1:{port}{path}"))
            .body(())
            .unwrap();
        let (response, _) = client
            .send_request(request, true)
            .map_err(|e| e.to_string())?;
        let response = response.await.map_err(|e| e.to_string())?;
        Ok::<_, String>(response.status().as_u16())
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(status)) => Ok((status, started.elapsed())),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("no answer within 5 s".into()),
    }
}
