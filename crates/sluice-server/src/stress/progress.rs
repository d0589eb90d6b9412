//! The progress line, drawn only on a terminal: elapsed time, a bar, sent, answers by class.

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::stress::run::Progress;

const WIDTH: usize = 28;

/// One frame of the progress line for `total` planned requests over `duration`.
pub fn frame(p: &Progress, total: u64, elapsed: Duration, duration: Duration) -> String {
    let sent = p.sent.load(Ordering::Relaxed);
    let done = p.done.load(Ordering::Relaxed);
    let filled = if total == 0 {
        WIDTH
    } else {
        (sent.min(total) as usize * WIDTH) / total as usize
    };
    format!(
        "{:>6.1}s/{:.0}s [{}{}] {sent}/{total} sent  2xx {}  429 {}  other {}  errors {}  in flight {}",
        elapsed.as_secs_f64(),
        duration.as_secs_f64(),
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        p.ok.load(Ordering::Relaxed),
        p.limited.load(Ordering::Relaxed),
        p.other.load(Ordering::Relaxed),
        p.errors.load(Ordering::Relaxed),
        sent.saturating_sub(done),
    )
}

/// Redraws the line on stdout five times a second until `stop` turns true, then clears it.
pub async fn draw(
    p: Arc<Progress>,
    total: u64,
    duration: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\r\x1b[2K{}",
            frame(&p, total, start.elapsed(), duration)
        );
        let _ = out.flush();
    }
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "\r\x1b[2K");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame() {
        let p = Progress::default();
        p.sent.store(50, Ordering::Relaxed);
        p.done.store(48, Ordering::Relaxed);
        p.ok.store(30, Ordering::Relaxed);
        p.limited.store(18, Ordering::Relaxed);
        let f = frame(&p, 100, Duration::from_millis(1000), Duration::from_secs(2));
        assert!(
            f.contains("[##############--------------] 50/100 sent"),
            "{f}"
        );
        assert!(
            f.contains("2xx 30  429 18  other 0  errors 0  in flight 2"),
            "{f}"
        );
    }
}
