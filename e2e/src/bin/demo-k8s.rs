//! `scripts/demo.sh --kubernetes`: the README tour on the local control plane — the CRD, the
//! credentials Secret, a ConfigMap and an `HAProxyConfig`, three HAProxy pods run by the kubelet
//! stand-in and two controller replicas — printing the resource's status after each step,
//! including a leader kill. Everything runs on loopback and stops when the tour ends.
#![forbid(unsafe_code)]

use haptic_e2e::cluster::local::LocalCluster;
use haptic_e2e::cluster::scenarios::run_all;
use haptic_e2e::HaproxyBin;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let path = std::env::var("HAPTIC_DEMO_HAPROXY").unwrap_or_else(|_| "/usr/sbin/haproxy".into());
    let bin = match HaproxyBin::probe(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("demo-k8s: error: HAProxy {path}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    println!("Starting a local control plane (etcd + kube-apiserver), the HAProxyConfig CRD, 3 HAProxy pods ({}) and 2 controller replicas...", bin.label());
    let mut c = match LocalCluster::start(&bin, 3).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("demo-k8s: error: {e}");
            return std::process::ExitCode::from(2);
        }
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
