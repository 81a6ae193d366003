//! Who may do what (README, "Access (threat model)"). Two scopes:
//! inference (every model endpoint: infer, predict, metadata, config,
//! statistics, the repository index) and control (repository load and
//! unload). Control through the API is off unless the operator turns it on
//! (`model_repository.control = "api"`, as Triton's `--model-control-mode`),
//! because loading a model is loading code-like files chosen by the caller;
//! the file watcher is not affected. Each scope may also require an API key
//! (`Authorization: Bearer KEY` or `X-API-Key: KEY`, over HTTP and as gRPC
//! metadata). Health and `/metrics` stay open for probes and Prometheus.
//! Keys are compared in constant time and never logged.

use crate::config::Config;
pub use crate::config::ControlMode;
use crate::error::Error;

/// What a request asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Inference,
    Control,
}

/// The access rules of a running server (from `model_repository.control`
/// and `[auth]`). Cheap to clone.
#[derive(Clone, Default)]
pub struct Access {
    pub control: ControlMode,
    pub inference_key: Option<String>,
    pub control_key: Option<String>,
}

impl std::fmt::Debug for Access {
    /// Never prints the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("control", &self.control)
            .field("inference_key", &self.inference_key.as_ref().map(|_| "<set>"))
            .field("control_key", &self.control_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Access {
    /// The rules set by `model_repository.control` and `[auth]` (an empty key is no key).
    pub fn from_config(cfg: &Config) -> Access {
        let key = |k: &Option<String>| k.clone().filter(|k| !k.is_empty());
        Access {
            control: cfg.model_repository.control,
            inference_key: key(&cfg.auth.inference_api_key),
            control_key: key(&cfg.auth.control_api_key),
        }
    }

    /// Checks a request of `scope` that presented `key` (from
    /// [`presented_key`]); the error says what is missing, never the key.
    pub fn check(&self, scope: Scope, key: Option<&str>) -> Result<(), Error> {
        let (wanted, what) = match scope {
            Scope::Control if self.control == ControlMode::None => {
                return Err(Error::PermissionDenied(
                    "loading and unloading models through the API is disabled (model_repository.control = \"none\"); \
                     set model_repository.control = \"api\" (SLUICE_MODEL_REPOSITORY__CONTROL=api) to allow it"
                        .into(),
                ))
            }
            Scope::Control => (&self.control_key, "control (auth.control_api_key)"),
            Scope::Inference => (&self.inference_key, "inference (auth.inference_api_key)"),
        };
        let Some(wanted) = wanted else {
            return Ok(());
        };
        match key {
            None => Err(Error::Unauthenticated(format!(
                "this endpoint needs the {what} API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`"
            ))),
            Some(k) if same(k.as_bytes(), wanted.as_bytes()) => Ok(()),
            Some(_) => Err(Error::PermissionDenied(format!(
                "the API key sent is not the {what} key"
            ))),
        }
    }
}

/// The key a request presents: `Authorization: Bearer KEY` (any case of
/// "Bearer"), else `X-API-Key: KEY`. `header(name)` reads one header (HTTP)
/// or metadata entry (gRPC, lower-case names).
pub fn presented_key<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<&'a str> {
    let bearer = header("authorization").and_then(|v| {
        let (scheme, key) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
    });
    bearer.or_else(|| header("x-api-key").map(str::trim))
}

/// Equality whose time depends only on the lengths, not on where the bytes
/// differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn access(control: ControlMode, inference: Option<&str>, ctl: Option<&str>) -> Access {
        Access {
            control,
            inference_key: inference.map(String::from),
            control_key: ctl.map(String::from),
        }
    }

    fn kind(r: Result<(), Error>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind())
    }

    #[test]
    fn control_is_refused_by_default_and_keys_guard_each_scope() {
        let open = Access::default();
        assert_eq!(kind(open.check(Scope::Inference, None)), None);
        let e = open.check(Scope::Control, Some("anything")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("model_repository.control"), "{e}");

        let a = access(ControlMode::Api, Some("inf-key"), Some("ctl-key"));
        assert_eq!(
            kind(a.check(Scope::Inference, None)),
            Some(ErrorKind::Unauthenticated)
        );
        assert_eq!(
            kind(a.check(Scope::Inference, Some("ctl-key"))),
            Some(ErrorKind::PermissionDenied)
        );
        assert_eq!(kind(a.check(Scope::Inference, Some("inf-key"))), None);
        assert_eq!(
            kind(a.check(Scope::Control, Some("inf-key"))),
            Some(ErrorKind::PermissionDenied)
        );
        assert_eq!(kind(a.check(Scope::Control, Some("ctl-key"))), None);
        // Control without a control key: open once enabled.
        let b = access(ControlMode::Api, Some("inf-key"), None);
        assert_eq!(kind(b.check(Scope::Control, None)), None);
        // The key never appears in a message or in Debug.
        let msg = a.check(Scope::Inference, Some("wrong")).unwrap_err().to_string();
        assert!(!msg.contains("inf-key") && !msg.contains("wrong"), "{msg}");
        assert!(!format!("{a:?}").contains("inf-key"));
    }

    #[test]
    fn keys_come_from_bearer_or_x_api_key() {
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
        };
        assert_eq!(
            presented_key(headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            presented_key(headers(&[("authorization", "bearer  abc ")])),
            Some("abc")
        );
        assert_eq!(presented_key(headers(&[("x-api-key", "xyz")])), Some("xyz"));
        assert_eq!(
            presented_key(headers(&[("authorization", "Basic Zm9v"), ("x-api-key", "k")])),
            Some("k")
        );
        assert_eq!(presented_key(headers(&[])), None);
    }

    #[test]
    fn comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
        assert!(same(b"", b""));
    }
}
