//! The chart's monitoring objects read as data: the PromQL of the Grafana dashboard and of the
//! PrometheusRule, the metric names each expression reads (parsed by `promql-parser`, so a label
//! or a function is never taken for a metric), and the sample names a live `/metrics`
//! exposition offers.
//!
//! Pure: it reads values and text it is given and must never start a process or open a socket.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::parser::{self, Expr};
use promql_parser::util::{walk_expr, ExprVisitor};
use serde_json::Value;

/// Where an expression came from (a panel title, an alert name) and its PromQL.
pub type Query = (String, String);

/// Every sample name `text` (Prometheus text format or OpenMetrics) can serve: the samples it
/// has, and for each `# TYPE` family the names its type implies even before a first sample
/// (`x_total` for a counter, `x_bucket`/`x_sum`/`x_count` for a histogram,
/// `x_sum`/`x_count` for a summary).
pub fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else { continue };
            names.insert(name.to_string());
            let suffixes: &[&str] = match kind {
                "counter" if !name.ends_with("_total") => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Grafana's interval variables, replaced by a duration so the expression is PromQL.
const GRAFANA_INTERVALS: [&str; 4] = ["$__rate_interval", "$__interval", "$__range", "${__rate_interval}"];

struct Selectors(BTreeSet<String>);

impl ExprVisitor for Selectors {
    type Error = String;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
        let vs = match expr {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return Ok(true),
        };
        let name = vs
            .name
            .clone()
            .or_else(|| vs.matchers.matchers.iter().find(|m| m.name == "__name__").map(|m| m.value.clone()));
        match name {
            Some(n) => {
                self.0.insert(n);
                Ok(true)
            }
            None => Err(format!("a selector without a metric name: {vs}")),
        }
    }
}

/// The metric names `expr` reads. Grafana's `$__rate_interval` (and kin) count as `5m`; other
/// `$variables` may appear only inside label values. An expression that is not PromQL, or a
/// selector without a metric name, is an error.
pub fn read_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let mut promql = expr.to_string();
    for v in GRAFANA_INTERVALS {
        promql = promql.replace(v, "5m");
    }
    let ast = parser::parse(&promql).map_err(|e| format!("{expr}: {e}"))?;
    let mut seen = Selectors(BTreeSet::new());
    walk_expr(&mut seen, &ast).map_err(|e| format!("{expr}: {e}"))?;
    Ok(seen.0)
}

/// The metric names `queries` read, each with the places that read it; the first query that is
/// not PromQL is an error.
pub fn names_read(queries: &[Query]) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (place, expr) in queries {
        for name in read_names(expr).map_err(|e| format!("{place}: {e}"))? {
            out.entry(name).or_default().push(place.clone());
        }
    }
    Ok(out)
}

/// The names in `wanted` (from [`names_read`]) that start with `prefix` and `exposed` lacks,
/// with where each is read: empty when every one exists.
pub fn missing(wanted: &BTreeMap<String, Vec<String>>, prefix: &str, exposed: &BTreeSet<String>) -> Vec<String> {
    wanted
        .iter()
        .filter(|(name, _)| name.starts_with(prefix) && !exposed.contains(*name))
        .map(|(name, places)| format!("{name} (read by {})", places.join(", ")))
        .collect()
}

/// Every query of a Grafana dashboard: each panel's (and each row's panels') `targets[].expr`,
/// and the metric of each `label_values(metric, label)` template variable.
pub fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    fn panels(list: &Value, out: &mut Vec<Query>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((format!("panel {title:?}"), e.to_string()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str()).unwrap_or_default();
        if let Some(args) = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
            if let Some((metric, _label)) = args.rsplit_once(',') {
                out.push((format!("variable {}", v["name"]), metric.trim().to_string()));
            }
        }
    }
    out
}

/// Every expression of a PrometheusRule object (`spec.groups[].rules[]`), named by its alert or
/// record.
pub fn rule_queries(rule: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for g in rule["spec"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["alert"].as_str().or_else(|| r["record"].as_str()).unwrap_or_default();
            if let Some(e) = r["expr"].as_str() {
                out.push((format!("rule {name}"), e.to_string()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn read_names_takes_metrics_never_labels_or_functions() {
        let e = r#"sum by (haproxy_pod) (increase(haptic_apply_rejected_total{namespace="$namespace"}[$__rate_interval]))
            / on (pod) group_left max(haptic_leader == 1) or absent({__name__="haptic_pods"})"#;
        assert_eq!(read_names(e).unwrap(), set(&["haptic_apply_rejected_total", "haptic_leader", "haptic_pods"]));
        assert!(read_names("sum(rate(x[5m]) by").is_err(), "not PromQL");
        assert!(read_names(r#"{job="a"}"#).is_err(), "no metric name");
    }

    #[test]
    fn exposed_names_expand_families_by_type() {
        let om = "# HELP a Applies.\n# TYPE a counter\n# TYPE d histogram\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(exposed_names(om), set(&["a", "a_total", "d", "d_bucket", "d_count", "d_sum", "g"]));
        let classic = "# TYPE haproxy_x_total counter\nhaproxy_x_total{proxy=\"p\"} 0\n";
        assert_eq!(exposed_names(classic), set(&["haproxy_x_total"]));
    }

    #[test]
    fn queries_come_from_nested_panels_variables_and_rules() {
        let d = json!({
            "panels": [{"title": "r", "panels": [{"title": "p", "targets": [{"expr": "up"}]}]}],
            "templating": {"list": [{"name": "ns", "query": {"query": "label_values(haptic_build_info, namespace)"}}]}
        });
        let q: Vec<String> = dashboard_queries(&d).into_iter().map(|(_, e)| e).collect();
        assert_eq!(q, ["up", "haptic_build_info"]);
        let r =
            json!({"spec": {"groups": [{"rules": [{"alert": "A", "expr": "x > 0"}, {"record": "r", "expr": "y"}]}]}});
        let queries = rule_queries(&r);
        assert_eq!(queries, [("rule A".to_string(), "x > 0".to_string()), ("rule r".to_string(), "y".to_string())]);
        let wanted = names_read(&queries).unwrap();
        assert_eq!(missing(&wanted, "x", &set(&["y"])), ["x (read by rule A)"]);
        assert!(missing(&wanted, "x", &set(&["x"])).is_empty());
    }
}
