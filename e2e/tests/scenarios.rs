//! The end-to-end scenario suite on Kubernetes. One suite, three backends, chosen by
//! `HAPTIC_E2E_CLUSTER`:
//! - `local` (default): the local control plane, `LocalPods` with real HAProxy 2.6 and 3.0, two
//!   controller processes (needs `scripts/install-k8s.sh`);
//! - `real`: the cluster of `scripts/cluster.sh` (kubelet + containerd nodes on this machine),
//!   images loaded with `scripts/cluster.sh load`; the suite installs the chart with helm;
//! - `kind`: a kind cluster with the images loaded (`scripts/e2e-kind.sh`).
//!
//! `real` and `kind` share one backend and run the shared scenarios plus the real-cluster ones.
//! They need `KUBECONFIG`, `HAPTIC_E2E_VALUES` (the chart values naming the loaded images) and
//! `HAPTIC_HELM`.

use haptic_e2e::cluster::local::LocalCluster;
use haptic_e2e::cluster::real::{Provider, RealCluster};
use haptic_e2e::cluster::real_scenarios::run_real;
use haptic_e2e::cluster::scenarios::run_all;
use haptic_e2e::haproxy_bins;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_the_selected_backend() {
    let real = match std::env::var("HAPTIC_E2E_CLUSTER").as_deref() {
        Ok("real") => Some(RealCluster::local_provider()),
        Ok("kind") => Some(Provider::Kind),
        Ok("local") | Err(_) => None,
        Ok(other) => panic!("HAPTIC_E2E_CLUSTER={other}: use local, real or kind"),
    };
    if let Some(provider) = real {
        let mut c = RealCluster::connect(provider).await.unwrap_or_else(|e| panic!("{e}"));
        run_real(&mut c).await.unwrap_or_else(|e| panic!("{e}"));
        return;
    }
    for bin in haproxy_bins() {
        println!("--- {} on the local backend", bin.label());
        let pods = 2;
        let mut c = LocalCluster::start(&bin, pods).await.unwrap_or_else(|e| panic!("{e}"));
        let port = c.agent_port();
        if let Err(e) = run_all(&mut c, pods, port, false).await {
            panic!("{}: {e}\n{}", bin.label(), c.controller_logs());
        }
    }
}
