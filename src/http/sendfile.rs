//! The connection's socket as hyper writes to it: buffers that are
//! [`mapped`] chunks of files go out with `sendfile`, from the page cache,
//! the rest with `writev`.
//!
//! hyper hands an answer's head and its body's chunks over together as one
//! vectored write. The buffers before a mapped chunk are sent with
//! `MSG_MORE`, so the head leaves in one segment with the body's first
//! bytes rather than alone, as nginx's `tcp_nopush` does.
//!
//! A write that waits longer than the send timeout while the client takes
//! nothing of what the socket holds fails, and the connection closes, as
//! with nginx's `send_timeout`.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::limits::MIN_BODY_RATE;
use tokio::time::{Instant, Sleep};

use crate::engine::mapped;

/// Bytes the socket holds unsent before it stops taking more. Without a
/// bound, a socket takes megabytes of a file at once, and asks for more
/// only once a third of them has gone. It asks for more once less than half
/// of this is left unsent, so this also sets how much one `sendfile` sends:
/// at 1 MiB, one connection reading a cached 10 MiB file got 11–16 % more
/// answers a second (60 calls per answer at 256 KiB, nginx 6), but 100
/// connections reading 1 MB files got 3–13 % fewer.
const UNSENT: u32 = 256 * 1024;

pub(super) struct Socket {
    stream: TcpStream,
    /// Where the last `sendfile` stopped short in a mapped chunk: the rest
    /// is looked up however short it is.
    resume_at: usize,
    linger: Linger,
    /// The connection's place among the server's `max_connections`: given
    /// back when the socket closes, after the linger if there is one, so
    /// that lingering sockets count too.
    slot: Option<OwnedSemaphorePermit>,
    send_timeout: Duration,
    /// While the socket takes no more: when to look again whether the
    /// client has taken any of what it holds (made once, set again for
    /// each wait).
    next_look: Option<Pin<Box<Sleep>>>,
    stalled: Option<Stall>,
}

/// A write's wait for room in the socket.
struct Stall {
    /// What the socket held at the last look (none before the first), and
    /// when it last held less.
    held: Option<usize>,
    since: Instant,
}

/// The bytes a client must take of an answer in each `timeout`.
fn least_taken(timeout: Duration) -> usize {
    (MIN_BODY_RATE * timeout.as_secs().max(1)) as usize
}

/// Whether a client whose socket held `before` bytes, and now `held`, took
/// `least` of them, or all it was given.
fn took_enough(before: usize, held: usize, least: usize) -> bool {
    before.saturating_sub(held) >= least.min(before)
}

/// Looks per send timeout at whether a client whose socket takes no more
/// has taken anything: one that takes nothing is cut off at most half the
/// timeout late (the first look gives the first figure to compare with).
const LOOKS: u32 = 4;

/// Asks that a connection be closed gently: once its last answer is out,
/// whatever the client still sends is read and dropped for a while before
/// the socket closes, as nginx's `lingering_close` does. A connection
/// closed with a request's body unread would otherwise be reset, and the
/// reset can reach the client before the answer it follows: a client that
/// sends its whole body before it reads (most do, without `Expect:
/// 100-continue`) then sees a broken connection instead of the refusal.
#[derive(Clone, Default)]
pub(super) struct Linger(Arc<AtomicBool>);

impl Linger {
    pub(super) fn ask(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Longest a closed connection is read from, and longest wait for each
/// read.
const LINGER_FOR: Duration = Duration::from_secs(10);
const LINGER_READ: Duration = Duration::from_secs(2);

impl Socket {
    pub(super) fn new(stream: TcpStream, linger: Linger, slot: OwnedSemaphorePermit, send_timeout: Duration) -> Socket {
        let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(UNSENT);
        Socket { stream, resume_at: 0, linger, slot: Some(slot), send_timeout, next_look: None, stalled: None }
    }

    /// What becomes of a write that the socket did not take: it waits on,
    /// unless a whole send timeout has passed in which the client took less
    /// than [`MIN_BODY_RATE`]'s worth of the bytes the socket holds (or all
    /// of them). Timing the client's progress rather than the write lets a
    /// slow but steady reader take an answer however long a write waits
    /// for room: half of [`UNSENT`] takes a minute to go to a client
    /// reading 2 KB a second, the default timeout. A client taking a byte
    /// now and then would otherwise hold its connection's slot (one of
    /// `max_connections`) as long as it likes.
    fn stall(&mut self, written: Poll<io::Result<usize>>, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let (timeout, every) = (self.send_timeout, self.send_timeout / LOOKS);
        let least = least_taken(timeout);
        // Most waits end within a look: they cost setting a timer, and no
        // system call.
        let stall = self.stalled.get_or_insert_with(|| Stall { held: None, since: Instant::now() });
        let look = match &mut self.next_look {
            Some(look) if stall.held.is_some() => look,
            Some(look) => {
                look.as_mut().reset(stall.since + every);
                look
            }
            None => self.next_look.insert(Box::pin(tokio::time::sleep(every))),
        };
        while look.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let held = queued(self.stream.as_raw_fd());
            match stall.held {
                Some(before) if !took_enough(before, held, least) && now - stall.since >= timeout => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took less than {least} bytes of the answer within the send timeout"),
                    )));
                }
                Some(before) if !took_enough(before, held, least) => {}
                _ => (stall.held, stall.since) = (Some(held), now),
            }
            look.as_mut().reset(now + every);
        }
        Poll::Pending
    }

    /// Writes what the socket takes of `bufs`: up to a mapped chunk with
    /// `writev`, or the buffers before it and the chunk with `sendfile`.
    fn write(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let Some((i, file)) = self.first_mapped(bufs) else {
            return Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        };
        let socket = self.stream.as_raw_fd();
        let before: usize = bufs[..i].iter().map(|b| b.len()).sum();
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_io(Interest::WRITABLE, || send(socket, &bufs[..i], file)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(n) => {
                    let of_file = n.saturating_sub(before);
                    let short = of_file > 0 && of_file < file.2;
                    self.resume_at = if short { bufs[i].as_ptr() as usize + of_file } else { 0 };
                    return Poll::Ready(Ok(n));
                }
                r => return Poll::Ready(r),
            }
        }
    }
    /// The first of `bufs` that is a mapped chunk, and where its bytes are.
    /// Chunks are mapped only from [`mapped::SMALLEST`] bytes: a shorter
    /// buffer is one only if it is the rest of one sent in part.
    fn first_mapped(&self, bufs: &[IoSlice<'_>]) -> Option<(usize, (RawFd, u64, usize))> {
        bufs.iter().enumerate().find_map(|(i, b)| {
            if b.len() < mapped::SMALLEST && b.as_ptr() as usize != self.resume_at {
                return None;
            }
            mapped::find(b.as_ptr(), b.len()).map(|f| (i, f))
        })
    }
}

/// Sends `before` (with `MSG_MORE`), then `len` bytes of `file` from
/// `offset`: how many bytes went, counting both. Fails only if nothing
/// went.
fn send(socket: RawFd, before: &[IoSlice<'_>], (file, offset, len): (RawFd, u64, usize)) -> io::Result<usize> {
    let mut sent = 0;
    if !before.is_empty() {
        let want: usize = before.iter().map(|b| b.len()).sum();
        // SAFETY: a zeroed msghdr is empty; its vector is `before`, whose
        // buffers live through the call and are only read.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = before.as_ptr().cast_mut().cast();
        msg.msg_iovlen = before.len();
        // SAFETY: as above; `socket` is an open socket.
        let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        sent = n as usize;
        if sent < want {
            return Ok(sent);
        }
    }
    let mut at = offset as libc::off_t;
    // SAFETY: both descriptors are open; the kernel updates `at` only.
    let n = unsafe { libc::sendfile(socket, file, &mut at, len) };
    match n {
        0 if sent == 0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "a blob file is shorter than its record: it was truncated on disk",
        )),
        n if n >= 0 => Ok(sent + n as usize),
        _ if sent > 0 => Ok(sent),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Bytes the socket holds that the client has not acknowledged, sent or
/// not (`SIOCOUTQ`); 0 when the kernel will not say.
fn queued(socket: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: `socket` is an open socket; the kernel writes one int.
    let r = unsafe { libc::ioctl(socket, libc::TIOCOUTQ, &mut n) };
    if r < 0 { 0 } else { n as usize }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.write(cx, bufs);
        this.stall(written, cx)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if !self.linger.0.load(Ordering::Relaxed) {
            return;
        }
        // A second descriptor keeps the socket open once this one closes.
        let Ok(std) = self.stream.as_fd().try_clone_to_owned().map(std::net::TcpStream::from) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Ok(stream) = TcpStream::from_std(std) else { return };
        let slot = self.slot.take();
        runtime.spawn(async move {
            let _slot = slot;
            let _ = socket2::SockRef::from(&stream).shutdown(std::net::Shutdown::Write);
            let mut buf = vec![0; 16 * 1024];
            let read = async {
                loop {
                    match tokio::time::timeout(LINGER_READ, stream.readable()).await {
                        Ok(Ok(())) => match stream.try_read(&mut buf) {
                            Ok(0) => return,
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(_) => return,
                        },
                        _ => return,
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER_FOR, read).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_takes_a_rate_of_the_answer_or_all_it_was_given() {
        let least = least_taken(Duration::from_secs(60));
        assert_eq!(least, 30_000);
        assert!(took_enough(200_000, 170_000, least));
        assert!(!took_enough(200_000, 199_999, least), "a byte now and then is not enough");
        assert!(took_enough(1_000, 0, least), "all it was given is");
        assert!(!took_enough(1_000, 10, least));
        assert_eq!(least_taken(Duration::from_millis(500)), 500, "a timeout under a second counts as one");
    }
}
