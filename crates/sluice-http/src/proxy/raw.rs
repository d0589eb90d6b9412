//! The byte path's pool of upstream connections ([`crate::h1`]): idle connections by
//! `http://` upstream, the most recently used first out, each watched for a close while it
//! waits.
//!
//! A connection the upstream closes while it is idle (its own idle timeout, a restart) leaves
//! the pool at once, its socket closed and its place in the budget given back, as pingora's
//! pool does (`idle_poll`): kept, it would sit in CLOSE_WAIT holding a socket of
//! `max_upstream_connections` until the idle timeout, or until a request found it closed.
//! pingora gives each idle connection a task of its own; here one task per pool watches them
//! all: each idle socket's read readiness wakes it (a close, or bytes no request asked for,
//! makes a connection unusable), and so does each connection pooled, whose readiness it then
//! starts watching.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::task::AtomicWaker;
use http::uri::Authority;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::proxy::budget::Budgeted;

/// The most idle connections kept per upstream.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;

/// An upstream connection of the byte path and the bytes read from it that no response has
/// used yet.
#[derive(Debug)]
pub(crate) struct RawConn {
    pub(crate) stream: Budgeted<TcpStream>,
    pub(crate) buf: BytesMut,
}

impl RawConn {
    /// A new connection.
    pub(crate) fn new(stream: Budgeted<TcpStream>) -> RawConn {
        RawConn {
            stream,
            buf: BytesMut::new(),
        }
    }

    /// Whether the connection is still open as far as can be seen without waiting: no close
    /// (nor stray bytes) has arrived on it.
    pub(crate) fn still_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(
            self.stream.get_ref().try_read(&mut probe),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        )
    }

    /// Whether the connection is done with: closed by the upstream, failed, or with bytes no
    /// request asked for. When it is not, `cx` is woken once that may have changed.
    fn poll_done(&self, cx: &mut Context<'_>) -> bool {
        loop {
            match self.stream.get_ref().poll_read_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                // Readiness may be left over from the last exchange, whose reads stopped short
                // of `WouldBlock`: a probe tells. One that meets `WouldBlock` clears it, and
                // the next poll registers `cx`.
                Poll::Ready(Ok(())) => {
                    if !self.still_open() {
                        return true;
                    }
                }
            }
        }
    }
}

/// An idle connection.
struct Idle {
    conn: RawConn,
    /// When it went idle.
    since: Instant,
    /// Whether the watcher has registered for its readiness. The connections pooled since the
    /// watcher last looked are the last of their list.
    watched: bool,
}

/// What wakes the watcher, and why.
#[derive(Default)]
struct Wakes {
    /// The watcher's task.
    task: AtomicWaker,
    /// An idle socket became readable (rather than a connection being pooled): every
    /// connection is looked at, not only the new ones.
    readable: AtomicBool,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.readable.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// The byte path's idle connections by upstream, and their watcher's wakes.
pub(crate) struct RawPool {
    /// The idle connections by `http://` upstream, the oldest first; few upstreams, so a list.
    idle: Mutex<Vec<(Authority, Vec<Idle>)>>,
    wakes: Arc<Wakes>,
    /// The waker the idle sockets' readiness is registered with.
    readiness: Waker,
    /// Whether the watcher's task was started.
    watching: AtomicBool,
}

impl Drop for RawPool {
    fn drop(&mut self) {
        // The watcher ends when it finds the pool gone.
        self.wakes.task.wake();
    }
}

/// Whether two upstream authorities are the same text. Both sides come from parsed
/// upstream URLs, so the bytes compare; `Authority`'s own `==` folds case byte by byte.
fn same(a: &Authority, b: &Authority) -> bool {
    a.as_str() == b.as_str()
}

impl RawPool {
    pub(crate) fn new() -> Arc<RawPool> {
        let wakes = Arc::new(Wakes::default());
        Arc::new(RawPool {
            idle: Mutex::new(Vec::new()),
            readiness: Waker::from(Arc::clone(&wakes)),
            wakes,
            watching: AtomicBool::new(false),
        })
    }

    /// How many connections are idle.
    pub(crate) fn len(&self) -> usize {
        self.idle.lock().iter().map(|(_, list)| list.len()).sum()
    }

    /// The most recently pooled connection to `authority`, unless it has been idle for longer
    /// than `idle_timeout` (then neither it nor any older one is used again).
    pub(crate) fn checkout(
        &self,
        authority: &Authority,
        idle_timeout: Duration,
    ) -> Option<RawConn> {
        let mut idle = self.idle.lock();
        let (_, list) = idle.iter_mut().find(|(a, _)| same(a, authority))?;
        let Idle { conn, since, .. } = list.pop()?;
        if Instant::now().saturating_duration_since(since) > idle_timeout {
            // Idle too long: the upstream (or a firewall) may have dropped it silently, and
            // every older one with it.
            list.clear();
            return None;
        }
        Some(conn)
    }

    /// Pools a connection whose last exchange ended cleanly, and has the watcher look at it.
    pub(crate) fn checkin(self: &Arc<Self>, authority: &Authority, conn: RawConn) {
        let idle = Idle {
            conn,
            since: Instant::now(),
            watched: false,
        };
        {
            let mut pool = self.idle.lock();
            match pool.iter_mut().find(|(a, _)| same(a, authority)) {
                Some((_, list)) if list.len() < MAX_IDLE_PER_UPSTREAM => list.push(idle),
                Some(_) => return,
                None => pool.push((authority.clone(), vec![idle])),
            }
        }
        if self.watching.swap(true, Ordering::Relaxed) {
            self.wakes.task.wake();
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Started by the first connection pooled, on the runtime of the requests.
            runtime.spawn(watch(Arc::downgrade(self)));
        } else {
            self.watching.store(false, Ordering::Relaxed);
        }
    }

    /// Closes the connections idle since before `oldest`, and returns how many stay pooled.
    pub(crate) fn close_idle(&self, oldest: Option<Instant>) -> usize {
        let mut kept = 0;
        for (_, list) in self.idle.lock().iter_mut() {
            list.retain(|idle| oldest.is_none_or(|o| idle.since >= o));
            kept += list.len();
        }
        kept
    }

    /// Takes the connection idle for longest, if any (to close it for room in the budget).
    pub(crate) fn take_oldest(&self) -> Option<RawConn> {
        let mut idle = self.idle.lock();
        let (_, list) = idle
            .iter_mut()
            .filter(|(_, list)| !list.is_empty())
            .min_by_key(|(_, list)| list[0].since)?;
        Some(list.remove(0).conn)
    }

    /// One look of the watcher: drops the idle connections that are done with, and registers
    /// for the readiness of the others. Every connection after a readiness wake, the newly
    /// pooled ones otherwise.
    fn look(&self, cx: &mut Context<'_>) {
        self.wakes.task.register(cx.waker());
        let every = self.wakes.readable.swap(false, Ordering::Acquire);
        let mut cx = Context::from_waker(&self.readiness);
        for (_, list) in self.idle.lock().iter_mut() {
            if every {
                list.retain_mut(|idle| {
                    idle.watched = true;
                    !idle.conn.poll_done(&mut cx)
                });
                continue;
            }
            let mut at = list.len();
            while at > 0 && !list[at - 1].watched {
                at -= 1;
                if list[at].conn.poll_done(&mut cx) {
                    list.remove(at);
                } else {
                    list[at].watched = true;
                }
            }
        }
    }
}

/// The watcher of a pool's idle connections: runs until the pool is dropped.
async fn watch(pool: Weak<RawPool>) {
    std::future::poll_fn(|cx| match pool.upgrade() {
        Some(pool) => {
            pool.look(cx);
            Poll::Pending
        }
        None => Poll::Ready(()),
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use crate::proxy::budget::Socket;

    /// An idle connection its peer closes leaves the pool without anyone asking for it; one
    /// whose peer stays keeps its place, though its readiness was left set by its last read.
    #[tokio::test]
    async fn a_closed_idle_connection_leaves_the_pool_by_itself() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let authority: Authority = addr.to_string().parse().unwrap();
        let pool = RawPool::new();
        let mut peers = Vec::new();
        for _ in 0..2 {
            let stream = TcpStream::connect(addr).await.unwrap();
            let (mut peer, _) = listener.accept().await.unwrap();
            let mut conn = RawConn::new(Budgeted::new(stream, Socket::instead_of_closing()));
            // An exchange that leaves the socket's readiness set: the read takes every byte.
            peer.write_all(b"ok").await.unwrap();
            let mut two = [0u8; 2];
            conn.stream.read_exact(&mut two).await.unwrap();
            pool.checkin(&authority, conn);
            peers.push(peer);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(pool.len(), 2);
        drop(peers.remove(0));
        let deadline = Instant::now() + Duration::from_secs(2);
        while pool.len() != 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.len(), 1, "the closed connection is still pooled");
        assert!(pool.checkout(&authority, Duration::from_secs(60)).is_some());
    }
}
