//! The hand-written walk over a `model-settings.json` value: small typed
//! checkers that record a problem (named by its field path) instead of
//! stopping at the first, and the helpers for their messages.

use serde_json::{Map, Value};

use super::*;

pub(super) fn lookup<T: Copy>(options: &[(&str, T)], s: &str) -> Option<T> {
    options.iter().find(|(name, _)| *name == s).map(|(_, t)| *t)
}

/// A field's value, with `null` counting as absent.
pub(super) fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A value as JSON text for messages, cut short when long.
pub(super) fn describe(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// Levenshtein distance, for did-you-mean suggestions.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Walks the JSON value, collecting every problem. Each checker returns `None` on a problem.
#[derive(Default)]
pub(super) struct Walker {
    pub(super) problems: Vec<String>,
}

impl Walker {
    pub(super) fn push<T>(&mut self, problem: String) -> Option<T> {
        self.problems.push(problem);
        None
    }

    pub(super) fn bad<T>(&mut self, path: &str, expected: &str, got: &Value) -> Option<T> {
        self.push(format!("`{path}` must be {expected}, got {}", describe(got)))
    }

    /// `v` as an object whose keys are all in `known`; `prefix` is its path plus `.` (or empty).
    pub(super) fn object<'a>(
        &mut self,
        v: &'a Value,
        prefix: &str,
        known: &str,
    ) -> Option<&'a Map<String, Value>> {
        let Some(obj) = v.as_object() else {
            // The caller reports a top level that is not an object itself.
            return if prefix.is_empty() {
                None
            } else {
                self.bad(prefix.trim_end_matches('.'), "an object", v)
            };
        };
        let fields = || known.split_whitespace();
        for key in obj.keys().filter(|k| !fields().any(|f| f == k.as_str())) {
            let hint = match fields().map(|f| (edit_distance(key, f), f)).min() {
                Some((..=2, f)) => format!("did you mean `{prefix}{f}`?"),
                _ => format!("known fields: `{}`", fields().collect::<Vec<_>>().join("`, `")),
            };
            let problem = format!("`{prefix}{key}` is an unknown field ({hint})");
            self.problems.push(problem);
        }
        Some(obj)
    }

    pub(super) fn string<'a>(&mut self, v: &'a Value, path: &str, expected: &str) -> Option<&'a str> {
        v.as_str().or_else(|| self.bad(path, expected, v))
    }

    pub(super) fn boolean(&mut self, v: &Value, path: &str) -> Option<bool> {
        v.as_bool().or_else(|| self.bad(path, "true or false", v))
    }

    pub(super) fn int(&mut self, v: &Value, path: &str, lo: u64, hi: u64) -> Option<u64> {
        self.int_as(v, path, lo, hi, &format!("an integer between {lo} and {hi}"))
    }

    pub(super) fn int_as(&mut self, v: &Value, path: &str, lo: u64, hi: u64, expected: &str) -> Option<u64> {
        v.as_u64()
            .filter(|n| (lo..=hi).contains(n))
            .or_else(|| self.bad(path, expected, v))
    }

    pub(super) fn number(
        &mut self,
        v: &Value,
        path: &str,
        expected: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Option<f64> {
        v.as_f64()
            .filter(|x| x.is_finite() && ok(*x))
            .or_else(|| self.bad(path, expected, v))
    }

    /// One of the named `options`, or (with `ints`) its index in them, as Triton writes it.
    pub(super) fn choice<T: Copy>(
        &mut self,
        v: &Value,
        path: &str,
        options: &[(&str, T)],
        ints: bool,
    ) -> Option<T> {
        let found = match v {
            Value::String(s) => lookup(options, s),
            Value::Number(n) if ints => n.as_u64().and_then(|i| options.get(i as usize)).map(|(_, t)| *t),
            _ => None,
        };
        found.or_else(|| {
            let names: Vec<String> = options.iter().map(|(s, _)| format!("{s:?}")).collect();
            let ints = if ints {
                format!(" (or 0 to {})", options.len() - 1)
            } else {
                String::new()
            };
            self.bad(path, &format!("one of {}{ints}", names.join(", ")), v)
        })
    }

    /// A path relative to the model folder, or absolute (the repository scan then checks that
    /// it stays inside the repository), with `.` components removed.
    pub(super) fn uri(&mut self, s: &str) -> Option<PathBuf> {
        let expected = "a path to a file inside the model folder (or an absolute path inside the repository)";
        let path = std::path::Path::new(s);
        let why = if s.is_empty() {
            "it is empty"
        } else if s.starts_with('\\') || s.get(1..2) == Some(":") {
            "Windows paths are not allowed"
        } else if path.components().any(|c| c == Component::ParentDir) {
            "`..` is not allowed"
        } else {
            let normal: PathBuf = path.components().filter(|c| *c != Component::CurDir).collect();
            if !s.ends_with('/') && normal.file_name().is_some() {
                return Some(normal);
            }
            "it names no file"
        };
        self.push(format!("`parameters.uri` must be {expected}, got {s:?} ({why})"))
    }

    /// MLServer's `inputs` / `outputs`: an array of `{name, datatype?, shape?, parameters?}`.
    pub(super) fn tensors(&mut self, v: &Value, path: &str, known: &str) -> Option<Vec<DeclaredTensor>> {
        let Some(items) = v.as_array() else {
            return self.bad(path, "an array of {\"name\", \"datatype\", \"shape\"} objects", v);
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let Some(obj) = self.object(item, &format!("{at}."), known) else {
                continue;
            };
            let Some(name) = get(obj, "name").and_then(|n| self.string(n, &format!("{at}.name"), "a string"))
            else {
                if get(obj, "name").is_none() {
                    self.problems.push(format!("`{at}.name` is missing"));
                }
                continue;
            };
            let datatype = get(obj, "datatype").and_then(|d| {
                let expected = "an Open Inference Protocol datatype such as \"FP32\" or \"INT64\"";
                d.as_str()
                    .and_then(DataType::parse)
                    .or_else(|| self.bad(&format!("{at}.datatype"), expected, d))
            });
            let shape = get(obj, "shape").and_then(|s| {
                let dims = s
                    .as_array()
                    .map(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>());
                match dims.flatten() {
                    Some(d) if d.iter().all(|n| *n >= -1) => Some(d),
                    _ => self.bad(
                        &format!("{at}.shape"),
                        "an array of integers (-1 for any size)",
                        s,
                    ),
                }
            });
            if let Some(p) = get(obj, "parameters") {
                if !p.is_object() {
                    self.bad::<()>(&format!("{at}.parameters"), "an object", p);
                }
            }
            out.push(DeclaredTensor {
                name: name.to_owned(),
                datatype,
                shape,
            });
        }
        Some(out)
    }

    /// Type-checks MLServer's fields that sluice accepts but does not use, and names the ones given.
    pub(super) fn unused(
        &mut self,
        top: &Map<String, Value>,
        params: Option<&Map<String, Value>>,
    ) -> Vec<String> {
        type Check = fn(&Value) -> bool;
        let string: Check = Value::is_string;
        let boolean: Check = Value::is_boolean;
        let fields: [(&str, Option<&Value>, &str, Check); 8] = [
            ("implementation", get(top, "implementation"), "a string", string),
            (
                "parallel_workers",
                get(top, "parallel_workers"),
                "a non-negative integer",
                |v| v.is_u64(),
            ),
            ("warm_workers", get(top, "warm_workers"), "true or false", boolean),
            ("platform", get(top, "platform"), "a string", string),
            ("versions", get(top, "versions"), "an array of strings", |v| {
                v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
            }),
            (
                "cache_enabled",
                get(top, "cache_enabled"),
                "true or false",
                boolean,
            ),
            (
                "parameters.content_type",
                params.and_then(|p| get(p, "content_type")),
                "a string",
                string,
            ),
            (
                "parameters.format",
                params.and_then(|p| get(p, "format")),
                "a string",
                string,
            ),
        ];
        let mut given = Vec::new();
        for (path, value, expected, ok) in fields {
            match value {
                Some(v) if ok(v) => given.push(path.to_owned()),
                Some(v) => self.bad::<()>(path, expected, v).unwrap_or_default(),
                None => {}
            }
        }
        if let Some(v) = params.and_then(|p| get(p, "extra")) {
            match v.is_object() {
                true => given.push("parameters.extra".to_owned()),
                false => self
                    .bad::<()>("parameters.extra", "an object", v)
                    .unwrap_or_default(),
            }
        }
        given
    }

    /// Reconciles an MLServer field with its KServe twin (same unit): equal or one given is fine.
    pub(super) fn merge(
        &mut self,
        ml: (&str, Option<f64>),
        ks: (&str, Option<f64>),
        unit: &str,
    ) -> Option<f64> {
        match (ml.1, ks.1) {
            (Some(a), Some(b)) if (a - b).abs() > 1e-9 => {
                let (m, k) = (ml.0, ks.0);
                self.push(format!(
                    "`{k}` and `{m}` disagree ({b}{unit} vs {a}{unit}); set only one of them"
                ))
            }
            (a, b) => a.or(b),
        }
    }
}

/// `name`, a file a configuration names (`field`), when it stays inside the
/// model folder: relative, without `..`. Symlinks inside the folder are the
/// operator's to place; a configuration, which a client may send through the
/// load API, must not reach past the folder by itself.
pub fn in_folder<'a>(field: &str, name: &'a str) -> Result<&'a str, String> {
    use std::path::Component;
    let path = std::path::Path::new(name);
    let why = if name.is_empty() {
        "it is empty"
    } else if path.is_absolute() || name.starts_with('\\') || name.get(1..2) == Some(":") {
        "an absolute path"
    } else if path.components().any(|c| c == Component::ParentDir) {
        "`..` leads out of the folder"
    } else if name.contains('\0') {
        "it holds a NUL byte"
    } else {
        return Ok(name);
    };
    Err(format!(
        "{field} {:?} must name a file inside the model folder ({why}); put the file in the folder and name it relative to it",
        crate::error::clip(name)
    ))
}
