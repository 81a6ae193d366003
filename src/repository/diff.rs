//! What changed in a model folder since its last load, and what that change
//! needs (Triton's `ConfigChangeRequiresReload`; vector's config diff). Pure:
//! the repository task feeds it what it saw before and what it sees now.

use std::path::Path;
use std::time::SystemTime;

use crate::model::settings::ModelSettings;

/// Identity of the ONNX file: its length and a digest of its content, plus
/// the metadata it had when the digest was taken. Two stamps are equal when
/// the content is, so a file rewritten with the same bytes (a Kubernetes
/// ConfigMap update rewrites every file of the map) is no change, while an
/// in-place write or a replace-by-rename with new bytes is.
#[derive(Debug, Clone)]
pub struct FileStamp {
    len: u64,
    digest: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl PartialEq for FileStamp {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.digest == other.digest
    }
}
impl Eq for FileStamp {}

impl FileStamp {
    /// Stamps `path` (following symlinks, as a ConfigMap's `..data` link
    /// must be followed); `None` when it cannot be read. The content is only
    /// read when the metadata differs from `previous` (the last stamp).
    pub fn of(path: &Path, previous: Option<&FileStamp>) -> Option<FileStamp> {
        let m = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&m);
        #[cfg(not(unix))]
        let inode = 0;
        let (len, modified) = (m.len(), m.modified().ok());
        if let Some(p) = previous.filter(|p| (p.len, p.modified, p.inode) == (len, modified, inode)) {
            return Some(p.clone());
        }
        Some(FileStamp {
            len,
            digest: digest(path).ok()?,
            modified,
            inode,
        })
    }
}

/// A 64-bit digest of the file's bytes (change detection, not security).
fn digest(path: &Path) -> std::io::Result<u64> {
    use std::hash::Hasher;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = std::hash::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.write(&buf[..n]);
    }
}

/// What a model folder looked like at one scan.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    /// The parsed settings, or why they are unusable.
    pub settings: Result<ModelSettings, String>,
    /// The ONNX file named by the settings (None if settings are bad or the file is missing).
    pub file: Option<FileStamp>,
}

/// What to do about a folder that was seen before.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Nothing that matters changed.
    None,
    /// The new settings are unusable: keep what serves, report why.
    Invalid(String),
    /// Only batching fields (or the version label) changed: apply them to
    /// the running batcher, no session rebuilt.
    BatchingOnly(ModelSettings),
    /// The ONNX file or a session field changed (or nothing serves yet): load
    /// a new version beside the old one, then swap.
    Reload(ModelSettings),
}

/// Classifies a folder's change. `serving`: the settings and file stamp of
/// the version that serves now, if any.
pub fn classify(
    before: &Stamp,
    now: &Stamp,
    serving: Option<(&ModelSettings, &Option<FileStamp>)>,
) -> Change {
    if before == now {
        return Change::None;
    }
    let new = match &now.settings {
        Err(reason) => return Change::Invalid(reason.clone()),
        Ok(s) => s.clone(),
    };
    match serving {
        Some((old, file)) if *file == now.file && !old.requires_new_sessions(&new) => {
            if *old == new {
                Change::None
            } else {
                Change::BatchingOnly(new)
            }
        }
        _ => Change::Reload(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::settings::ModelDefaults;

    fn settings(json: &str) -> ModelSettings {
        ModelSettings::parse(json, "m", &ModelDefaults::default()).unwrap()
    }

    fn stamp(json: &str, len: u64) -> Stamp {
        Stamp {
            settings: Ok(settings(json)),
            file: Some(FileStamp {
                len,
                digest: len * 31,
                modified: None,
                inode: 1,
            }),
        }
    }

    #[test]
    fn a_file_rewritten_with_the_same_bytes_is_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"weights v1").unwrap();
        let first = FileStamp::of(&path, None).unwrap();
        // Replace by rename with identical bytes: new inode, same content.
        std::fs::write(dir.path().join("tmp"), b"weights v1").unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(FileStamp::of(&path, Some(&first)).unwrap(), first);
        std::fs::write(&path, b"weights v2").unwrap();
        assert_ne!(FileStamp::of(&path, Some(&first)).unwrap(), first);
    }

    #[test]
    fn unchanged_is_nothing() {
        let a = stamp("{}", 10);
        assert_eq!(
            classify(&a, &a.clone(), Some((a.settings.as_ref().unwrap(), &a.file))),
            Change::None
        );
    }

    #[test]
    fn batching_fields_apply_in_place() {
        let a = stamp("{}", 10);
        let b = stamp(
            r#"{"max_batch_size": 4, "batch_policy": "fixed", "timeout": 3}"#,
            10,
        );
        let serving = a.settings.as_ref().unwrap();
        assert!(
            matches!(classify(&a, &b, Some((serving, &a.file))), Change::BatchingOnly(s) if s.batching.max_batch_size == 4)
        );
    }

    #[test]
    fn a_new_file_or_session_field_reloads() {
        let a = stamp("{}", 10);
        let serving = a.settings.as_ref().unwrap();
        assert!(matches!(
            classify(&a, &stamp("{}", 11), Some((serving, &a.file))),
            Change::Reload(_)
        ));
        assert!(matches!(
            classify(&a, &stamp(r#"{"instances": 2}"#, 10), Some((serving, &a.file))),
            Change::Reload(_)
        ));
        // Nothing serves (the last load failed): any change retries the load.
        assert!(matches!(
            classify(&a, &stamp(r#"{"max_batch_size": 4}"#, 10), None),
            Change::Reload(_)
        ));
    }

    #[test]
    fn bad_settings_are_invalid_and_keep_what_serves() {
        let a = stamp("{}", 10);
        let bad = Stamp {
            settings: Err("`x` is an unknown field".into()),
            file: None,
        };
        let serving = a.settings.as_ref().unwrap();
        assert_eq!(
            classify(&a, &bad, Some((serving, &a.file))),
            Change::Invalid("`x` is an unknown field".into())
        );
    }
}
