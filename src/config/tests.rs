//! The configuration's loading, layering and checks.

use super::*;
use figment::Jail;

#[test]
fn layers_file_then_env_then_cli() {
    Jail::expect_with(|jail| {
        jail.create_dir("config")?;
        jail.create_file(
            "config/sluice.toml",
            "[http]\nport = 9000\n[model_defaults]\nmax_batch_size = 8\n",
        )?;
        let cfg = Config::load(None, &CliOverrides::default()).unwrap();
        assert_eq!(cfg.http.port, 9000);
        assert_eq!(cfg.model_defaults.max_batch_size, 8);

        jail.set_env("SLUICE_HTTP__PORT", "9100");
        jail.set_env("SLUICE_MODEL_MAX_BATCH_SIZE", "16");
        jail.set_env("SLUICE_MODEL_MAX_BATCH_TIME", "0.25");
        let cfg = Config::load(None, &CliOverrides::default()).unwrap();
        assert_eq!(cfg.http.port, 9100);
        assert_eq!(cfg.model_defaults.max_batch_size, 16);
        assert_eq!(cfg.model_defaults().max_batch_time, Duration::from_millis(250));

        let cli = CliOverrides {
            http_port: Some(0),
            ..Default::default()
        };
        assert_eq!(Config::load(None, &cli).unwrap().http.port, 0);
        Ok(())
    });
}

#[test]
fn unknown_key_is_named() {
    Jail::expect_with(|jail| {
        jail.create_file("x.toml", "[http]\nprot = 1\n")?;
        let err = Config::load(Some(Path::new("x.toml")), &CliOverrides::default()).unwrap_err();
        assert!(err.contains("prot"), "{err}");
        Ok(())
    });
}

#[test]
fn missing_explicit_file_is_an_error() {
    let err = Config::load(
        Some(Path::new("/nonexistent/sluice.toml")),
        &CliOverrides::default(),
    );
    assert!(err.unwrap_err().contains("does not exist"));
}

#[test]
fn validate_collects_every_problem() {
    let mut cfg = Config::default();
    cfg.model_defaults.max_batch_time = -1.0;
    cfg.model_defaults.instances = 0;
    let errs = cfg.validate().unwrap_err();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].contains("max_batch_time") && errs[1].contains("instances"));
    assert!(Config::default().validate().is_ok());
}

#[test]
fn http_worker_threads_is_bounded_and_named() {
    let mut cfg = Config::default();
    cfg.http.worker_threads = 5000;
    let errs = cfg.validate().unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("http.worker_threads") && errs[0].contains("5000"),
        "{errs:?}"
    );
    cfg.http.worker_threads = 1;
    assert!(cfg.validate().is_ok());
}

#[test]
fn a_float_in_exponent_form_is_read_from_the_environment() {
    Jail::expect_with(|jail| {
        jail.set_env("SLUICE_HTTP__BODY_READ_TIMEOUT_SECONDS", "1e1");
        jail.set_env("SLUICE_SHUTDOWN__GRACE_PERIOD_SECONDS", "2.5E-1");
        let cfg = Config::load(None, &CliOverrides::default()).map_err(|e| e.to_string())?;
        assert_eq!(cfg.http.body_read_timeout_seconds, 10.0);
        assert_eq!(cfg.shutdown.grace_period_seconds, 0.25);
        Ok(())
    });
}

#[test]
fn kubernetes_service_links_are_not_configuration_and_a_misspelt_key_still_is() {
    Jail::expect_with(|jail| {
        // What Kubernetes writes for a Service named `sluice` (service.yaml's ports).
        let links = [
            ("SLUICE_SERVICE_HOST", "10.96.0.12"),
            ("SLUICE_SERVICE_PORT", "8080"),
            ("SLUICE_SERVICE_PORT_HTTP", "8080"),
            ("SLUICE_SERVICE_PORT_GRPC", "8081"),
            ("SLUICE_PORT", "tcp://10.96.0.12:8080"),
            ("SLUICE_PORT_8080_TCP", "tcp://10.96.0.12:8080"),
            ("SLUICE_PORT_8080_TCP_PROTO", "tcp"),
            ("SLUICE_PORT_8080_TCP_PORT", "8080"),
            ("SLUICE_PORT_8080_TCP_ADDR", "10.96.0.12"),
            ("SLUICE_BIN", "/usr/local/bin/sluice"),
        ];
        for (k, v) in links {
            jail.set_env(k, v);
        }
        jail.set_env("SLUICE_HTTP__PORT", "9100");
        jail.set_env("SLUICE_MODEL_MAX_BATCH_SIZE", "16");
        let cfg = Config::load(None, &CliOverrides::default()).map_err(|e| e.to_string())?;
        assert_eq!(cfg.http.port, 9100);
        assert_eq!(cfg.model_defaults.max_batch_size, 16);
        let ignored = ignored_env(std::env::vars().map(|(k, _)| k));
        let mut expected: Vec<String> = links.iter().map(|(k, _)| k.to_string()).collect();
        expected.sort();
        assert_eq!(ignored, expected);
        // A key in a section that does not exist is still refused, naming it.
        jail.set_env("SLUICE_HTTP__PROT", "9000");
        let err = Config::load(None, &CliOverrides::default()).unwrap_err();
        assert!(err.contains("prot"), "{err}");
        Ok(())
    });
}

#[test]
fn message_sizes_are_bounded_above_and_named() {
    let mut cfg = Config::default();
    cfg.http.max_body_bytes = usize::MAX;
    cfg.grpc.max_message_bytes = MAX_MESSAGE_BYTES + 1;
    let errs = cfg.validate().unwrap_err();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("http.max_body_bytes must be 1024..=4294967296 (4 GiB)"),
        "{errs:?}"
    );
    assert!(
        errs[1].contains("grpc.max_message_bytes must be 1024..="),
        "{errs:?}"
    );
    cfg.http.max_body_bytes = MAX_MESSAGE_BYTES;
    cfg.grpc.max_message_bytes = MAX_MESSAGE_BYTES;
    assert!(cfg.validate().is_ok());
}

#[test]
fn shipped_config_file_documents_every_key_with_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sluice.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let parsed: Config = Figment::new().merge(Toml::string(&text)).extract().unwrap();
    assert_eq!(
        parsed,
        Config::default(),
        "config/sluice.toml must hold the built-in defaults"
    );
    let defaults = serde_json::to_value(Config::default()).unwrap();
    for (section, keys) in defaults.as_object().unwrap() {
        assert!(
            text.contains(&format!("[{section}]")),
            "section [{section}] missing"
        );
        for key in keys.as_object().unwrap().keys() {
            assert!(
                text.contains(&format!("{key} =")),
                "key {section}.{key} is not documented"
            );
        }
    }
}

#[test]
fn missing_default_file_is_fine() {
    Jail::expect_with(|_jail| {
        let cfg = Config::load(None, &CliOverrides::default()).unwrap();
        assert_eq!(cfg, Config::default());
        Ok(())
    });
}
