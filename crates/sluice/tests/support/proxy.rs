//! A TCP proxy on 127.0.0.1 between a store and Redis that can lose one reply: armed, it
//! forwards the next request carrying `EVALSHA`, waits until Redis has answered it (so the
//! script ran), and then closes both connections instead of forwarding the answer. The store
//! then cannot know whether its decision was made.
//!
//! It also counts the store's round trips carrying scripts: a flight is what the store sends
//! with `EVALSHA` in it before Redis answers any of it, so that N commands sent one at a time
//! are N flights and N commands in one pipeline are one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct LossyProxy {
    port: u16,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    flights: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyProxy {
    /// A proxy to `127.0.0.1:redis_port`, on a free port.
    pub async fn start(redis_port: u16) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicU64::new(0));
        let flights = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (armed, lost, flights) =
                (Arc::clone(&armed), Arc::clone(&lost), Arc::clone(&flights));
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        continue;
                    };
                    let counts = Counts {
                        armed: Arc::clone(&armed),
                        lost: Arc::clone(&lost),
                        flights: Arc::clone(&flights),
                    };
                    tokio::spawn(pipe(client, server, counts));
                }
            }
        });
        LossyProxy {
            port,
            armed,
            lost,
            flights,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Loses the answer to the next `EVALSHA`.
    pub fn lose_next_answer(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many answers were lost so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }

    /// How many flights carrying `EVALSHA` the store sent so far, over all its connections.
    pub fn flights(&self) -> u64 {
        self.flights.load(Ordering::SeqCst)
    }
}

/// What one connection's forwarding counts into, shared with the proxy.
struct Counts {
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    flights: Arc<AtomicU64>,
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards both ways until either side closes, or until an armed request was answered.
async fn pipe(client: TcpStream, server: TcpStream, counts: Counts) {
    let Counts {
        armed,
        lost,
        flights,
    } = counts;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let losing = AtomicBool::new(false);
    // Whether Redis answered since the store last sent a script: the next one starts a flight.
    let answered = AtomicBool::new(true);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let script = chunk.windows(7).any(|w| w == b"EVALSHA");
            if script && answered.swap(false, Ordering::SeqCst) {
                flights.fetch_add(1, Ordering::SeqCst);
            }
            if script && armed.swap(false, Ordering::SeqCst) {
                // Set before the request leaves: its answer cannot come back earlier.
                losing.store(true, Ordering::SeqCst);
            }
            if server_write.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if losing.load(Ordering::SeqCst) {
                lost.fetch_add(1, Ordering::SeqCst);
                return;
            }
            answered.store(true, Ordering::SeqCst);
            if client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever ends first ends both: dropping the halves closes the connections.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
