//! `[tls]`: the certificate and key that turn TLS on for both ports (HTTP
//! and gRPC). Here only the keys and their checks; `crate::tls` serves them
//! and reloads them when the files change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `[tls]` section, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's certificate first. Set with
    /// `key_file`, both ports speak TLS only; unset (or empty), neither does.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Seconds between checks of the two files, beside the file events
    /// (which a network or projected volume may not deliver).
    pub poll_interval_seconds: f64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            poll_interval_seconds: 5.0,
        }
    }
}

/// The validated `[tls]` section: TLS is on.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub poll_interval: Duration,
}

/// `path`, unless unset or empty (an environment variable set to "" unsets it).
fn given(path: &Option<PathBuf>) -> Option<&Path> {
    path.as_deref().filter(|p| !p.as_os_str().is_empty())
}

impl TlsConfig {
    /// Adds this section's problems to `errs`: one file without the other,
    /// a file that cannot be read, a poll interval out of range.
    pub(super) fn validate(&self, errs: &mut Vec<String>) {
        match (given(&self.cert_file), given(&self.key_file)) {
            (Some(_), None) => errs.push(
                "tls.cert_file is set but tls.key_file is not: set both (TLS on both ports) or neither (plain)"
                    .into(),
            ),
            (None, Some(_)) => errs.push(
                "tls.key_file is set but tls.cert_file is not: set both (TLS on both ports) or neither (plain)"
                    .into(),
            ),
            _ => {}
        }
        for (key, path) in [("cert_file", &self.cert_file), ("key_file", &self.key_file)] {
            if let Some(p) = given(path) {
                if let Err(e) = readable_file(p) {
                    errs.push(format!("tls.{key} {}: {e}", p.display()));
                }
            }
        }
        let s = self.poll_interval_seconds;
        if !(s.is_finite() && (0.1..=3600.0).contains(&s)) {
            errs.push(format!("tls.poll_interval_seconds must be 0.1..=3600, got {s}"));
        }
    }

    /// The files and poll interval when TLS is on. Call after validation.
    pub fn files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: given(&self.cert_file)?.to_path_buf(),
            key: given(&self.key_file)?.to_path_buf(),
            poll_interval: Duration::from_secs_f64(self.poll_interval_seconds),
        })
    }
}

/// Whether `p` is a file this process can open (following symlinks).
fn readable_file(p: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot read it ({e})"))?;
    if !meta.is_file() {
        return Err("is not a file".into());
    }
    std::fs::File::open(p).map_err(|e| format!("cannot read it ({e})"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(tls: &TlsConfig) -> Vec<String> {
        let mut errs = Vec::new();
        tls.validate(&mut errs);
        errs
    }

    #[test]
    fn off_by_default_and_with_empty_paths() {
        assert!(errors(&TlsConfig::default()).is_empty());
        assert_eq!(TlsConfig::default().files(), None);
        let empty = TlsConfig {
            cert_file: Some(PathBuf::new()),
            key_file: Some(PathBuf::new()),
            ..TlsConfig::default()
        };
        assert!(errors(&empty).is_empty());
        assert_eq!(empty.files(), None);
    }

    #[test]
    fn cert_and_key_are_both_set_or_neither() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tls.crt");
        std::fs::write(&file, "x").unwrap();
        let only_cert = TlsConfig {
            cert_file: Some(file.clone()),
            ..TlsConfig::default()
        };
        let errs = errors(&only_cert);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("tls.key_file is not") && errs[0].contains("set both"),
            "{errs:?}"
        );
        let only_key = TlsConfig {
            key_file: Some(file.clone()),
            ..TlsConfig::default()
        };
        assert!(errors(&only_key)[0].contains("tls.cert_file is not"));
        let both = TlsConfig {
            cert_file: Some(file.clone()),
            key_file: Some(file.clone()),
            poll_interval_seconds: 0.5,
        };
        assert!(errors(&both).is_empty());
        let files = both.files().unwrap();
        assert_eq!(
            (files.cert, files.poll_interval),
            (file, Duration::from_millis(500))
        );
    }

    #[test]
    fn a_missing_file_or_a_folder_is_named_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.key");
        let tls = TlsConfig {
            cert_file: Some(dir.path().to_path_buf()),
            key_file: Some(missing.clone()),
            poll_interval_seconds: 0.0,
        };
        let errs = errors(&tls);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(
            errs[0].starts_with("tls.cert_file ") && errs[0].contains("is not a file"),
            "{errs:?}"
        );
        assert!(
            errs[1].starts_with(&format!("tls.key_file {}: cannot read it", missing.display())),
            "{errs:?}"
        );
        assert!(errs[2].contains("tls.poll_interval_seconds"), "{errs:?}");
    }
}
