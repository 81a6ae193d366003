//! Finding model folders in the repository and reading their settings.

use std::path::{Path, PathBuf};

use crate::settings::{ModelDefaults, ModelSettings, DEFAULT_URI};

/// The settings file every model folder holds.
pub const SETTINGS_FILE: &str = "model-settings.json";

/// A model folder found by [`scan`].
pub struct ModelDir {
    /// The folder's name (the default model name).
    pub folder: String,
    pub dir: PathBuf,
    /// Parsed settings, or why they are unusable (the message names the file).
    pub settings: Result<ModelSettings, String>,
}

impl ModelDir {
    /// The model's name: from its settings, else the folder name.
    pub fn name(&self) -> &str {
        self.settings
            .as_ref()
            .map(|s| s.name.as_str())
            .unwrap_or(&self.folder)
    }
}

/// Where a repository's models are: one sub-folder per model, or (with a
/// model name, as KServe's storage initializer writes `/mnt/models`) the
/// root folder itself is the one model's folder.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    pub root: &'a Path,
    /// `--model-name`: the root is the folder of this one model.
    pub model_name: Option<&'a str>,
    pub defaults: &'a ModelDefaults,
    /// Model configurations given with a model-control `load` (Triton's
    /// `config` parameter), by folder: they stand in for the folder's own.
    pub overrides: &'a Overrides,
}

/// Configuration overrides by folder name (see [`Layout::overrides`]).
pub type Overrides = std::collections::BTreeMap<String, crate::protocol::grpc::inference::ModelConfig>;

/// Reads and validates the model folder `dir` of the repository `root`
/// (`folder`: the model's name when its settings give none):
/// its `model-settings.json`, or default settings when it has none but holds
/// exactly one `*.onnx` file. `Ok(None)`: the folder holds neither (it is not
/// a model folder). Without `parameters.uri`, the file is `model.onnx`, else
/// the folder's only `*.onnx`. An absolute `parameters.uri` must lead inside
/// `root`. Messages name the file.
pub fn read_folder(
    root: &Path,
    dir: &Path,
    folder: &str,
    defaults: &ModelDefaults,
) -> Result<Option<ModelSettings>, String> {
    let file = dir.join(SETTINGS_FILE);
    let triton = crate::triton::is_model_folder(dir);
    if triton && file.exists() {
        if first_time(dir, "both layouts") {
            tracing::warn!(folder = %dir.display(), "the folder holds both {SETTINGS_FILE} and Triton's {}; {SETTINGS_FILE} is used", crate::triton::CONFIG_FILE);
        }
    } else if triton {
        return crate::triton::read_folder(dir, folder, defaults).map(Some);
    }
    let onnx = onnx_files(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let sentence = super::sentence::is_folder(dir);
    // A sentence-transformers folder may keep its file at `onnx/model.onnx`.
    let nested = (sentence && onnx.is_empty())
        .then(|| super::sentence::default_uri(dir))
        .flatten();
    let default_uri = match (onnx.as_slice(), &nested) {
        ([], Some(file)) => file.clone(),
        ([only], _) if only != DEFAULT_URI => PathBuf::from(only),
        _ => PathBuf::from(DEFAULT_URI),
    };
    // NotFound is "no settings file"; any other error (unreadable, not a
    // regular file, too large) is an error, so that a serving model keeps
    // its last good version instead of counting as removed.
    let text = match super::files::read_settings(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match onnx.as_slice() {
            [] if nested.is_some() => "{}".to_string(),
            [] => return Ok(None),
            [_] => "{}".to_string(),
            many => {
                return Err(format!(
                    "{}: no {SETTINGS_FILE} and {} ONNX files (`{}`): add a {SETTINGS_FILE} whose `parameters.uri` names the model file",
                    dir.display(),
                    many.len(),
                    many.join("`, `")
                ))
            }
        },
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    let mut settings = ModelSettings::parse_with_uri(&text, folder, defaults, &default_uri)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    if sentence {
        super::sentence::apply(dir, &mut settings)?;
    }
    if settings.uri.is_absolute() {
        check_inside(root, &settings.uri).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(Some(settings))
}

/// An absolute `parameters.uri` is allowed where it leads (symlinks followed)
/// inside the repository, as ModelMesh's MLServer adapter writes it.
fn check_inside(root: &Path, uri: &Path) -> Result<(), String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("model repository {}: {e}", root.display()))?;
    // The folder must exist; the file may be missing (loading then says so).
    let parent = uri.parent().unwrap_or(uri);
    let inside = match parent.canonicalize() {
        Ok(real) => real.starts_with(&root),
        Err(_) => uri.starts_with(&root),
    };
    match inside {
        true => Ok(()),
        false => Err(format!(
            "`parameters.uri` {:?} is outside the model repository {}; an absolute uri must lead inside it",
            uri.display().to_string(),
            root.display()
        )),
    }
}

/// The names of the `*.onnx` entries directly in `dir` that are not
/// folders or dangling links, sorted. One that is not a regular file (a
/// FIFO) is listed: stamping it refuses it with a reason that names it.
fn onnx_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".onnx") || name.starts_with('.') {
            continue;
        }
        let listed = match std::fs::metadata(entry.path()) {
            Ok(m) => !m.is_dir(),
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        };
        if listed {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Why the entry `dir` of the repository `root` must not be served: it
/// leads, through a symlink, outside the repository (or to the repository
/// itself). `None` when its real path is inside, or when it does not exist.
/// Only the folder is checked: files inside a model folder may be symlinks
/// to anywhere (a ConfigMap's are; an operator may share one ONNX file).
pub fn outside_repository(root: &Path, dir: &Path) -> Option<String> {
    let real = dir.canonicalize().ok()?;
    let root = root.canonicalize().ok()?;
    if real.starts_with(&root) && real != root {
        return None;
    }
    let folder = dir.file_name().unwrap_or_default().to_string_lossy();
    tracing::warn!(
        folder = %dir.display(), target = %real.display(), repository = %root.display(),
        "model folder leads outside the model repository; refused"
    );
    Some(format!(
        "model folder `{folder}` is a symlink that leads outside the model repository; refused"
    ))
}

/// Lists the models of the repository, sorted by folder name. Each
/// sub-folder holding a `model-settings.json` or exactly one `*.onnx` is a
/// model; hidden folders (a ConfigMap's `..data`) and symlinks that lead
/// outside the root are skipped. With `model_name`, the root is the one model.
/// A folder that cannot be read is listed with the error as its settings
/// (it stays, so what serves from it keeps serving); a root that cannot be
/// listed is an error (nothing is removed). Blocking.
pub fn scan(layout: &Layout) -> Result<Vec<ModelDir>, String> {
    let root = layout.root;
    if let Some(name) = layout.model_name {
        return Ok(vec![single(layout, name)]);
    }
    let listing = |e: std::io::Error| format!("model repository {}: {e}", root.display());
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(root).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let dir = entry.path();
        let folder = entry.file_name().to_string_lossy().into_owned();
        if folder.starts_with('.') {
            continue;
        }
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            // A file, or a dangling symlink: not a model folder.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                let settings = Err(format!("{}: {e}", dir.display()));
                dirs.push(ModelDir {
                    folder,
                    dir,
                    settings,
                });
                continue;
            }
        }
        if outside_repository(root, &dir).is_some() {
            continue;
        }
        if let Some(versions) = triton_versions(&dir, &folder, layout) {
            dirs.extend(versions);
            continue;
        }
        let read = match layout.overrides.get(&folder) {
            Some(config) => overridden(root, &dir, &folder, config, layout.defaults).map(Some),
            None => read_folder(root, &dir, &folder, layout.defaults),
        };
        let settings = match read {
            Ok(None) => {
                not_a_model(&dir);
                continue;
            }
            Ok(Some(s)) => Ok(s),
            Err(e) => Err(e),
        };
        dirs.push(ModelDir {
            folder,
            dir,
            settings,
        });
    }
    dirs.sort_by(|a, b| a.folder.cmp(&b.folder));
    Ok(dirs)
}

/// A Triton model folder (and no `model-settings.json`, which wins): one
/// [`ModelDir`] for the version that serves, keyed by the folder; or, when
/// its `version_policy` may select several, one per selected version, keyed
/// `<folder>@<version>`. `None`: not a Triton folder.
fn triton_versions(dir: &Path, folder: &str, layout: &Layout) -> Option<Vec<ModelDir>> {
    if !crate::triton::is_model_folder(dir) || dir.join(SETTINGS_FILE).exists() {
        return None;
    }
    let read = match layout.overrides.get(folder) {
        Some(config) => crate::triton::versions_for(dir, folder, config, layout.defaults),
        None => crate::triton::read_versions(dir, folder, layout.defaults),
    };
    let one = |folder: String, settings| ModelDir {
        folder,
        dir: dir.to_path_buf(),
        settings,
    };
    Some(match read {
        Err(e) => vec![one(folder.to_string(), Err(e))],
        Ok(v) if !v.several => vec![one(folder.to_string(), Ok(v.highest()))],
        Ok(v) => v
            .settings
            .into_iter()
            .map(|s| {
                let key = version_key(folder, s.version.as_deref().unwrap_or_default());
                one(key, Ok(s))
            })
            .collect(),
    })
}

/// The key of one version of a folder whose versions serve side by side.
pub fn version_key(folder: &str, version: &str) -> String {
    format!("{folder}@{version}")
}

/// The folder of a key made by [`version_key`] (a folder's own key is itself).
pub fn folder_of(key: &str) -> &str {
    key.split_once('@').map_or(key, |(folder, _)| folder)
}

/// The settings of folder `dir` under a configuration given with a load: a
/// Triton folder's version folders are read as usual; a `model-settings.json`
/// folder keeps its model file.
fn overridden(
    root: &Path,
    dir: &Path,
    folder: &str,
    config: &crate::protocol::grpc::inference::ModelConfig,
    defaults: &ModelDefaults,
) -> Result<ModelSettings, String> {
    if crate::triton::is_model_folder(dir) {
        return crate::triton::settings_for(dir, folder, config, defaults);
    }
    let on_disk = read_folder(root, dir, folder, defaults)?
        .ok_or_else(|| format!("{}: not a model folder", dir.display()))?;
    let version = on_disk.version.clone().unwrap_or_else(|| "1".into());
    crate::triton::mapping::settings(config, &on_disk.name, &version, &on_disk.uri, defaults)
}

/// Whether `what` is said of folder `dir` for the first time in this
/// process: a rescan runs on every change anywhere in the repository, and a
/// folder's standing note would otherwise be logged each time.
fn first_time(dir: &Path, what: &'static str) -> bool {
    static SAID: std::sync::Mutex<std::collections::BTreeSet<(PathBuf, &'static str)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    SAID.lock()
        .map(|mut n| n.insert((dir.to_path_buf(), what)))
        .unwrap_or(false)
}

/// Names, once per folder and process, a folder of the repository that is
/// not a model folder, with why.
fn not_a_model(dir: &Path) {
    if first_time(dir, "not a model") {
        tracing::info!(
            folder = %dir.display(),
            "not a model folder, skipped: it holds no {SETTINGS_FILE}, no {}, no numbered version folder with a {} and no *.onnx file",
            crate::triton::CONFIG_FILE, crate::triton::DEFAULT_MODEL_FILENAME
        );
    }
}

/// The root as the folder of the one model `name` (its settings' `name`, if
/// any, gives way: KServe routes requests by the InferenceService's name).
fn single(layout: &Layout, name: &str) -> ModelDir {
    let root = layout.root;
    let settings = match read_folder(root, root, name, layout.defaults) {
        Ok(Some(mut s)) => {
            if s.name != name && root.join(SETTINGS_FILE).is_file() {
                tracing::warn!(model = %name, settings_name = %s.name, "--model-name overrides the `name` of {SETTINGS_FILE}");
            }
            s.name = name.to_string();
            Ok(s)
        }
        Ok(None) => Err(format!(
            "{}: no {DEFAULT_URI}, no other *.onnx file and no {SETTINGS_FILE}: nothing to serve as model `{name}`",
            root.display()
        )),
        Err(e) => Err(e),
    };
    ModelDir {
        folder: name.to_string(),
        dir: root.to_path_buf(),
        settings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinked_folders_must_stay_inside_the_repository() {
        let repo = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let root = repo.path();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink("..", root.join("up")).unwrap();
        std::os::unix::fs::symlink(".", root.join("itself")).unwrap();
        assert_eq!(outside_repository(root, &root.join("real")), None);
        assert_eq!(outside_repository(root, &root.join("alias")), None);
        assert_eq!(outside_repository(root, &root.join("missing")), None);
        for bad in ["out", "up", "itself"] {
            let why = outside_repository(root, &root.join(bad)).expect(bad);
            assert!(why.contains(bad) && why.contains("outside"), "{why}");
        }
        // A relative root works as well as an absolute one.
        let cwd = std::env::current_dir().unwrap();
        let rel = pathdiff(root, &cwd);
        assert!(outside_repository(&rel, &rel.join("out")).is_some());
        assert_eq!(outside_repository(&rel, &rel.join("alias")), None);
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn layout<'a>(root: &'a Path, model_name: Option<&'a str>, defaults: &'a ModelDefaults) -> Layout<'a> {
        static NONE: Overrides = Overrides::new();
        Layout {
            root,
            model_name,
            defaults,
            overrides: &NONE,
        }
    }

    #[test]
    fn bare_folders_with_one_onnx_file_are_models_with_default_settings() {
        let repo = tempfile::tempdir().unwrap();
        let root = repo.path();
        write(&root.join("bare/resnet.onnx"), "x");
        write(&root.join("two/a.onnx"), "x");
        write(&root.join("two/b.onnx"), "x");
        write(&root.join("empty/README"), "x");
        write(&root.join("named/model-settings.json"), "{}");
        write(&root.join("named/weights.onnx"), "x");
        write(&root.join("both/model.onnx"), "x");
        write(&root.join("both/other.onnx"), "x");
        write(&root.join("both/model-settings.json"), r#"{"max_batch_size": 4}"#);
        let d = ModelDefaults::default();
        let dirs = scan(&layout(root, None, &d)).unwrap();
        let folders: Vec<&str> = dirs.iter().map(|m| m.folder.as_str()).collect();
        assert_eq!(folders, ["bare", "both", "named", "two"]);
        let bare = dirs[0].settings.as_ref().unwrap();
        assert_eq!(
            (bare.name.as_str(), bare.uri.as_path()),
            ("bare", Path::new("resnet.onnx"))
        );
        assert_eq!(bare.batching.max_batch_size, 32);
        let both = dirs[1].settings.as_ref().unwrap();
        assert_eq!(
            (both.uri.as_path(), both.batching.max_batch_size),
            (Path::new("model.onnx"), 4)
        );
        assert_eq!(dirs[2].settings.as_ref().unwrap().uri, Path::new("weights.onnx"));
        let two = dirs[3].settings.as_ref().unwrap_err();
        assert!(
            two.contains("2 ONNX files (`a.onnx`, `b.onnx`)") && two.contains("parameters.uri"),
            "{two}"
        );
    }

    #[test]
    fn absolute_uris_must_lead_inside_the_repository() {
        let repo = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let root = repo.path();
        let inside = root.join("shared/model.onnx");
        write(&inside, "x");
        write(&elsewhere.path().join("model.onnx"), "x");
        std::os::unix::fs::symlink(elsewhere.path(), root.join("link")).unwrap();
        let d = ModelDefaults::default();
        let settings =
            |uri: &Path| format!(r#"{{"parameters": {{"uri": {:?}}}}}"#, uri.display().to_string());
        write(&root.join("in/model-settings.json"), &settings(&inside));
        write(
            &root.join("out/model-settings.json"),
            &settings(&elsewhere.path().join("model.onnx")),
        );
        write(
            &root.join("via-link/model-settings.json"),
            &settings(&root.join("link/model.onnx")),
        );
        let dirs = scan(&layout(root, None, &d)).unwrap();
        let by = |f: &str| &dirs.iter().find(|m| m.folder == f).unwrap().settings;
        assert_eq!(by("in").as_ref().unwrap().uri, inside);
        for refused in ["out", "via-link"] {
            let e = by(refused).as_ref().unwrap_err();
            assert!(
                e.contains("is outside the model repository") && e.contains("parameters.uri"),
                "{e}"
            );
        }
    }

    #[test]
    fn with_a_model_name_the_root_is_the_one_model() {
        let repo = tempfile::tempdir().unwrap();
        let root = repo.path();
        let d = ModelDefaults::default();
        let empty = scan(&layout(root, Some("m"), &d)).unwrap();
        let e = empty[0].settings.as_ref().unwrap_err();
        assert!(e.contains("nothing to serve as model `m`"), "{e}");
        write(&root.join("model.onnx"), "x");
        let one = scan(&layout(root, Some("m"), &d)).unwrap();
        assert_eq!((one.len(), one[0].name(), one[0].dir.as_path()), (1, "m", root));
        // A settings file's `name` gives way to --model-name (KServe routes by it).
        write(
            &root.join("model-settings.json"),
            r#"{"name": "other", "max_batch_size": 8}"#,
        );
        let s = scan(&layout(root, Some("m"), &d))
            .unwrap()
            .remove(0)
            .settings
            .unwrap();
        assert_eq!((s.name.as_str(), s.batching.max_batch_size), ("m", 8));
    }

    #[test]
    fn folders_and_settings_that_cannot_be_read_are_errors_not_absences() {
        let repo = tempfile::tempdir().unwrap();
        let root = repo.path();
        let d = ModelDefaults::default();
        // The settings path is a folder; a symlink loop (ELOOP); a FIFO.
        write(&root.join("is_dir/model.onnx"), "x");
        std::fs::create_dir(root.join("is_dir/model-settings.json")).unwrap();
        write(&root.join("looped/model.onnx"), "x");
        std::os::unix::fs::symlink("model-settings.json", root.join("looped/model-settings.json")).unwrap();
        write(&root.join("fifo/model.onnx"), "x");
        let fifo = std::ffi::CString::new(
            root.join("fifo/model-settings.json")
                .into_os_string()
                .into_encoded_bytes(),
        );
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(fifo.unwrap().as_ptr(), 0o644) }, 0);
        // The model folder itself cannot be read: a symlink loop.
        std::os::unix::fs::symlink("folder_loop", root.join("folder_loop")).unwrap();
        // A dangling link is not a folder; a bare folder is still a model.
        std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();
        write(&root.join("bare/model.onnx"), "x");
        let dirs = scan(&layout(root, None, &d)).unwrap();
        let folders: Vec<&str> = dirs.iter().map(|m| m.folder.as_str()).collect();
        assert_eq!(folders, ["bare", "fifo", "folder_loop", "is_dir", "looped"]);
        assert!(dirs[0].settings.is_ok());
        for (m, why) in dirs[1..]
            .iter()
            .zip(["a FIFO", "symbolic links", "a folder", "symbolic links"])
        {
            let e = m.settings.as_ref().unwrap_err();
            assert!(e.contains(&m.folder) && e.contains(why), "{}: {e}", m.folder);
            if m.folder != "folder_loop" {
                assert!(e.contains(SETTINGS_FILE), "{e}");
            }
        }
    }

    /// `path` relative to `base` (both absolute), with `..` steps.
    fn pathdiff(path: &Path, base: &Path) -> PathBuf {
        let (p, b): (Vec<_>, Vec<_>) = (path.components().collect(), base.components().collect());
        let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
        let mut out = PathBuf::new();
        for _ in common..b.len() {
            out.push("..");
        }
        for c in &p[common..] {
            out.push(c);
        }
        out
    }
}
