//! The layering that `src/lib.rs` documents is true: no module imports a
//! module above it. Reads every source file under `src/` and checks each
//! `crate::X` path (outside comments) against the layer table below.

use std::path::{Path, PathBuf};

/// Top-level modules by layer, bottom (0) to top. A module may use its own
/// layer's and lower layers' modules only. Same-layer modules must not use
/// each other (checked below), except where listed in `SAME_LAYER_OK`.
const LAYERS: &[&[&str]] = &[
    &["error", "watch"],
    &["tensor"],
    &["protocol", "settings"],
    // Triton's model configuration, mapped onto settings.
    &["triton"],
    &["config"],
    &[
        "metrics",
        "budget",
        "access",
        "shutdown",
        "tls",
        "telemetry",
        "shm",
        "inference_log",
    ],
    // Both ports' connections (HTTP and gRPC plug their services in).
    &["transport"],
    &["runtime"],
    &["pool"],
    &["batcher"],
    &["model"],
    &["repository"],
    &["http", "grpc"],
    // `lib.rs` (the `Server` wiring) and the fuzz entry points sit on top.
    &["lib", "fuzz"],
];

/// Same-layer uses that are allowed (user, used).
const SAME_LAYER_OK: &[(&str, &str)] = &[
    ("access", "config"),
    ("budget", "config"),
    // The certificate reload counts its results (`sluice_tls_reloads_total`).
    ("tls", "metrics"),
    // A shared-memory input's bytes are reserved before they are copied.
    ("shm", "budget"),
    // The inference log holds its events' bytes in the budget and counts them.
    ("inference_log", "budget"),
    ("inference_log", "metrics"),
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`None`: the binary).
fn owner(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("main") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first),
    }
}

/// Every `crate::name` in the file's code (line comments and doc comments skipped).
fn crate_uses(text: &str) -> Vec<(usize, String)> {
    let mut uses = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `$crate::` in macros and `sluice_crate::`-like identifiers are not ours.
            let before = rest[..i].chars().last();
            if !name.is_empty()
                && !matches!(before, Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '$')
            {
                uses.push((n + 1, name));
            }
            rest = tail;
        }
    }
    uses
}

#[test]
fn no_module_imports_a_module_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let Some(user) = owner(&src, file) else { continue };
        let Some(user_layer) = layer(&user) else {
            problems.push(format!(
                "{}: module `{user}` is not in tests/layering.rs's LAYERS: add it",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, used) in crate_uses(&text) {
            if used == user {
                continue;
            }
            let Some(used_layer) = layer(&used) else {
                problems.push(format!(
                    "{}:{line}: `crate::{used}` is not in LAYERS: add it",
                    file.display()
                ));
                continue;
            };
            let same_ok = SAME_LAYER_OK.contains(&(user.as_str(), used.as_str()));
            if used_layer > user_layer || (used_layer == user_layer && !same_ok) {
                problems.push(format!(
                    "{}:{line}: `{user}` (layer {user_layer}) uses `crate::{used}` (layer {used_layer}): imports must run down the layers",
                    file.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering violations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_an_upward_import() {
    // The checker itself: a `use` of a higher layer is found, comments are not.
    let text = "use crate::model::ModelHandle;\n// crate::http in a comment\nlet x = $crate::y;";
    let uses = crate_uses(text);
    assert_eq!(uses, vec![(1, "model".to_string())]);
    assert!(layer("model") > layer("batcher"));
}

/// The repository's parts that the task uses (its registry, lifecycle,
/// residency planner, scan and load steps) use each other, never the task
/// in `repository/mod.rs` or the files that extend it (`api.rs`,
/// `effects.rs`, `resident.rs`): `super::x` names a sibling module only.
#[test]
fn the_repository_parts_do_not_reach_up_into_its_task() {
    const PARTS: &[&str] = &[
        "diff",
        "files",
        "lifecycle",
        "load",
        "pipeline",
        "registry",
        "residency",
        "scan",
        "sentence",
        "warm",
        "watcher",
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/repository");
    let mut problems = Vec::new();
    for part in PARTS {
        let file = dir.join(format!("{part}.rs"));
        let text = std::fs::read_to_string(&file).unwrap();
        // A part's own unit tests (`mod tests { use super::*; }`) are its own.
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("super::") {
                let name: String = code[i + "super::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !PARTS.contains(&name.as_str()) {
                    problems.push(format!(
                        "{}:{}: `super::{name}` reaches into the repository task",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
