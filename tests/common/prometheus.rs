//! The Prometheus text format of `/metrics`, parsed strictly enough to
//! catch a malformed line, and sums over the samples of a metric.

use std::collections::BTreeMap;

use super::TestServer;

/// One sample of the Prometheus text format.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text format, panicking on any line that is not a
/// comment or `name{label="value",...} value`.
pub fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line:?}"));
        let (name, mut rest) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"))),
            None => (series, ""),
        };
        let name_ok = name
            .chars()
            .enumerate()
            .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()));
        assert!(!name.is_empty() && name_ok, "bad metric name: {line:?}");
        let mut labels = BTreeMap::new();
        while !rest.is_empty() {
            let (key, after) = rest
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad label: {line:?}"));
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => value.push(chars.next().expect("escape").1),
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unterminated label value: {line:?}"),
                }
            };
            labels.insert(key.to_string(), value);
            rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    samples
}

impl TestServer {
    /// The Prometheus text of `/metrics` (asserting a 200).
    pub async fn metrics(&self) -> String {
        let (st, text) = self.get_raw("/metrics").await;
        assert_eq!(st, 200, "{text}");
        text
    }
}

/// The parsed `/metrics` of `s`.
pub struct Metrics(pub Vec<Sample>);

impl Metrics {
    pub async fn scrape(s: &TestServer) -> Metrics {
        Metrics(parse(&s.metrics().await))
    }

    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
        })
    }

    /// Sum of the samples of `name` carrying every label in `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    pub fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.matching(name, labels).next().is_some()
    }
}
