//! The only place that knows gRPC status codes: one table from
//! [`ErrorKind`] to [`Code`] (Triton's mapping; SPEC §4, §5), mirroring
//! `http/error.rs` for the REST port.

use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

/// gRPC code for each error kind.
pub fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::ModelNotFound => Code::NotFound,
        ErrorKind::InvalidInput => Code::InvalidArgument,
        ErrorKind::PayloadTooLarge => Code::ResourceExhausted,
        // Queue full, model not ready, draining: retry later (SPEC §5).
        ErrorKind::Overloaded | ErrorKind::ModelNotReady | ErrorKind::ShuttingDown => Code::Unavailable,
        ErrorKind::DeadlineExceeded | ErrorKind::RequestTimeout => Code::DeadlineExceeded,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Runtime | ErrorKind::Internal => Code::Internal,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
    }
}

/// An [`Error`] on its way out as a gRPC status; the message names what was wrong.
pub fn status(e: &Error) -> Status {
    let kind = e.kind();
    let code = code_of(kind);
    tracing::debug!(kind = kind.as_str(), code = ?code, error = %e, "gRPC request failed");
    Status::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_spec_codes() {
        let overloaded = Error::Overloaded {
            model: "m".into(),
            max_queue_size: 1,
            retry_after: Duration::from_secs(1),
        };
        let late = Error::DeadlineExceeded {
            model: "m".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(status(&overloaded).code(), Code::Unavailable);
        let predicted_late = Error::PredictedLate {
            model: "m".into(),
            predicted: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(status(&predicted_late).code(), Code::Unavailable);
        assert_eq!(status(&late).code(), Code::DeadlineExceeded);
        assert_eq!(status(&Error::invalid("bad")).code(), Code::InvalidArgument);
        assert_eq!(status(&Error::invalid("bad")).message(), "bad");
        assert_eq!(status(&Error::ModelNotFound("m".into())).code(), Code::NotFound);
        assert_eq!(status(&Error::ShuttingDown).code(), Code::Unavailable);
    }
}
