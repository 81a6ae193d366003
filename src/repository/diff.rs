//! What changed in a model folder since its last load, and what that change
//! needs (Triton's `ConfigChangeRequiresReload`; vector's config diff). Pure:
//! the repository task feeds it what it saw before and what it sees now.

use std::path::Path;
use std::time::SystemTime;

use super::files;
use crate::settings::ModelSettings;

/// Identity of the ONNX file: its length and a digest of its content, plus
/// the metadata it had when the digest was taken. Two stamps are equal when
/// the content is, so a file rewritten with the same bytes (a Kubernetes
/// ConfigMap update rewrites every file of the map) is no change, while an
/// in-place write or a replace-by-rename with new bytes is.
#[derive(Debug, Clone)]
pub struct FileStamp {
    /// Size in bytes.
    pub len: u64,
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
    /// must be followed); the error names the file and says why it cannot
    /// be used (missing, not a regular file, unreadable). The content is
    /// only read when the metadata differs from `previous` (the last stamp).
    /// Blocking: the repository calls it from `spawn_blocking`.
    pub fn of(path: &Path, previous: Option<&FileStamp>) -> Result<FileStamp, String> {
        let why = |e: std::io::Error| format!("{}: {e}", path.display());
        let m = std::fs::metadata(path).map_err(why)?;
        if let Some(p) = previous.filter(|p| m.file_type().is_file() && p.same_metadata(&m)) {
            return Ok(p.clone());
        }
        let (m, digest) = files::digest(path).map_err(why)?;
        Ok(FileStamp {
            len: m.len(),
            digest,
            modified: m.modified().ok(),
            inode: inode(&m),
        })
    }

    fn same_metadata(&self, m: &std::fs::Metadata) -> bool {
        (self.len, self.modified, self.inode) == (m.len(), m.modified().ok(), inode(m))
    }
}

fn inode(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(m)
}

/// What a model folder looked like at one scan.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    /// The parsed settings, or why they are unusable.
    pub settings: Result<ModelSettings, String>,
    /// The ONNX file named by the settings, or why it cannot be used (the
    /// message names the file; empty when the settings are unusable).
    pub file: Result<FileStamp, String>,
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
pub fn classify(before: &Stamp, now: &Stamp, serving: Option<(&ModelSettings, &FileStamp)>) -> Change {
    if before == now {
        return Change::None;
    }
    let new = match &now.settings {
        Err(reason) => return Change::Invalid(reason.clone()),
        Ok(s) => s.clone(),
    };
    match serving {
        Some((old, file)) if now.file.as_ref() == Ok(file) && !old.requires_new_sessions(&new) => {
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
    use crate::settings::ModelDefaults;

    fn settings(json: &str) -> ModelSettings {
        ModelSettings::parse(json, "m", &ModelDefaults::default()).unwrap()
    }

    fn stamp(json: &str, len: u64) -> Stamp {
        Stamp {
            settings: Ok(settings(json)),
            file: Ok(FileStamp {
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
            classify(
                &a,
                &a.clone(),
                Some((a.settings.as_ref().unwrap(), a.file.as_ref().unwrap()))
            ),
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
            matches!(classify(&a, &b, Some((serving, a.file.as_ref().unwrap()))), Change::BatchingOnly(s) if s.batching.max_batch_size == 4)
        );
    }

    #[test]
    fn a_new_file_or_session_field_reloads() {
        let a = stamp("{}", 10);
        let serving = a.settings.as_ref().unwrap();
        assert!(matches!(
            classify(&a, &stamp("{}", 11), Some((serving, a.file.as_ref().unwrap()))),
            Change::Reload(_)
        ));
        assert!(matches!(
            classify(
                &a,
                &stamp(r#"{"instances": 2}"#, 10),
                Some((serving, a.file.as_ref().unwrap()))
            ),
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
            file: Err(String::new()),
        };
        let serving = a.settings.as_ref().unwrap();
        assert_eq!(
            classify(&a, &bad, Some((serving, a.file.as_ref().unwrap()))),
            Change::Invalid("`x` is an unknown field".into())
        );
    }
}
