//! How the byte path reads a request body from the client, and watches the client while a
//! request waits.

use std::future::Future;
use std::io;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::{MAX_BODY, READ};
use crate::body::BodyError;
use crate::proxy::ProxyError;
use crate::wire;

/// Why a request body could not be read whole.
#[derive(Debug, Clone, Copy)]
pub(super) enum BodyRead {
    /// The client's side of the connection ended (or failed) first.
    Cut,
    /// No byte of it came for this long (`client_body_timeout`).
    Stalled(std::time::Duration),
}

impl BodyRead {
    /// The error answered for it: 408, or 400 for a body cut short.
    pub(super) fn error(self) -> ProxyError {
        match self {
            BodyRead::Stalled(gap) => ProxyError::Body(BodyError::Stalled(gap)),
            BodyRead::Cut => {
                ProxyError::Client("the client closed its side of the connection mid-body".into())
            }
        }
    }
}

/// Reads from `io` into `buf` until it holds `len` bytes, each read within `timeout`.
pub(super) async fn read_body<C: AsyncRead + Unpin>(
    io: &mut C,
    buf: &mut BytesMut,
    len: u64,
    timeout: Option<std::time::Duration>,
) -> Result<(), BodyRead> {
    while (buf.len() as u64) < len {
        read_within(io, buf, len as usize - buf.len(), timeout).await?;
    }
    Ok(())
}

/// Reads at most `want` bytes of a request body into `buf` (room made for all of them),
/// within `timeout`: the client's stop is [`BodyRead::Cut`] or [`BodyRead::Stalled`].
pub(super) async fn read_within<C: AsyncRead + Unpin>(
    io: &mut C,
    buf: &mut BytesMut,
    want: usize,
    timeout: Option<std::time::Duration>,
) -> Result<usize, BodyRead> {
    buf.reserve(want);
    let read = read_at_most(io, buf, want);
    let read = match timeout {
        Some(gap) => tokio::time::timeout(gap, read)
            .await
            .map_err(|_| BodyRead::Stalled(gap))?,
        None => read.await,
    };
    match read {
        Ok(0) | Err(_) => Err(BodyRead::Cut),
        Ok(n) => Ok(n),
    }
}

/// Reads a chunked body at the start of `buf` until it ends or [`MAX_BODY`] bytes of it are
/// read, each read within `timeout`: its content, length and whether it had trailers, or
/// `None` when it goes on past [`MAX_BODY`].
pub(super) async fn read_chunks<C: AsyncRead + Unpin>(
    io: &mut C,
    buf: &mut BytesMut,
    timeout: Option<std::time::Duration>,
) -> Result<Option<(Bytes, usize, bool)>, ProxyError> {
    loop {
        match wire::dechunk(&buf[..], MAX_BODY as usize) {
            wire::Dechunked::Whole {
                data,
                len,
                trailers,
            } => return Ok(Some((Bytes::from(data), len, trailers))),
            wire::Dechunked::Broken => {
                return Err(ProxyError::Client(
                    "the request's chunked body is malformed".into(),
                ))
            }
            wire::Dechunked::Partial if buf.len() >= MAX_BODY as usize => return Ok(None),
            wire::Dechunked::Partial => {}
        }
        read_within(io, buf, MAX_BODY as usize - buf.len(), timeout)
            .await
            .map_err(BodyRead::error)?;
    }
}

/// Runs `fut` while reading the client's connection: `None` if the client closes it (or
/// it fails) first. What the client sends meanwhile (a pipelined request) is kept in `buf`,
/// up to `max_ahead` bytes; then the connection is left unread (a close is no longer seen)
/// until `fut` is done.
pub(super) async fn watching<C, F>(
    io: &mut C,
    buf: &mut BytesMut,
    max_ahead: usize,
    fut: F,
) -> Option<F::Output>
where
    C: AsyncRead + Unpin,
    F: Future,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        let room = max_ahead.saturating_sub(buf.len());
        tokio::select! {
            biased;
            done = &mut fut => return Some(done),
            read = read_at_most(io, buf, room), if room > 0 => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Reads what is there into `buf`, making room for [`READ`] bytes when less than a quarter
/// of that is left: while the head read before shares `buf`'s allocation, asking for more
/// room than is left would copy `buf` into a new one.
pub(super) async fn read_more<R: AsyncRead + Unpin>(
    from: &mut R,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    if buf.capacity() - buf.len() < READ / 4 {
        buf.reserve(READ);
    }
    from.read_buf(buf).await
}

/// [`read_more`], taking at most `limit` bytes (`buf` may have more spare capacity).
pub(super) async fn read_at_most<R: AsyncRead + Unpin>(
    from: &mut R,
    buf: &mut BytesMut,
    limit: usize,
) -> io::Result<usize> {
    read_more(&mut from.take(limit as u64), buf).await
}
