//! `--log-format json`: every line the agent writes is one JSON object with `message` and the
//! event's fields at the top level (real agent process, real HAProxy); `--log-level` filters.

use haptic_e2e::haproxy_bin;
use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::wait::eventually;
use serde_json::Value;

#[tokio::test]
async fn json_logs_are_flat_and_the_level_filters() {
    let bin = haproxy_bin(3, 0);
    // RUST_LOG would override --log-level: an empty one makes the harness leave it unset.
    let opts = PodOpts {
        extra_args: ["--log-format", "json", "--log-level", "warn"].map(String::from).to_vec(),
        env: vec![("RUST_LOG".into(), String::new())],
        ..PodOpts::default()
    };
    let pod = Pod::start(&bin, opts).await.unwrap();
    // A refused request: one warning with fields.
    let (status, _) = haptic_e2e::pod::AgentClient { addr: pod.addr(), auth: None }.get("/v1/state").await.unwrap();
    assert_eq!(status, 401);
    // The log pump reads the agent's stderr on its own: wait for the line to arrive.
    let logged = || async {
        let log = pod.agent_log();
        if log.contains("no credentials") {
            Ok(())
        } else {
            Err(log)
        }
    };
    eventually("the refusal in the log", std::time::Duration::from_secs(30), logged).await;
    let log = pod.agent_log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}")))
        .collect();
    let refusal = lines
        .iter()
        .find(|v| v["message"].as_str().is_some_and(|m| m.contains("no credentials")))
        .unwrap_or_else(|| panic!("no refusal line in\n{log}"));
    assert_eq!(refusal["level"], "WARN");
    assert_eq!(refusal["path"], "/v1/state", "fields at the top level: {refusal}");
    assert!(refusal.get("fields").is_none(), "flattened: {refusal}");
    assert!(!lines.iter().any(|v| v["level"] == "INFO"), "--log-level warn hides info lines:\n{log}");
}
