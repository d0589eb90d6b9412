//! The HTTP/2 listener against floods and abuse of the protocol itself, with frames written
//! by hand over a plain socket (prior-knowledge h2c): Rapid Reset, MadeYouReset,
//! CONTINUATION floods, HPACK bombs, more streams than the connection allows, and floods of
//! SETTINGS and PING frames. Each attack is answered by hyper and h2 as the gateway
//! configures them (`src/serve/gateway.rs`); these tests pin down how, so that none of it
//! regresses with an upgrade or a change of settings. The frames, the HPACK encoding and the
//! connection that records the server's answers are in `tests/common/h2_frames.rs`.
//!
//! An idle WebSocket over HTTP/1.1 closing after `keep_alive_timeout` is covered by
//! `tests/websocket.rs`.

mod common;

use std::time::{Duration, Instant};

use common::h2_frames::{
    frame, literal, literal_indexed, lock, ordinary, request_block, wait_for, Attack, Seen, CANCEL,
    CONTINUATION, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, HEADERS,
    MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, PING, REFUSED_STREAM, RST_STREAM, SETTINGS,
    WINDOW_UPDATE,
};
use common::{Gateway, Upstream};
use tokio::io::AsyncWriteExt;

/// A policy that admits everything on `/slow/` (the upstream answers `/slow/MS` after MS ms).
fn config(upstream: &str) -> String {
    format!(
        r#"
[[policy]]
name = "open"
capacity = 100000
rate = "100000/s"

[[route]]
path_prefix = "/slow/"
policies = ["open"]
upstream = "{upstream}"
"#
    )
}

/// The resident memory of a process, in KiB, from `/proc`.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// === The attacks ===

/// Rapid Reset (CVE-2023-44487), in one batch: 1,000 HEADERS each followed at once by its
/// RST_STREAM(CANCEL), written in a single write. h2 counts streams reset by the client
/// before the server accepted them (at most 20 pending, `max_pending_accept_reset_streams`)
/// and answers GOAWAY ENHANCE_YOUR_CALM beyond: the connection ends after a few dozen
/// streams, the upstream sees next to none of those requests, and another client, started
/// alongside the attack and again after it, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_rapid_resets_ends_with_enhance_your_calm_and_spares_the_upstream() {
    let up = Upstream::start().await;
    let gw = Gateway::start("h2c = true", &config(&up.url())).await;
    let (mut write, seen) = Attack::open(gw.port).await.watch();
    let mut batch = Vec::new();
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        let block = request_block(&format!("/slow/0/rapid-{i}"));
        batch.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &block));
        batch.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
    }
    let started = Instant::now();
    let port = gw.port;
    let during = tokio::spawn(async move { ordinary(port, "/slow/0/during").await });
    // The server may close before it has read it all.
    let _ = write.write_all(&batch).await;
    let ended = wait_for(&seen, Duration::from_secs(5), Seen::ended).await;
    let during = during.await.unwrap();
    let after = ordinary(gw.port, "/slow/0/after").await;
    // Any request of the attack that got through is on its way by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let upstream = up.count();
    let s = lock(&seen);
    let last = s.goaway.as_ref().map_or(0, |g| g.last_stream);
    eprintln!(
        "rapid reset: {}; {} streams of 1000 processed; upstream saw {upstream} requests (2 ordinary); ordinary during {during:?}, after {after:?}",
        s.ending(started),
        last.div_ceil(2),
    );
    assert!(ended, "the connection is {}", s.ending(started));
    let goaway = s.goaway.as_ref().expect("no GOAWAY");
    assert_eq!(goaway.code, ENHANCE_YOUR_CALM, "{}", s.ending(started));
    assert!(
        goaway.last_stream < 2 * 100,
        "{} streams before the GOAWAY",
        last.div_ceil(2)
    );
    assert_eq!(during.map(|a| a.0), Ok(200));
    assert_eq!(after.map(|a| a.0), Ok(200));
    assert!(
        upstream <= 2 + 20,
        "the upstream saw {} requests of the attack",
        upstream - 2
    );
}

/// MadeYouReset (CVE-2025-8671): requests each followed by a frame that makes the SERVER
/// reset the stream (a WINDOW_UPDATE that overflows the stream's send window, which h2
/// answers with RST_STREAM(FLOW_CONTROL_ERROR)), in batches, for ever. Streams reset by the
/// server no longer count as open, so the concurrency cap does not stop this; h2 counts them
/// instead (`max_local_error_reset_streams`, 1,024 by hyper's default) and answers GOAWAY
/// ENHANCE_YOUR_CALM beyond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_resets_on_demand_end_the_connection_after_a_bounded_number() {
    let up = Upstream::start().await;
    let gw = Gateway::start("h2c = true", &config(&up.url())).await;
    let (mut write, seen) = Attack::open(gw.port).await.watch();
    let started = Instant::now();
    let mut sent = 0u32;
    // In rounds of 16 requests, each round once the server has reset the one before.
    while sent < 3000 && !lock(&seen).ended() {
        let mut batch = Vec::new();
        for _ in 0..16 {
            let id = 2 * sent + 1;
            let block = request_block(&format!("/slow/0/reset-{sent}"));
            batch.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &block));
            batch.extend(frame(WINDOW_UPDATE, 0, id, &0x7fff_ffffu32.to_be_bytes()));
            sent += 1;
        }
        if write.write_all(&batch).await.is_err() {
            break;
        }
        let want = sent as usize;
        wait_for(&seen, Duration::from_secs(2), |s| {
            s.resets.len() >= want || s.ended()
        })
        .await;
    }
    let ended = wait_for(&seen, Duration::from_secs(5), Seen::ended).await;
    let after = ordinary(gw.port, "/slow/0/after").await;
    let s = lock(&seen);
    let resets = s.resets_with(FLOW_CONTROL_ERROR);
    eprintln!(
        "made-you-reset: {sent} streams sent, {resets} RST_STREAM(FLOW_CONTROL_ERROR), {} other resets; {}; upstream saw {} requests; ordinary after {after:?}",
        s.resets.len() - resets,
        s.ending(started),
        up.count(),
    );
    assert!(ended, "the connection is {}", s.ending(started));
    let goaway = s.goaway.as_ref().expect("no GOAWAY");
    assert_eq!(goaway.code, ENHANCE_YOUR_CALM, "{}", s.ending(started));
    assert!(
        resets >= 1000 && s.resets.len() <= 1024,
        "{} streams reset by the server before the GOAWAY",
        s.resets.len()
    );
    assert!(goaway.at - started < Duration::from_secs(8));
    assert_eq!(after.map(|a| a.0), Ok(200));
}

/// CONTINUATION flood: a HEADERS frame without END_HEADERS, then CONTINUATION frames of
/// about 200 bytes without end. h2 allows a header block
/// `max_header_list_size / max_frame_size` CONTINUATION frames and a quarter more, at least
/// 5 (5 here: 16 KiB over 16 KiB), and answers GOAWAY ENHANCE_YOUR_CALM beyond: the
/// connection ends within a few kilobytes, before `max_header_bytes` could be exceeded,
/// and the gateway serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_is_cut_off_within_a_few_frames() {
    let up = Upstream::start().await;
    let gw = Gateway::start("h2c = true", &config(&up.url())).await;
    let (mut write, seen) = Attack::open(gw.port).await.watch();
    let started = Instant::now();
    let block = request_block("/slow/0/continued");
    let mut written = 0usize;
    let mut continuations = 0usize;
    let first = frame(HEADERS, END_STREAM, 1, &block);
    write.write_all(&first).await.unwrap();
    written += first.len();
    while !lock(&seen).ended() && started.elapsed() < Duration::from_secs(5) {
        let mut fields = Vec::new();
        literal(&mut fields, b"x-flood", &[b'a'; 190]);
        let next = frame(CONTINUATION, 0, 1, &fields);
        if write.write_all(&next).await.is_err() {
            break;
        }
        written += next.len();
        continuations += 1;
        // One frame at a time, so the count reflects what the server read before its verdict.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ended = wait_for(&seen, Duration::from_secs(5), Seen::ended).await;
    let after = ordinary(gw.port, "/slow/0/after").await;
    let s = lock(&seen);
    eprintln!(
        "continuation flood: {}; {continuations} CONTINUATION frames, {written} bytes written before the end; ordinary after {after:?}",
        s.ending(started),
    );
    assert!(ended, "the connection is {}", s.ending(started));
    let goaway = s.goaway.as_ref().expect("no GOAWAY");
    assert_eq!(goaway.code, ENHANCE_YOUR_CALM, "{}", s.ending(started));
    assert!(
        written < 64 * 1024,
        "{written} bytes written before the end"
    );
    assert!(goaway.at - started < Duration::from_secs(3));
    assert_eq!(up.count(), 1, "only the ordinary request goes upstream");
    assert_eq!(after.map(|a| a.0), Ok(200));
}

/// HPACK bomb: a header block that adds one 4,000-byte field to the decoder's dynamic table,
/// then names it again with one byte each time. 7 references (32 KiB decoded, over the
/// 16 KiB `max_header_bytes`) get 431 and the connection goes on; 10,000 references (40 MB
/// decoded from 14 KB) are stopped at 4 times the limit: GOAWAY ENHANCE_YOUR_CALM, nothing
/// goes upstream, and the gateway serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_bomb_is_refused_without_decoding_it_whole() {
    let up = Upstream::start().await;
    let gw = Gateway::start("h2c = true", &config(&up.url())).await;
    let bomb = |refs: usize| {
        let mut block = request_block("/slow/0/bomb");
        literal_indexed(&mut block, b"x-bomb", &[b'b'; 4000]);
        // The indexed field 62: the newest entry of the dynamic table.
        block.extend(std::iter::repeat_n(0x80 | 62, refs));
        frame(HEADERS, END_STREAM | END_HEADERS, 1, &block)
    };

    // Over the limit, under 4 times it: 431, and the connection stays.
    let attack = Attack::open(gw.port).await;
    let header_list = attack
        .settings
        .iter()
        .find(|(id, _)| *id == MAX_HEADER_LIST_SIZE)
        .map(|(_, v)| *v);
    let (mut write, seen) = attack.watch();
    let small = bomb(7);
    write.write_all(&small).await.unwrap();
    let answered = wait_for(&seen, Duration::from_secs(5), |s| {
        !s.responses.is_empty() || s.ended()
    })
    .await;
    // The connection still answers a PING.
    write
        .write_all(&frame(PING, 0, 0, b"stillup!"))
        .await
        .unwrap();
    let pong = wait_for(&seen, Duration::from_secs(5), |s| s.ping_acks > 0).await;
    {
        let s = lock(&seen);
        eprintln!(
            "hpack bomb of 7 references ({} bytes on the wire, MAX_HEADER_LIST_SIZE {header_list:?}): responses {:?}, resets {:?}, PING answered {pong}, connection {}",
            small.len(),
            s.responses,
            s.resets,
            s.ending(Instant::now()),
        );
        assert!(answered);
        assert_eq!(s.responses, vec![(1, Some(431))]);
        assert!(pong && !s.ended());
    }
    assert_eq!(header_list, Some(16 * 1024));

    // 4 times the limit and more: GOAWAY.
    let (mut write, seen) = Attack::open(gw.port).await.watch();
    let big = bomb(10_000);
    let started = Instant::now();
    write.write_all(&big).await.unwrap();
    let ended = wait_for(&seen, Duration::from_secs(5), Seen::ended).await;
    let after = ordinary(gw.port, "/slow/0/after").await;
    let s = lock(&seen);
    eprintln!(
        "hpack bomb of 10000 references ({} bytes on the wire, {} bytes decoded): {}; responses {:?}; upstream saw {}; ordinary after {after:?}",
        big.len(),
        10_001 * (6 + 4000 + 32),
        s.ending(started),
        s.responses,
        up.count(),
    );
    assert!(ended, "the connection is {}", s.ending(started));
    let goaway = s.goaway.as_ref().expect("no GOAWAY");
    assert_eq!(goaway.code, ENHANCE_YOUR_CALM, "{}", s.ending(started));
    assert!(s.responses.is_empty(), "{:?}", s.responses);
    assert!(goaway.at - started < Duration::from_secs(2));
    assert_eq!(after.map(|a| a.0), Ok(200));
    assert_eq!(up.count(), 1, "only the ordinary request goes upstream");
}

/// More streams than the connection allows: 200 requests of 1 s opened at once on one
/// connection. The server's SETTINGS advertise MAX_CONCURRENT_STREAMS 128; h2 refuses the
/// streams beyond with RST_STREAM(REFUSED_STREAM) before they reach the gateway, so the
/// upstream never holds more than 128 requests of the connection, and those 128 are
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_128_on_one_connection_are_refused_before_the_upstream() {
    let up = Upstream::start().await;
    let gw = Gateway::start("h2c = true", &config(&up.url())).await;
    let attack = Attack::open(gw.port).await;
    let advertised = attack
        .settings
        .iter()
        .find(|(id, _)| *id == MAX_CONCURRENT_STREAMS)
        .map(|(_, v)| *v);
    let (mut write, seen) = attack.watch();
    let mut batch = Vec::new();
    for i in 0..200u32 {
        let block = request_block(&format!("/slow/1000/cap-{i}"));
        batch.extend(frame(HEADERS, END_STREAM | END_HEADERS, 2 * i + 1, &block));
    }
    let started = Instant::now();
    write.write_all(&batch).await.unwrap();
    let done = wait_for(&seen, Duration::from_secs(8), |s| {
        s.responses.len() + s.resets.len() >= 200 || s.ended()
    })
    .await;
    let took = started.elapsed();
    // Each request stays 1 s at the upstream: no more of them overlapped than arrived
    // within one second.
    let most_in_flight =
        common::most_in_a_window(&up.times.lock().unwrap(), Duration::from_secs(1));
    let s = lock(&seen);
    let ok = s.responses.iter().filter(|r| r.1 == Some(200)).count();
    eprintln!(
        "200 streams at once: MAX_CONCURRENT_STREAMS {advertised:?}; {} RST_STREAM(REFUSED_STREAM), {} other resets; upstream held {most_in_flight} at most, {} in all; {} responses ({ok} of them 200) after {took:?}; connection {}",
        s.resets_with(REFUSED_STREAM),
        s.resets.len() - s.resets_with(REFUSED_STREAM),
        up.count(),
        s.responses.len(),
        s.ending(started),
    );
    assert_eq!(advertised, Some(128));
    assert!(done, "{}", s.ending(started));
    assert_eq!(s.resets_with(REFUSED_STREAM), 72, "{:?}", s.resets);
    assert!(
        s.resets.iter().all(|(id, _)| *id > 2 * 128),
        "a stream within the first 128 was reset: {:?}",
        s.resets
    );
    assert!(most_in_flight <= 128, "{most_in_flight} in flight upstream");
    assert_eq!(up.count(), 128, "the refused streams reached the upstream");
    assert_eq!(ok, 128, "{:?}", s.responses);
    assert!(!s.ended(), "{}", s.ending(started));
}

/// Writes `unit` again and again, never reading, until the server closes the connection or
/// `limit` passes: the bytes written and when the writes failed.
async fn flood(attack: Attack, unit: &[u8], limit: Duration) -> (usize, Option<Duration>) {
    let Attack {
        read, mut write, ..
    } = attack;
    let batch: Vec<u8> = unit.repeat(1000);
    let started = Instant::now();
    let mut written = 0;
    let failed = loop {
        let remaining = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, write.write_all(&batch)).await {
            Ok(Ok(())) => written += batch.len(),
            Ok(Err(_)) => break Some(started.elapsed()),
            Err(_) => break None,
        }
    };
    drop(read);
    (written, failed)
}

/// A flood of `unit` frames that never reads the server's acknowledgements, beside an
/// ordinary client. h2 queues at most one acknowledgement (one pending PONG, one pending
/// SETTINGS ACK) and writes it before it reads the next frame, so once the socket buffers
/// are full the server stops reading: the flood is held back by TCP and costs the gateway
/// no memory. The stalled writes close the connection at `send_timeout` (the
/// `header_read_timeout` clock does not run while the server is not reading); meanwhile
/// other clients are served promptly.
async fn flood_without_reading(unit: &[u8], name: &str) {
    let up = Upstream::start().await;
    let mut gw = Gateway::start("h2c = true\nsend_timeout = \"2s\"", &config(&up.url())).await;
    let pid = gw.child.id();
    let before = rss_kib(pid);
    let attack = Attack::open(gw.port).await;
    let flooding = {
        let unit = unit.to_vec();
        tokio::spawn(async move { flood(attack, &unit, Duration::from_secs(8)).await })
    };
    // Ordinary requests on other connections meanwhile.
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, took) = ordinary(gw.port, &format!("/slow/0/beside-{i}"))
            .await
            .unwrap();
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    let peak = rss_kib(pid);
    let (written, failed) = flooding.await.unwrap();
    let send_timeouts =
        common::metric(&gw, "sluice_connection_timeouts_total{timeout=\"send\"}").await;
    eprintln!(
        "{name} flood: {} frames ({written} bytes) written before the server stopped reading; writes failed after {failed:?}; send timeouts {send_timeouts}; gateway RSS {before} KiB before, {peak} KiB during; slowest ordinary request {slowest:?}",
        written / unit.len(),
    );
    let failed = failed.expect("the server never closed the flooding connection");
    assert!(failed < Duration::from_secs(6), "closed after {failed:?}");
    assert_eq!(send_timeouts, 1.0, "not closed by send_timeout");
    assert!(
        written < 64 << 20,
        "{written} bytes accepted without reading"
    );
    assert!(
        peak < before + 32 * 1024,
        "RSS grew from {before} KiB to {peak} KiB"
    );
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(gw.child_alive());
}

/// PING flood: thousands of PINGs a batch, their acknowledgements never read. The gateway
/// answers each before reading the next, stops reading once the client stops reading,
/// closes the connection after `send_timeout`, and serves other clients meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_that_never_reads_is_held_back_and_closed() {
    flood_without_reading(&frame(PING, 0, 0, b"floodfl!"), "PING").await;
}

/// SETTINGS flood: thousands of SETTINGS frames (each setting INITIAL_WINDOW_SIZE), their
/// acknowledgements never read. As with PINGs, the gateway acknowledges each before reading
/// the next, is held back by TCP, closes the connection after `send_timeout`, and serves
/// other clients meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_flood_that_never_reads_is_held_back_and_closed() {
    let initial_window_size = [0x00, 0x04, 0x00, 0x01, 0x00, 0x00];
    flood_without_reading(&frame(SETTINGS, 0, 0, &initial_window_size), "SETTINGS").await;
}

/// A PING flood that reads every acknowledgement: h2 answers them all, and nothing in h2
/// limits it. The connection never opens a stream, so the gateway's clock for a first
/// request closes it at `header_read_timeout` from the accept, pings or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_that_reads_its_acks_is_closed_at_header_read_timeout() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nheader_read_timeout = \"2s\"",
        &config(&up.url()),
    )
    .await;
    let (mut write, seen) = Attack::open(gw.port).await.watch();
    let started = Instant::now();
    let batch = frame(PING, 0, 0, b"floodfl!").repeat(1000);
    let mut sent = 0usize;
    while !lock(&seen).ended() && started.elapsed() < Duration::from_secs(6) {
        if write.write_all(&batch).await.is_err() {
            break;
        }
        sent += 1000;
        // At most 10,000 PINGs ahead of their acknowledgements.
        wait_for(&seen, Duration::from_secs(1), |s| {
            s.ping_acks + 10_000 >= sent || s.ended()
        })
        .await;
    }
    let ended = wait_for(&seen, Duration::from_secs(2), Seen::ended).await;
    let header_reads = common::metric(
        &gw,
        "sluice_connection_timeouts_total{timeout=\"header_read\"}",
    )
    .await;
    let s = lock(&seen);
    let closed_after = s.closed.map(|at| at - started);
    eprintln!(
        "PING flood reading its acks: {sent} PINGs sent, {} acknowledged; {}; header_read timeouts {header_reads}",
        s.ping_acks,
        s.ending(started),
    );
    assert!(ended, "the connection is {}", s.ending(started));
    let closed_after = closed_after.expect("no close");
    assert!(
        closed_after > Duration::from_millis(1500) && closed_after < Duration::from_secs(4),
        "closed after {closed_after:?} with header_read_timeout = 2s"
    );
    assert_eq!(header_reads, 1.0);
}
