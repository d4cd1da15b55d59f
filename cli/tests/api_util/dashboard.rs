//! The Grafana dashboard of docs/grafana/dcpserve.json read as its queries: the metric
//! names its PromQL expressions (and template variables) use, checked against a live
//! `/metrics` exposition.

use std::collections::BTreeSet;

use serde_json::Value;

/// The dashboard file.
pub fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana/dcpserve.json");
    let text = std::fs::read_to_string(path).expect("docs/grafana/dcpserve.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every query string of the dashboard: panel targets' `expr`, template variables'
/// `query` and `definition`.
pub fn queries(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// The metric names (`dcpserve:…`) a PromQL expression reads.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("dcpserve:") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The metric names with at least one sample in a Prometheus text exposition.
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Panics unless every metric the dashboard queries has samples in `exposition`, and
/// every panel query reads some dcpserve metric; returns the names queried.
pub fn assert_dashboard_is_exported(exposition: &str) -> BTreeSet<String> {
    let d = dashboard();
    let exported = exported_names(exposition);
    let mut queried = BTreeSet::new();
    for q in queries(&d) {
        // The data-source variable's query is a plugin type, not PromQL.
        if q == "prometheus" {
            continue;
        }
        let names = metric_names(&q);
        assert!(
            !names.is_empty(),
            "the query `{q}` reads no dcpserve metric"
        );
        queried.extend(names);
    }
    let missing: Vec<&String> = queried.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not export: {missing:?}\nexported: {exported:?}"
    );
    queried
}
