//! TLS for both ports (rustls with the `ring` provider). One certificate
//! store serves the HTTP and the gRPC port: each port has its own rustls
//! `ServerConfig` (they differ in ALPN: `h2` and `http/1.1` on HTTP, `h2` on
//! gRPC), and both ask the store for the certificate at every handshake. The
//! reload task (`reload.rs`) swaps the store's certificate when the files
//! change, so new handshakes get the new one while open connections keep
//! theirs. Each accepted socket becomes a [`TlsConn`] (`stream.rs`) whose
//! handshake runs inside the connection's own task, on its first read, under
//! a deadline: the accept loops never wait on a client.
//!
//! Below `http` and `grpc`; uses only `config` and `metrics`.

mod expiry;
mod reload;
mod stream;

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpStream;

use crate::config::TlsFiles;
pub use stream::TlsConn;

/// TLS of a running server: the two ports' acceptors and the reload task
/// (stopped when this is dropped).
pub struct Tls {
    http: Acceptor,
    grpc: Acceptor,
    _reloader: reload::Reloader,
}

impl Tls {
    /// Loads the certificate and key (an error names the key and the file),
    /// builds both ports' configurations, and starts watching the files.
    /// Call inside the tokio runtime. `handshake_timeout`: how long a client
    /// has, from the accept, to finish its handshake.
    pub fn start(files: TlsFiles, handshake_timeout: Duration) -> Result<Tls, String> {
        let pem = Pem::read(&files)?;
        let key = certified_key(&pem, &files)?;
        let expires_in_days = published_expiry(&key);
        let store = Arc::new(CertStore {
            current: RwLock::new(Arc::new(key)),
        });
        let acceptor = |alpn: &[&[u8]]| -> Result<Acceptor, String> {
            Ok(Acceptor {
                inner: tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&store, alpn)?)),
                handshake_timeout,
            })
        };
        let (http, grpc) = (acceptor(&[b"h2", b"http/1.1"])?, acceptor(&[b"h2"])?);
        tracing::info!(
            cert_file = %files.cert.display(),
            key_file = %files.key.display(),
            expires_in_days,
            "TLS on for the HTTP and gRPC ports"
        );
        let reloader = reload::spawn(store, files, pem);
        Ok(Tls {
            http,
            grpc,
            _reloader: reloader,
        })
    }

    /// The HTTP port's acceptor (ALPN `h2`, `http/1.1`).
    pub fn http(&self) -> Acceptor {
        self.http.clone()
    }

    /// The gRPC port's acceptor (ALPN `h2`).
    pub fn grpc(&self) -> Acceptor {
        self.grpc.clone()
    }
}

/// Turns accepted sockets into TLS connections; cheap to clone.
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
}

impl Acceptor {
    /// `tcp` as a TLS connection whose handshake runs on its first read or
    /// write and fails unless finished within the handshake timeout from now.
    pub fn accept(&self, tcp: TcpStream) -> TlsConn {
        TlsConn::new(tcp, self.inner.clone(), self.handshake_timeout)
    }
}

/// The certificate every new handshake gets, on both ports. Read by rustls
/// in each handshake (a clone of the `Arc` under a read lock held for no
/// longer than that); written only by the reload task.
#[derive(Debug)]
pub(crate) struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    fn replace(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The bytes of the certificate and key files.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Pem {
    /// Reads both files; an error names the key and the file.
    fn read(files: &TlsFiles) -> Result<Pem, String> {
        let read = |key: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("tls.{key} {}: cannot read it ({e})", path.display()))
        };
        Ok(Pem {
            cert: read("cert_file", &files.cert)?,
            key: read("key_file", &files.key)?,
        })
    }
}

/// Sets the expiration gauge to the certificate of `key` (which new
/// handshakes are about to get); returns the days until it expires (`None`
/// when its date cannot be read), warning when it has expired already.
fn published_expiry(key: &CertifiedKey) -> Option<i64> {
    let not_after = expiry::not_after(key.cert.first()?)?;
    crate::metrics::tls_certificate_expiration(not_after);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if not_after <= now {
        tracing::warn!(
            not_after,
            "the TLS certificate has expired: clients will refuse it"
        );
    }
    Some((not_after - now).div_euclid(86400))
}

/// The process's TLS primitives: `ring`, whatever other provider a
/// dependency may have compiled in.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain and key of `pem`, checked to belong together; an
/// error names the key and the file at fault.
fn certified_key(pem: &Pem, files: &TlsFiles) -> Result<CertifiedKey, String> {
    let (cert_file, key_file) = (files.cert.display(), files.key.display());
    let chain = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.cert_file {cert_file}: not a PEM certificate chain ({e})"))?;
    if chain.is_empty() {
        return Err(format!(
            "tls.cert_file {cert_file}: no \"BEGIN CERTIFICATE\" block"
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("tls.key_file {key_file}: no private key block (PKCS#8, RSA or EC PRIVATE KEY)")
        }
        e => format!("tls.key_file {key_file}: not a PEM private key ({e})"),
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("tls.key_file {key_file}: unusable private key ({e})"))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(_)) => Err(format!(
            "tls.key_file {key_file} is not the private key of the certificate in tls.cert_file {cert_file}"
        )),
        Err(e) => Err(format!(
            "tls.cert_file {cert_file}: the first certificate cannot be used ({e})"
        )),
    }
}

/// One port's rustls configuration: TLS 1.2 and 1.3, no client
/// certificates, the certificate from `store`, ALPN `alpn` in order of preference.
fn server_config(store: &Arc<CertStore>, alpn: &[&[u8]]) -> Result<ServerConfig, String> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(store.clone());
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed certificate for `name` and its key, as PEM.
    pub(crate) fn self_signed(name: &str) -> Pem {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        Pem {
            cert: c.cert.pem().into_bytes(),
            key: c.signing_key.serialize_pem().into_bytes(),
        }
    }

    pub(crate) fn files() -> TlsFiles {
        TlsFiles {
            cert: "/certs/tls.crt".into(),
            key: "/certs/tls.key".into(),
            poll_interval: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_matching_pair_loads() {
        let pem = self_signed("localhost");
        let key = certified_key(&pem, &files()).unwrap();
        assert_eq!(key.cert.len(), 1);
    }

    #[test]
    fn each_bad_file_is_named() {
        let good = self_signed("localhost");
        let other = self_signed("elsewhere");
        let cases = [
            (b"garbage".to_vec(), good.key.clone(), "tls.cert_file /certs/tls.crt: no \"BEGIN CERTIFICATE\""),
            (
                b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n".to_vec(),
                good.key.clone(),
                "tls.cert_file /certs/tls.crt: not a PEM certificate chain",
            ),
            (good.cert.clone(), b"garbage".to_vec(), "tls.key_file /certs/tls.key: no private key block"),
            (
                good.cert.clone(),
                other.key.clone(),
                "tls.key_file /certs/tls.key is not the private key of the certificate in tls.cert_file /certs/tls.crt",
            ),
        ];
        for (cert, key, want) in cases {
            let err = certified_key(&Pem { cert, key }, &files())
                .map(|_| ())
                .unwrap_err();
            assert!(err.starts_with(want), "{err}");
        }
    }

    #[test]
    fn the_store_hands_out_the_latest_certificate() {
        let (a, b) = (self_signed("a"), self_signed("b"));
        let store = CertStore {
            current: RwLock::new(Arc::new(certified_key(&a, &files()).unwrap())),
        };
        let first = store.current.read().unwrap().cert[0].clone();
        store.replace(certified_key(&b, &files()).unwrap());
        let second = store.current.read().unwrap().cert[0].clone();
        assert_ne!(first, second);
        assert!(server_config(&Arc::new(store), &[b"h2"]).is_ok());
    }
}
