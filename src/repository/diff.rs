//! What changed in a model folder since its last load, and what that change
//! needs (Triton's `ConfigChangeRequiresReload`; vector's config diff). Pure:
//! the repository task feeds it what it saw before and what it sees now.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::files;
use crate::settings::ModelSettings;

/// Identity of a model's files: the ONNX file and every other file of its
/// folder (external data such as `weights.bin`, which a graph names by
/// path, so retrained weights beside a byte-identical `model.onnx` are a
/// new model), by their total length and a digest of their content, plus
/// the metadata each had when the digest was taken. Two stamps are equal
/// when the content is, so a file rewritten with the same bytes (a
/// Kubernetes ConfigMap update rewrites every file of the map) is no
/// change, while an in-place write or a replace-by-rename with new bytes
/// is. The settings file and hidden entries (an editor's swap file, a
/// ConfigMap's `..data` folder, whose files are reached through their
/// links) are not part of it.
#[derive(Debug, Clone)]
pub struct FileStamp {
    /// Size in bytes of all the files.
    pub len: u64,
    digest: u64,
    /// Each file's metadata, the ONNX file first, then by path.
    files: Vec<FileMeta>,
}

/// What a file's metadata says of it: a change in any of these re-reads it,
/// and, for a model whose load failed, tries the load again (a permission
/// restored changes only `mode` and `changed`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileMeta {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    mode: u32,
    /// The inode's change time, in nanoseconds.
    changed: i128,
}

impl FileMeta {
    fn of(path: &Path, m: &std::fs::Metadata) -> FileMeta {
        use std::os::unix::fs::MetadataExt;
        FileMeta {
            path: path.to_path_buf(),
            len: m.len(),
            modified: m.modified().ok(),
            inode: m.ino(),
            mode: m.mode(),
            changed: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

impl PartialEq for FileStamp {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.digest == other.digest
    }
}
impl Eq for FileStamp {}

/// Most files of a model folder that are stamped, and how deep its
/// sub-folders are walked: beyond them a folder is not a model's.
const MAX_FILES: usize = 256;
const MAX_DEPTH: usize = 4;

impl FileStamp {
    /// Stamps the ONNX file `model` and the other files of its `folder`
    /// (following symlinks, as a ConfigMap's `..data` link must be
    /// followed); the error names the file and says why it cannot be used
    /// (missing, not a regular file, unreadable). The content is only read
    /// when some file's metadata differs from `previous` (the last stamp).
    /// Blocking: the repository calls it from `spawn_blocking`.
    pub fn of(model: &Path, folder: &Path, previous: Option<&FileStamp>) -> Result<FileStamp, String> {
        let why = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
        let mut paths = vec![model.to_path_buf()];
        folder_files(folder, 0, model, &mut paths);
        let mut files = Vec::with_capacity(paths.len());
        for path in &paths {
            let m = std::fs::metadata(path).map_err(|e| why(path, e))?;
            files.push(FileMeta::of(path, &m));
        }
        if let Some(p) = previous.filter(|p| p.files == files) {
            return Ok(p.clone());
        }
        use std::hash::Hasher;
        let mut h = std::hash::DefaultHasher::new();
        let mut files = Vec::with_capacity(paths.len());
        let mut len = 0u64;
        for path in &paths {
            let (m, digest) = files::digest(path).map_err(|e| why(path, e))?;
            h.write(
                path.strip_prefix(folder)
                    .unwrap_or(path)
                    .as_os_str()
                    .as_encoded_bytes(),
            );
            h.write_u64(digest);
            len += m.len();
            files.push(FileMeta::of(path, &m));
        }
        Ok(FileStamp {
            len,
            digest: h.finish(),
            files,
        })
    }

    /// Whether some file's metadata differs from `other`'s (content equal
    /// or not): a reason to try again a load that failed.
    pub fn touched_since(&self, other: &FileStamp) -> bool {
        self.files != other.files
    }
}

/// The regular files under `dir` but `model` and the settings files, by
/// path, skipping hidden entries (see [`FileStamp`]); at most [`MAX_FILES`].
fn folder_files(dir: &Path, depth: usize, model: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .collect();
    found.sort();
    for path in found {
        if out.len() >= MAX_FILES {
            return;
        }
        let Ok(own) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if own.is_dir() {
            // A symlinked folder is not entered: a link loop cannot trap the walk.
            if depth < MAX_DEPTH {
                folder_files(&path, depth + 1, model, out);
            }
            continue;
        }
        // The settings (either layout's) are compared as parsed settings:
        // a batching-only edit applies in place.
        let settings = depth == 0
            && path
                .file_name()
                .is_some_and(|n| n == super::scan::SETTINGS_FILE || n == crate::triton::CONFIG_FILE);
        let regular = std::fs::metadata(&path).is_ok_and(|m| m.is_file());
        if regular && !settings && path != model {
            out.push(path);
        }
    }
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

/// The folder as seen now; `previous`: the ONNX file's last stamp.
/// Blocking (reads the file when its metadata changed).
pub fn stamp_of(md: &super::scan::ModelDir, previous: Option<&FileStamp>) -> Stamp {
    let file = match &md.settings {
        // A pipeline without an ONNX file of its own stamps its settings
        // file first (its other files, a tokenizer.json, follow).
        Ok(s) if super::pipeline::without_file(s) => {
            let settings_file = [super::scan::SETTINGS_FILE, crate::triton::CONFIG_FILE]
                .map(|f| md.dir.join(f))
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| md.dir.join(super::scan::SETTINGS_FILE));
            FileStamp::of(&settings_file, &md.dir, previous)
        }
        Ok(s) => FileStamp::of(&md.dir.join(&s.uri), &md.dir, previous),
        Err(_) => Err(String::new()),
    };
    Stamp {
        settings: md.settings.clone(),
        file,
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
                files: Vec::new(),
            }),
        }
    }

    #[test]
    fn a_file_rewritten_with_the_same_bytes_is_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"weights v1").unwrap();
        let of = |previous: Option<&FileStamp>| FileStamp::of(&path, dir.path(), previous).unwrap();
        let first = of(None);
        // Replace by rename with identical bytes: new inode, same content.
        std::fs::write(dir.path().join(".tmp"), b"weights v1").unwrap();
        std::fs::rename(dir.path().join(".tmp"), &path).unwrap();
        let renamed = of(Some(&first));
        assert_eq!(renamed, first);
        assert!(renamed.touched_since(&first), "a new inode is a touch");
        std::fs::write(&path, b"weights v2").unwrap();
        assert_ne!(of(Some(&first)), first);
    }

    #[test]
    fn every_file_of_the_folder_is_the_model_but_its_settings_and_hidden_ones() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"graph").unwrap();
        std::fs::write(dir.path().join("weights.bin"), b"weights v1").unwrap();
        std::fs::write(dir.path().join("model-settings.json"), b"{}").unwrap();
        let of = |previous: Option<&FileStamp>| FileStamp::of(&path, dir.path(), previous);
        let first = of(None).unwrap();
        assert_eq!(first.len, 15);
        // New external data beside the same graph: a new model.
        std::fs::write(dir.path().join("weights.bin"), b"weights v2").unwrap();
        let second = of(Some(&first)).unwrap();
        assert_ne!(second, first);
        // Settings and an editor's swap file are not the model's content.
        std::fs::write(dir.path().join("model-settings.json"), b"{\"max_batch_size\": 4}").unwrap();
        std::fs::write(dir.path().join(".weights.bin.swp"), b"x").unwrap();
        assert_eq!(of(Some(&second)).unwrap(), second);
        // A file that cannot be read is named; once readable, the same
        // content is the same stamp, touched.
        let weights = dir.path().join("weights.bin");
        std::fs::set_permissions(&weights, std::fs::Permissions::from_mode(0o000)).unwrap();
        let unreadable = of(Some(&second));
        std::fs::set_permissions(&weights, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Root reads a file of mode 000: only check the message when refused.
        if let Err(e) = unreadable {
            assert!(e.contains("weights.bin"), "{e}");
        }
        let back = of(Some(&second)).unwrap();
        assert_eq!(back, second);
        assert!(back.touched_since(&second));
        // External data that goes missing is a file the model lacks.
        std::fs::rename(&weights, dir.path().join(".gone")).unwrap();
        assert_ne!(of(Some(&second)).unwrap(), second);
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
