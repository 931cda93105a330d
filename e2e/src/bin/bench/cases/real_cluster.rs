//! `real_cluster`: the real cluster of `scripts/cluster.sh` (2 nodes). Bring-up from an empty
//! state directory (cold: the Kubernetes binaries built, the pause and web images not) and again
//! (warm), `load` and `helm install` times, and "config change → every pod serving it": a new
//! frontend body written to the ConfigMap until every HAProxy pod answers it on its pod IP,
//! against the same change on a standalone 2-pod fleet (render directory → every pod serving it)
//! measured in the same run. Needs root; runs only when named (`--only real_cluster`), takes the
//! machine's one cluster down before and after. It must never touch a cluster it did not start
//! in this case.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use haptic_e2e::cluster::real::{RealCluster, HTTP_PORT};
use haptic_e2e::cluster::real_steps::install_reading_config_map;
use haptic_e2e::cluster::{put_config_map, Cluster};
use haptic_e2e::workspace_root;

use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, FleetPod, PASSWORD, PORT_ENV, USER};
use crate::floor::durable_write;
use crate::report::Row;
use crate::stats::Samples;

/// Samples of the change per side.
const CHANGES: usize = 5;
/// Spacing between changes: more than the agents' pacing interval (2 s), so no change waits
/// for a reload slot.
const SPACING: Duration = Duration::from_millis(2500);

/// Runs `scripts/cluster.sh ARGS` with the images of this build's profile; how long it took.
pub(super) fn script(args: &[&str]) -> Result<Duration> {
    let t = Instant::now();
    let out = Command::new(workspace_root().join("scripts/cluster.sh"))
        .args(args)
        .env("HAPTIC_IMAGES_PROFILE", if cfg!(debug_assertions) { "debug" } else { "release" })
        .output()
        .map_err(BenchError::io("scripts/cluster.sh"))?;
    if !out.status.success() {
        return Err(BenchError::Unexpected(format!(
            "scripts/cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).lines().rev().take(15).collect::<Vec<_>>().join("\n")
        )));
    }
    Ok(t.elapsed())
}

/// The config both sides serve: `body` on `bind`, plus the health frontend where pods need one.
fn config(bind: &str, body: &str, health: &str) -> String {
    format!(
        "global\n    default-path config\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend fe_main\n    {bind}\n    http-request return status 200 content-type text/plain string \"{body}\"\n\n{health}"
    )
}

/// Polls `get` for every target until each answers `body`; the time from `t0`.
async fn until_all_serve<F, Fut>(targets: &[String], body: &str, t0: Instant, get: F) -> Result<Duration>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = t0 + Duration::from_secs(60);
    let mut pending: Vec<String> = targets.to_vec();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for t in pending {
            if get(t.clone()).await.as_deref() != Some(body) {
                still.push(t);
            }
        }
        pending = still;
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("{pending:?} never served {body:?}")));
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(t0.elapsed())
}

async fn standalone(ctx: &Ctx) -> Result<Samples> {
    let tmp = tempfile::tempdir().map_err(BenchError::io("tempdir"))?;
    let mut pods = Vec::new();
    for _ in 0..2 {
        pods.push(FleetPod::start(&ctx.bin, "2s").await?);
    }
    let render = tmp.path().join("render");
    std::fs::create_dir_all(&render).map_err(BenchError::io("render dir"))?;
    let creds = tmp.path().join("creds");
    std::fs::write(&creds, format!("{USER}:{PASSWORD}\n")).map_err(BenchError::io("creds"))?;
    let bind = format!("bind \"127.0.0.1:${{{PORT_ENV}}}\"");
    durable_write(&render.join("haproxy.cfg"), config(&bind, "v0", "").as_bytes())?;
    let agents: Vec<String> = pods.iter().map(|p| p.url.clone()).collect();
    let _ctl = Controller::start(&ctx.bin, tmp.path(), &render, &creds, &agents).await?;
    let targets: Vec<String> = pods.iter().map(|p| format!("127.0.0.1:{}", p.port)).collect();
    let get = |t: String| async move {
        let addr = t.parse().ok()?;
        haptic_e2e::http_get(addr, "/").await.ok().filter(|(c, _)| *c == 200).map(|(_, b)| b)
    };
    until_all_serve(&targets, "v0", Instant::now(), get).await?;
    let mut s = Samples::new();
    for i in 1..=CHANGES {
        tokio::time::sleep(SPACING).await;
        let body = format!("v{i}");
        let t0 = Instant::now();
        durable_write(&render.join("haproxy.cfg"), config(&bind, &body, "").as_bytes())?;
        s.push_ms(until_all_serve(&targets, &body, t0, get).await?);
    }
    Ok(s)
}

/// Refuses `case` unless this process runs as root (`scripts/cluster.sh` needs it).
pub(super) fn require_root(case: &str) -> Result<()> {
    let uid =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").map_err(BenchError::io("/proc/self"))?);
    if uid != 0 {
        return Err(BenchError::Unexpected(format!("{case} needs root (scripts/cluster.sh)")));
    }
    Ok(())
}

/// Connects to the cluster `scripts/cluster.sh` runs, with its chart values and our helm.
pub(super) async fn connect() -> Result<RealCluster> {
    let state = workspace_root().join("target/cluster");
    let helm =
        Command::new(workspace_root().join("scripts/install-helm.sh")).output().map_err(BenchError::io("helm"))?;
    let helm = PathBuf::from(String::from_utf8_lossy(&helm.stdout).trim());
    RealCluster::connect_with(RealCluster::local_provider(), &state.join("kubeconfig"), state.join("values.yaml"), helm)
        .await
        .map_err(|e| BenchError::Unexpected(e.to_string()))
}

async fn on_cluster() -> Result<(Vec<(&'static str, Duration)>, Samples)> {
    let mut times = Vec::new();
    script(&["down"])?;
    // Cold: an empty state directory (pki, network, the pause and web images are made again).
    let state = workspace_root().join("target/cluster");
    std::fs::remove_dir_all(&state)
        .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
        .map_err(BenchError::io("remove target/cluster"))?;
    times.push(("up_cold", script(&["up", "2"])?));
    script(&["down"])?;
    times.push(("up_warm", script(&["up", "2"])?));
    times.push(("load", script(&["load"])?));
    let c = connect().await?;
    let t = Instant::now();
    install_reading_config_map(&c).await.map_err(|e| BenchError::Unexpected(e.to_string()))?;
    times.push(("install", t.elapsed()));
    let health = c.health_frontend().unwrap_or_default();
    let bind = format!("bind :{HTTP_PORT}");
    let pods =
        c.pods("app.kubernetes.io/component=haproxy").await.map_err(|e| BenchError::Unexpected(e.to_string()))?;
    let targets: Vec<String> =
        pods.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).map(|ip| format!("{ip}:{HTTP_PORT}")).collect();
    let get = |t: String| async move {
        let addr = t.parse().ok()?;
        haptic_e2e::http_get(addr, "/").await.ok().filter(|(c, _)| *c == 200).map(|(_, b)| b)
    };
    let client = c.client();
    let mut s = Samples::new();
    for i in 1..=CHANGES {
        tokio::time::sleep(SPACING).await;
        let body = format!("v{i}");
        let t0 = Instant::now();
        put_config_map(&client, c.namespace(), &config(&bind, &body, &health), "")
            .await
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        s.push_ms(until_all_serve(&targets, &body, t0, get).await?);
    }
    script(&["down"])?;
    Ok((times, s))
}

/// Runs the case (see the module doc).
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    // /proc/self belongs to the process's effective uid.
    require_root("real_cluster")?;
    let base = standalone(ctx).await?;
    let res = on_cluster().await;
    if res.is_err() {
        let _ = script(&["down"]);
    }
    let (times, cluster) = res?;
    let mut rows = Vec::new();
    for (what, d) in times {
        rows.push(Row::single("real_cluster", what, "3.0 (image)", d.as_secs_f64(), None, "s"));
    }
    let mut r = Row::repeated("real_cluster", "change_to_serving", "3.0 (image)", &cluster, Some(&base), "ms");
    r.add_note(format!(
        "ConfigMap write -> every pod serves the new body (a reload), 2 pods on 2 nodes; floor: the same change on a standalone 2-pod fleet ({})",
        ctx.label
    ));
    rows.push(r);
    Ok(rows)
}
