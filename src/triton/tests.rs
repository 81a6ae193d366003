use super::*;

fn folder(versions: &[&str], config: Option<&str>) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for v in versions {
        std::fs::create_dir_all(d.path().join(v)).unwrap();
        std::fs::write(d.path().join(v).join("model.onnx"), b"x").unwrap();
    }
    if let Some(c) = config {
        std::fs::write(d.path().join(CONFIG_FILE), c).unwrap();
    }
    d
}

fn served(versions: &[&str], config: &str) -> Result<String, String> {
    let d = folder(versions, Some(config));
    read_folder(d.path(), "m", &ModelDefaults::default()).map(|s| s.uri.display().to_string())
}

#[test]
fn the_version_policy_picks_the_version_that_serves() {
    let all = ["1", "2", "10"];
    // Default and `latest`: the highest number (10 > 2, not the string order).
    assert_eq!(served(&all, "").unwrap(), "10/model.onnx");
    assert_eq!(
        served(&all, "version_policy: { latest { num_versions: 1 } }").unwrap(),
        "10/model.onnx"
    );
    assert_eq!(
        served(&all, "version_policy: { specific { versions: [1, 2] } }").unwrap(),
        "2/model.onnx"
    );
    assert_eq!(
        served(&all, "version_policy: { all { } }").unwrap(),
        "10/model.onnx"
    );
    // Folders that are not versions, and versions without the file, are skipped.
    assert_eq!(served(&["1", "01", "0", "x", "+3"], "").unwrap(), "1/model.onnx");
    let e = served(&["1"], "version_policy: { specific { versions: [3] } }").unwrap_err();
    assert!(e.contains("selects none of the versions on disk (1)"), "{e}");
    let e = served(&[], "").unwrap_err();
    assert!(e.contains("put the model at `1/model.onnx`"), "{e}");
    let e = served(&["1"], "version_policy: { latest { num_versions: 0 } }").unwrap_err();
    assert!(e.contains("num_versions"), "{e}");
}

#[test]
fn a_policy_that_may_select_several_versions_gives_each_its_settings() {
    let d = folder(
        &["1", "2", "3"],
        Some("version_policy: { specific { versions: [1, 3] } }"),
    );
    let v = read_versions(d.path(), "m", &ModelDefaults::default()).unwrap();
    assert!(v.several);
    let got: Vec<(Option<&str>, String)> = v
        .settings
        .iter()
        .map(|s| (s.version.as_deref(), s.uri.display().to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (Some("1"), "1/model.onnx".into()),
            (Some("3"), "3/model.onnx".into())
        ]
    );
    // `latest` with one version (Triton's default) serves one, replaced in place.
    for config in ["", "version_policy: { latest { num_versions: 1 } }"] {
        let d = folder(&["1", "2"], Some(config));
        let v = read_versions(d.path(), "m", &ModelDefaults::default()).unwrap();
        assert!(!v.several, "{config}");
        assert_eq!(v.settings.len(), 1, "{config}");
    }
    let d = folder(
        &["1", "2", "3"],
        Some("version_policy: { latest { num_versions: 2 } }"),
    );
    let v = read_versions(d.path(), "m", &ModelDefaults::default()).unwrap();
    assert!(v.several);
    assert_eq!(v.settings.len(), 2);
}

#[test]
fn default_model_filename_and_detection() {
    let d = tempfile::tempdir().unwrap();
    assert!(!is_model_folder(d.path()));
    std::fs::create_dir_all(d.path().join("3")).unwrap();
    std::fs::write(d.path().join("3/net.onnx"), b"x").unwrap();
    assert!(!is_model_folder(d.path()), "no model.onnx and no config.pbtxt");
    std::fs::write(d.path().join(CONFIG_FILE), "default_model_filename: \"net.onnx\"").unwrap();
    assert!(is_model_folder(d.path()));
    let s = read_folder(d.path(), "m", &ModelDefaults::default()).unwrap();
    assert_eq!(s.uri, std::path::Path::new("3/net.onnx"));
    assert!(s.triton_config.is_some());
}

#[test]
fn a_bad_config_names_the_file_and_the_line() {
    let e = served(&["1"], "max_batch_size: 8\nplatform: \"tensorflow_graphdef\"").unwrap_err();
    assert!(
        e.contains("config.pbtxt: `platform` is \"tensorflow_graphdef\""),
        "{e}"
    );
    let e = served(&["1"], "max_batch_size 8 }").unwrap_err();
    assert!(e.contains("config.pbtxt: line 1, column "), "{e}");
}
