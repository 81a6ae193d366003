//! The socket of one HTTP connection, as hyper sees it: plain TCP or TLS
//! ([`Socket`]); reads of request bytes (after TLS) are reported to the
//! connection's state (a request's headers started), and hyper's own
//! answers to requests it cannot parse (400, 414, 431 with an empty body)
//! are rewritten to carry the usual `{"error": "..."}` body (SPEC §9).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::conn::ConnState;
use crate::tls::TlsConn;

/// An accepted connection of the HTTP port: plain, or TLS (`tls.cert_file`
/// set), whose handshake runs on the first read, under the connection's
/// header timeout like a request's headers.
pub(crate) enum Socket {
    Plain(TcpStream),
    Tls(Box<TlsConn>),
}

/// Forwards one I/O call to the socket of either kind.
macro_rules! either {
    ($self:expr, $s:ident => $call:expr) => {
        match $self.get_mut() {
            Socket::Plain($s) => $call,
            Socket::Tls($s) => $call,
        }
    };
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        either!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        either!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        either!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Plain(s) => s.is_write_vectored(),
            Socket::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// A socket that tells its connection's state what it reads and puts a
/// JSON body into hyper's bodiless error answers.
pub(crate) struct TrackedIo {
    stream: Socket,
    state: Arc<ConnState>,
    /// Nothing read yet (the first bytes tell HTTP/1 from HTTP/2).
    first: bool,
    max_header_bytes: usize,
    /// The JSON answer being written in place of hyper's bodiless one.
    rewrite: Option<Rewrite>,
}

struct Rewrite {
    bytes: Vec<u8>,
    written: usize,
    /// The length of hyper's answer, reported written once ours is.
    replaces: usize,
}

impl TrackedIo {
    pub(super) fn new(stream: Socket, state: Arc<ConnState>, max_header_bytes: usize) -> TrackedIo {
        TrackedIo {
            stream,
            state,
            first: true,
            max_header_bytes,
            rewrite: None,
        }
    }

    /// Writes `buf` (hyper's bytes), or our JSON answer in place of them.
    fn write_or_rewrite(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.rewrite.is_none() && self.state.is_quiet() {
            if let Some(bytes) = json_error_answer(buf, self.max_header_bytes) {
                self.rewrite = Some(Rewrite {
                    bytes,
                    written: 0,
                    replaces: buf.len(),
                });
            }
        }
        let Some(r) = self.rewrite.as_mut() else {
            return Pin::new(&mut self.stream).poll_write(cx, buf);
        };
        while r.written < r.bytes.len() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &r.bytes[r.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            r.written += n;
        }
        let replaces = r.replaces;
        self.rewrite = None;
        Poll::Ready(Ok(replaces))
    }
}

/// When `buf` is hyper's own answer to a request it could not parse (a
/// status line of 400, 414 or 431 and `content-length: 0`, written while no
/// request of the connection runs), the same answer with a JSON body.
fn json_error_answer(buf: &[u8], max_header_bytes: usize) -> Option<Vec<u8>> {
    if !may_be_hyper_error(buf) || !buf.ends_with(b"\r\n\r\n") || !contains(buf, b"\r\ncontent-length: 0\r\n")
    {
        return None;
    }
    let (status, message) = match &buf[9..13] {
        b"400 " => (
            "400 Bad Request",
            "malformed HTTP request: the request line or a header could not be parsed".to_string(),
        ),
        b"414 " => ("414 URI Too Long", "the request URI is too long".to_string()),
        b"431 " => (
            "431 Request Header Fields Too Large",
            format!(
                "the request line and headers are larger than {max_header_bytes} bytes \
                 (http.max_header_bytes) or have more than 100 fields"
            ),
        ),
        _ => return None,
    };
    let body = serde_json::json!({ "error": message }).to_string();
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    Some(answer.into_bytes())
}

/// The status line of an answer hyper writes by itself (cheap: the first 13 bytes).
fn may_be_hyper_error(buf: &[u8]) -> bool {
    buf.len() > 13
        && (buf.starts_with(b"HTTP/1.1 ") || buf.starts_with(b"HTTP/1.0 "))
        && matches!(&buf[9..13], b"400 " | b"414 " | b"431 ")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if !read.is_empty() {
            let first = std::mem::replace(&mut self.first, false);
            self.state.on_read(read, first);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.write_or_rewrite(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper's answers start a write; a partial vectored write is allowed.
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(first) if self.rewrite.is_some() || may_be_hyper_error(first) => {
                self.write_or_rewrite(cx, first)
            }
            _ => Pin::new(&mut self.stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_parse_errors_get_a_json_body() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\
                      date: Mon, 23 Nov 2026 22:00:00 GMT\r\n\r\n";
        let answer = String::from_utf8(json_error_answer(hyper, 65536).unwrap()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("65536"), "{v}");
        let bad = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert!(json_error_answer(bad, 65536).is_some());
    }

    #[test]
    fn other_answers_pass_through() {
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n"[..],
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{\"error\"",
        ] {
            assert!(json_error_answer(other, 65536).is_none());
        }
    }
}
