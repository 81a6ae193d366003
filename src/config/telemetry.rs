//! The `[tracing]` section: OpenTelemetry traces sent over OTLP/HTTP, off
//! unless an endpoint is configured. Sluice's own keys (this file's struct,
//! from `config/sluice.toml` or `SLUICE_TRACING__*`) win where they are set;
//! the standard `OTEL_*` variables fill what they leave unset. Both are
//! resolved once, at start-up, by [`TracingConfig::resolve`]: the one place
//! that reads the `OTEL_*` variables sluice itself interprets.

use serde::{Deserialize, Serialize};

/// `[tracing]` as written. Every key is optional: unset falls back to the
/// standard OpenTelemetry variable named in its doc line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`); spans
    /// go to `<otlp_endpoint>/v1/traces`. Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// (used as is), then `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`);
    /// none of them: traces are off.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute. Unset: `OTEL_SERVICE_NAME`,
    /// then `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, then `sluice`.
    pub service_name: Option<String>,
    /// Fraction of new traces recorded (0..=1); a request that carries a
    /// `traceparent` follows its caller's decision. Unset:
    /// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default: every trace).
    pub sample_ratio: Option<f64>,
}

/// The path OTLP/HTTP receivers take traces on.
const TRACES_PATH: &str = "/v1/traces";

/// The service name when nothing names one.
pub const DEFAULT_SERVICE_NAME: &str = "sluice";

/// Where and how spans are exported, once the config and the environment
/// are resolved. `None` from [`TracingConfig::resolve`] means tracing is off.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingExport {
    /// The full URL spans are POSTed to (`.../v1/traces`).
    pub traces_url: String,
    /// `service.name`; `None`: the one in `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
    /// `Some(r)`: parent-based, ratio `r` for new traces; `None`: the SDK's
    /// reading of `OTEL_TRACES_SAMPLER` (default parent-based always-on).
    pub sample_ratio: Option<f64>,
    /// Problems with the environment that do not stop the server (log them).
    pub warnings: Vec<String>,
}

impl TracingConfig {
    /// Each problem, naming its key.
    pub fn validate(&self, errs: &mut Vec<String>) {
        if let Some(r) = self.sample_ratio {
            if !(r.is_finite() && (0.0..=1.0).contains(&r)) {
                errs.push(format!("tracing.sample_ratio must be 0..=1, got {r}"));
            }
        }
        if let Some(url) = self.otlp_endpoint.as_deref().filter(|u| !u.is_empty()) {
            if let Err(e) = check_url(url) {
                errs.push(format!("tracing.otlp_endpoint: {e}"));
            }
        }
        if self.service_name.as_deref() == Some("") {
            errs.push("tracing.service_name must not be empty (leave it unset for the default)".into());
        }
    }

    /// Whether and where traces go, from this section and the environment
    /// (`env` looks a variable up; `std::env::var` in the binary). `OTEL_SDK_DISABLED=true`
    /// or `OTEL_TRACES_EXPORTER=none` turn tracing off whatever else is set.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<TracingExport>, String> {
        let var = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let mut warnings = Vec::new();
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER")
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            Some("none") => return Ok(None),
            None | Some("otlp") => {}
            Some(other) => warnings.push(format!(
                "OTEL_TRACES_EXPORTER={other} is not supported; sluice exports traces over OTLP only"
            )),
        }
        let configured = self.otlp_endpoint.clone().filter(|u| !u.is_empty());
        let (traces_url, source) = if let Some(base) = configured {
            (traces_url(&base), "tracing.otlp_endpoint")
        } else if let Some(url) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        } else if let Some(base) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            (traces_url(&base), "OTEL_EXPORTER_OTLP_ENDPOINT")
        } else {
            return Ok(None);
        };
        check_url(&traces_url).map_err(|e| format!("{source}: {e}"))?;
        for key in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = var(key).filter(|p| p != "http/protobuf") {
                warnings.push(format!(
                    "{key}={p} is not supported; sluice sends OTLP over HTTP with protobuf bodies (http/protobuf)"
                ));
            }
        }
        let from_attributes = var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| {
            attrs.split(',').any(|kv| {
                kv.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == "service.name")
            })
        });
        let service_name = match (self.service_name.clone(), var("OTEL_SERVICE_NAME")) {
            (Some(name), _) | (None, Some(name)) => Some(name),
            (None, None) if from_attributes => None,
            (None, None) => Some(DEFAULT_SERVICE_NAME.to_string()),
        };
        Ok(Some(TracingExport {
            traces_url,
            service_name,
            sample_ratio: self.sample_ratio,
            warnings,
        }))
    }
}

/// `base` + `/v1/traces`, unless it already ends with that path.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// An absolute `http://` or `https://` URL with a host.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("`{url}` must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        return Err(format!("`{url}` is not a URL with a host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn nothing_configured_means_no_exporter() {
        assert_eq!(TracingConfig::default().resolve(env(&[])), Ok(None));
        // Variables that do not name an endpoint do not turn it on.
        let only_name = env(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_TRACES_SAMPLER", "always_on")]);
        assert_eq!(TracingConfig::default().resolve(only_name), Ok(None));
        let blank = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")]);
        assert_eq!(TracingConfig::default().resolve(blank), Ok(None));
    }

    #[test]
    fn endpoint_from_the_standard_variables() {
        let base = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]);
        let got = TracingConfig::default().resolve(base).unwrap().unwrap();
        assert_eq!(got.traces_url, "http://collector:4318/v1/traces");
        assert_eq!(got.service_name.as_deref(), Some("sluice"));
        assert_eq!(got.sample_ratio, None);
        assert!(got.warnings.is_empty());
        // The per-signal variable is used as is, and wins over the base one.
        let both = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/custom/path"),
        ]);
        let got = TracingConfig::default().resolve(both).unwrap().unwrap();
        assert_eq!(got.traces_url, "https://b/custom/path");
    }

    #[test]
    fn sluice_keys_win_over_the_environment() {
        let cfg = TracingConfig {
            otlp_endpoint: Some("http://mine:4318/v1/traces".into()),
            service_name: Some("edge-sluice".into()),
            sample_ratio: Some(0.25),
        };
        let vars = env(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://theirs:4318/v1/traces",
            ),
            ("OTEL_SERVICE_NAME", "theirs"),
        ]);
        let got = cfg.resolve(vars).unwrap().unwrap();
        assert_eq!(got.traces_url, "http://mine:4318/v1/traces");
        assert_eq!(got.service_name.as_deref(), Some("edge-sluice"));
        assert_eq!(got.sample_ratio, Some(0.25));
    }

    #[test]
    fn service_name_falls_back_in_order() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let name = |vars: &[(&str, &str)]| {
            TracingConfig::default()
                .resolve(env(vars))
                .unwrap()
                .unwrap()
                .service_name
        };
        assert_eq!(name(&[on, ("OTEL_SERVICE_NAME", "svc")]).as_deref(), Some("svc"));
        // Left to the SDK, which reads it from the resource attributes.
        assert_eq!(
            name(&[on, ("OTEL_RESOURCE_ATTRIBUTES", "team=a, service.name=r")]),
            None
        );
        assert_eq!(
            name(&[on, ("OTEL_RESOURCE_ATTRIBUTES", "team=a")]).as_deref(),
            Some("sluice")
        );
    }

    #[test]
    fn the_environment_can_switch_it_off() {
        let cfg = TracingConfig {
            otlp_endpoint: Some("http://mine:4318".into()),
            ..Default::default()
        };
        assert_eq!(cfg.resolve(env(&[("OTEL_SDK_DISABLED", "TRUE")])), Ok(None));
        assert_eq!(cfg.resolve(env(&[("OTEL_TRACES_EXPORTER", "none")])), Ok(None));
        assert!(cfg
            .resolve(env(&[("OTEL_SDK_DISABLED", "false")]))
            .unwrap()
            .is_some());
    }

    #[test]
    fn unsupported_environment_is_a_warning_and_a_bad_url_an_error() {
        let vars = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
        ]);
        let got = TracingConfig::default().resolve(vars).unwrap().unwrap();
        assert_eq!(got.warnings.len(), 2, "{:?}", got.warnings);
        assert!(got
            .warnings
            .iter()
            .any(|w| w.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc")));
        let bad = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]);
        let err = TracingConfig::default().resolve(bad).unwrap_err();
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.contains("http://"),
            "{err}"
        );
    }

    #[test]
    fn validate_names_each_bad_key() {
        let cfg = TracingConfig {
            otlp_endpoint: Some("localhost:4318".into()),
            service_name: Some(String::new()),
            sample_ratio: Some(1.5),
        };
        let mut errs = Vec::new();
        cfg.validate(&mut errs);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].contains("tracing.sample_ratio") && errs[0].contains("1.5"));
        assert!(errs[1].contains("tracing.otlp_endpoint"));
        assert!(errs[2].contains("tracing.service_name"));
        let mut none = Vec::new();
        TracingConfig::default().validate(&mut none);
        assert!(none.is_empty());
    }
}
