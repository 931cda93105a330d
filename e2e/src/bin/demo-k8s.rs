//! `scripts/demo.sh --kubernetes`: the README tour in Kubernetes mode, printing the resource's
//! status after each step, including a leader kill.
//!
//! - `demo-k8s --real`: on the cluster of `scripts/cluster.sh` (KUBECONFIG, HAPTIC_E2E_VALUES and
//!   HAPTIC_HELM set by demo.sh): `helm install` of the chart, then every step, with
//!   `kubectl get hapc` (HAPTIC_KUBECTL) and the status table after each. The release stays
//!   installed afterwards.
//! - `demo-k8s`: on the local control plane — the CRD, the credentials Secret, a ConfigMap and an
//!   `HAProxyConfig`, three HAProxy pods run by the kubelet stand-in and two controller replicas,
//!   all on loopback, stopped when the tour ends.
#![forbid(unsafe_code)]

use haptic_e2e::cluster::local::LocalCluster;
use haptic_e2e::cluster::real::{RealCluster, AGENT_PORT};
use haptic_e2e::cluster::scenarios::run_all;
use haptic_e2e::cluster::Cluster;
use haptic_e2e::HaproxyBin;

fn fail(e: impl std::fmt::Display) -> std::process::ExitCode {
    eprintln!("demo-k8s: error: {e}");
    std::process::ExitCode::from(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    if std::env::args().any(|a| a == "--real") {
        println!("helm install of charts/haptic (2 HAProxy pods, 2 controller replicas) on the real cluster...");
        let mut c = match RealCluster::connect(RealCluster::local_provider()).await {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        if let Err(e) = haptic_e2e::cluster::real_steps::install_reading_config_map(&c).await {
            return fail(e);
        }
        let pods = match c.haproxy_pods().await {
            Ok(p) => p.len(),
            Err(e) => return fail(e),
        };
        return match run_all(&mut c, pods, AGENT_PORT, true).await {
            Ok(()) => {
                println!("\nEvery step went as described. The release stays installed (see below).");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("\ndemo-k8s: error: {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    let path = std::env::var("HAPTIC_DEMO_HAPROXY").unwrap_or_else(|_| "/usr/sbin/haproxy".into());
    let bin = match HaproxyBin::probe(&path) {
        Ok(b) => b,
        Err(e) => return fail(format!("HAProxy {path}: {e}")),
    };
    println!("Starting a local control plane (etcd + kube-apiserver), the HAProxyConfig CRD, 3 HAProxy pods ({}) and 2 controller replicas...", bin.label());
    let mut c = match LocalCluster::start(&bin, 3).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    println!("KUBECONFIG={} (valid while the demo runs)", c.kubeconfig().display());
    let port = c.agent_port();
    match run_all(&mut c, 3, port, true).await {
        Ok(()) => {
            println!("\nEvery step went as described. Stopping everything.");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\ndemo-k8s: error: {e}\n{}", c.controller_logs());
            std::process::ExitCode::from(1)
        }
    }
}
