//! Which `SLUICE_*` environment variables are configuration.

/// The `SLUICE_*` environment variables that cannot be configuration and
/// are left alone: every configuration key is in a section
/// (`SLUICE_HTTP__PORT`), so one without a double underscore (other than
/// the MLServer-style `SLUICE_MODEL_MAX_BATCH_SIZE` / `_TIME`) belongs to
/// someone else. Kubernetes writes `SLUICE_SERVICE_HOST`,
/// `SLUICE_SERVICE_PORT*` and `SLUICE_PORT*` into every pod of a namespace
/// with a Service named `sluice`; a test harness may export `SLUICE_BIN`.
/// A misspelt key in a section (`SLUICE_HTTP__PROT`) is still refused.
pub fn ignored_env(vars: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut ignored: Vec<String> = vars
        .into_iter()
        .filter(|k| {
            k.len() > "SLUICE_".len()
                && k.get(.."SLUICE_".len())
                    .is_some_and(|p| p.eq_ignore_ascii_case("SLUICE_"))
                && !k.contains("__")
                && !matches!(
                    k.to_ascii_uppercase().as_str(),
                    "SLUICE_MODEL_MAX_BATCH_SIZE" | "SLUICE_MODEL_MAX_BATCH_TIME"
                )
        })
        .collect();
    ignored.sort();
    ignored
}
