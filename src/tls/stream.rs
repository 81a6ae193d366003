//! One accepted connection of a TLS port. Its handshake runs when the
//! connection's task first reads or writes (so the accept loops never wait on
//! a client, and the HTTP port's connection timers and limit cover it), and
//! fails once the handshake timeout from the accept has passed. A client that
//! speaks plain HTTP/1 to the port gets one `400` saying to use TLS, not a
//! TLS alert it cannot read.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;

/// A server-side TLS connection whose handshake happens on first use.
pub struct TlsConn {
    state: State,
    /// When the handshake must be over (armed at the accept).
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

enum State {
    /// Nothing read yet: the first byte tells a TLS client (a handshake
    /// record, 0x16) from a plain-text one.
    Sniffing(TcpStream, tokio_rustls::TlsAcceptor),
    Handshaking(Box<tokio_rustls::Accept<TcpStream>>),
    Ready(Box<TlsStream<TcpStream>>),
    /// The handshake failed or timed out; the socket is closed.
    Closed,
}

/// The answer to plain-text HTTP on a TLS port.
const PLAIN_ANSWER: &str = "{\"error\":\"this port speaks TLS (tls.cert_file is set): use https://\"}";

impl TlsConn {
    pub(super) fn new(tcp: TcpStream, acceptor: tokio_rustls::TlsAcceptor, timeout: Duration) -> TlsConn {
        TlsConn {
            local: tcp.local_addr().ok(),
            peer: tcp.peer_addr().ok(),
            state: State::Sniffing(tcp, acceptor),
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }
    }

    /// The local address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The client's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Drives the handshake; ready with the TLS stream once it is over.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut TlsStream<TcpStream>>> {
        loop {
            let progress = match &mut self.state {
                State::Ready(_) => break,
                State::Closed => return Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
                State::Sniffing(tcp, _) => sniff(tcp, cx),
                State::Handshaking(accept) => Pin::new(accept.as_mut()).poll(cx).map(|r| r.map(Some)),
            };
            match progress {
                Poll::Ready(Ok(step)) => self.advance(step),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.fail(e))),
                Poll::Pending if self.deadline.as_mut().poll(cx).is_ready() => {
                    let msg = format!("TLS handshake not finished within {:?}", self.timeout);
                    return Poll::Ready(Err(self.fail(io::Error::new(io::ErrorKind::TimedOut, msg))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        match &mut self.state {
            State::Ready(stream) => Poll::Ready(Ok(stream)),
            _ => unreachable!("the loop breaks only when ready. This is a bug."),
        }
    }

    /// Moves on after a step: from sniffing to the handshake (`None`), or
    /// from the handshake to the stream.
    fn advance(&mut self, step: Option<TlsStream<TcpStream>>) {
        self.state = match (std::mem::replace(&mut self.state, State::Closed), step) {
            (State::Sniffing(tcp, acceptor), _) => State::Handshaking(Box::new(acceptor.accept(tcp))),
            (_, Some(stream)) => State::Ready(Box::new(stream)),
            (state, None) => state,
        };
    }

    /// Closes the socket after a failed handshake; returns the error.
    fn fail(&mut self, e: io::Error) -> io::Error {
        tracing::debug!(peer = ?self.peer, error = %e, "TLS handshake failed");
        self.state = State::Closed;
        e
    }
}

/// Peeks at the first byte: `Ok(None)` when it may start a TLS handshake;
/// an error (after answering plain HTTP/1 with a 400) when it cannot.
fn sniff(tcp: &mut TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<Option<TlsStream<TcpStream>>>> {
    let mut first = [0u8; 1];
    let n = ready!(tcp.poll_peek(cx, &mut ReadBuf::new(&mut first)))?;
    if n == 0 {
        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
    }
    if !first[0].is_ascii_uppercase() {
        return Poll::Ready(Ok(None));
    }
    // Plain text ("GET ", "POST ", "PRI * HTTP/2.0"): read what has come
    // (so closing does not reset the answer away), answer, close.
    let mut sink = [0u8; 8192];
    while matches!(tcp.try_read(&mut sink), Ok(n) if n > 0) {}
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{PLAIN_ANSWER}",
        PLAIN_ANSWER.len()
    );
    // A fresh socket's send buffer is empty: the answer fits without waiting.
    let _ = tcp.try_write(answer.as_bytes());
    let _ = Pin::new(tcp).poll_shutdown(cx);
    Poll::Ready(Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "plain text on a TLS port",
    )))
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let stream = ready!(self.poll_handshake(cx))?;
        Pin::new(stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let stream = ready!(self.poll_handshake(cx))?;
        Pin::new(stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let stream = ready!(self.poll_handshake(cx))?;
        Pin::new(stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // rustls gathers vectored writes into its records.
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Ready(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            // Nothing written before the handshake.
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Ready(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            State::Sniffing(tcp, _) => Pin::new(tcp).poll_shutdown(cx),
            State::Handshaking(accept) => match accept.get_mut() {
                Some(tcp) => Pin::new(tcp).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            },
            State::Closed => Poll::Ready(Ok(())),
        }
    }
}
