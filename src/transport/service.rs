//! hyper's view of a port's service (the HTTP router, the gRPC server):
//! each request counts as running on its connection until its answer is
//! done, and its body must arrive within `http.body_read_timeout_seconds`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::time::{Instant, Sleep};

use super::conn::ConnState;
use crate::budget::HeldUntilSent;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request did not arrive within `http.body_read_timeout_seconds`.
/// Handlers find it in the body's error chain and answer 408.
#[derive(Debug)]
pub struct BodyReadTimeout(pub Duration);

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} s (http.body_read_timeout_seconds)",
            self.0.as_secs_f64()
        )
    }
}

impl std::error::Error for BodyReadTimeout {}

/// A port's service, as hyper calls it for one connection: each request
/// counts as running on its connection until its answer's body is done
/// (sent or dropped), and its body must arrive within
/// `http.body_read_timeout_seconds`, except on the paths of long-lived
/// streams (gRPC's `ModelStreamInfer`, whose body is the stream).
#[derive(Clone)]
pub(crate) struct Guarded<S> {
    pub(super) inner: S,
    pub(super) conn: Arc<ConnState>,
    pub(super) body_read_timeout: Duration,
    pub(super) untimed: &'static [&'static str],
    /// The connection's bytes for long-lived streams, put in each request's extensions.
    pub(super) bytes: Option<Arc<crate::budget::ConnectionBytes>>,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Guarded<S>
where
    S: tower_service::Service<Request<TimedBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
{
    type Response = Response<GuardedBody<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = Counted::new(
            self.conn.clone(),
            ConnState::begin_request,
            ConnState::end_request,
        );
        let timeout = match self.untimed.contains(&req.uri().path()) {
            true => None,
            false => Some(self.body_read_timeout),
        };
        let conn = &self.conn;
        let mut req = req;
        if let Some(bytes) = &self.bytes {
            req.extensions_mut().insert(bytes.clone());
        }
        let req = req.map(|body| {
            // A body still to arrive (not a long-lived stream's) makes the
            // connection evictable at the cap until it is in.
            let receiving = match (timeout, http_body::Body::is_end_stream(&body)) {
                (Some(_), false) => Some(Counted::new(
                    conn.clone(),
                    ConnState::body_started,
                    ConnState::body_done,
                )),
                _ => None,
            };
            TimedBody {
                inner: body,
                timeout,
                sleep: None,
                started: Instant::now(),
                receiving,
            }
        });
        // The port's services (axum's router, tonic's server) are always
        // ready: their `poll_ready` returns `Ready(Ok)`.
        let answer = self.inner.clone().call(req);
        let watched = timeout.is_some();
        Box::pin(async move {
            let mut resp = answer.await?;
            let held = resp.extensions_mut().remove::<HeldUntilSent>();
            let progress = watched.then(|| {
                Counted::new(
                    guard.conn.clone(),
                    ConnState::answer_started,
                    ConnState::answer_done,
                )
            });
            Ok(resp.map(|body| GuardedBody {
                body,
                progress,
                rest: Bytes::new(),
                _held: held,
                _guard: guard,
            }))
        })
    }
}

/// Something counted on its connection from its creation to its drop: a
/// request running, a request body arriving, an answer being sent.
struct Counted {
    conn: Arc<ConnState>,
    end: fn(&ConnState),
}

impl Counted {
    fn new(conn: Arc<ConnState>, begin: fn(&ConnState), end: fn(&ConnState)) -> Counted {
        begin(&conn);
        Counted { conn, end }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        (self.end)(&self.conn);
    }
}

/// An answer's body; the request runs until hyper drops it (sent or
/// abandoned), and holds its bytes of the budget until then.
pub(crate) struct GuardedBody<B> {
    body: B,
    /// Tells the connection each time hyper takes from the body (`None` for
    /// a long-lived stream's answer, which may wait for its data).
    progress: Option<Counted>,
    /// What is left of the frame the body gave last (see [`PIECE`]).
    rest: Bytes,
    _held: Option<HeldUntilSent>,
    _guard: Counted,
}

/// The most of an answer handed to hyper at once. hyper drops a body once
/// it has taken its last frame, however much of it is still unwritten: in
/// pieces this size, all but the last ~hundreds of KiB (hyper's write queue,
/// or HTTP/2's flow-control window) stay in the body, and so in the budget,
/// until the client reads them.
const PIECE: usize = 64 << 10;

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for GuardedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        // hyper takes from the body only while it can write: a client that
        // does not read stops these calls (the connection's stall timer).
        if let Some(a) = &self.progress {
            a.conn.answer_progress();
        }
        if !self.rest.is_empty() {
            let n = self.rest.len().min(PIECE);
            return Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(n)))));
        }
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) if data.len() > PIECE => {
                    let piece = data.split_to(PIECE);
                    self.rest = data;
                    Poll::Ready(Some(Ok(Frame::data(piece))))
                }
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.len() as u64;
        let inner = self.body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// A request body that fails with [`BodyReadTimeout`] when it is not
/// complete within `timeout` of its headers (`None`: it may take as long as
/// the client keeps the stream open).
pub struct TimedBody {
    inner: Incoming,
    timeout: Option<Duration>,
    started: Instant,
    /// Armed the first time the body is not ready.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Held while the body is arriving; dropped when it is in.
    receiving: Option<Counted>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
                this.receiving = None;
            }
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        let Some(timeout) = this.timeout else {
            return Poll::Pending;
        };
        let deadline = this.started + timeout;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyReadTimeout(timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
