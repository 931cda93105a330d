//! The end-to-end scenario suite on Kubernetes. One suite, three backends, chosen by
//! `HAPTIC_E2E_CLUSTER`:
//! - `local` (default): the local control plane, `LocalPods` with real HAProxy 2.6, 3.0, 3.2 and 3.4, two
//!   controller processes (needs `scripts/install-k8s.sh`);
//! - `real`: the cluster of `scripts/cluster.sh` (kubelet + containerd nodes on this machine),
//!   images loaded with `scripts/cluster.sh load`; the suite installs the chart with helm;
//! - `kind`: a kind cluster with the images loaded (`scripts/e2e-kind.sh`).
//!
//! `real` and `kind` share one backend and run the shared scenarios plus the real-cluster ones.
//! They need `KUBECONFIG`, `HAPTIC_E2E_VALUES` (the chart values naming the loaded images) and
//! `HAPTIC_HELM`.
//!
//! `HAPTIC_E2E_STEPS` (comma-separated step names) runs only those steps after the first deploy.

use haptic_e2e::cluster::local::LocalCluster;
use haptic_e2e::cluster::real::{Provider, RealCluster};
use haptic_e2e::cluster::real_scenarios::{real_step_names, run_real};
use haptic_e2e::cluster::scenarios::{run_selected, step_names, Selection};
use haptic_e2e::{on_each_version, HaproxyBin};

/// The backend `HAPTIC_E2E_CLUSTER` selects: `None` for the local one.
fn real_provider() -> Option<Provider> {
    match std::env::var("HAPTIC_E2E_CLUSTER").as_deref() {
        Ok("real") => Some(RealCluster::local_provider()),
        Ok("kind") => Some(Provider::Kind),
        Ok("local") | Err(_) => None,
        Ok(other) => panic!("HAPTIC_E2E_CLUSTER={other}: use local, real or kind"),
    }
}

/// On a real cluster (`real` or `kind`): the shared and the real-cluster scenarios.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_a_real_cluster() {
    let Some(provider) = real_provider() else {
        println!("HAPTIC_E2E_CLUSTER is not real or kind: the local backend's cases run the scenarios");
        return;
    };
    let selection = Selection::from_env(&real_step_names()).unwrap_or_else(|e| panic!("{e}"));
    let mut c = RealCluster::connect(provider).await.unwrap_or_else(|e| panic!("{e}"));
    run_real(&mut c, &selection).await.unwrap_or_else(|e| panic!("{e}"));
}

on_each_version!(every_scenario_on_the_local_backend);

/// On the local backend: the shared scenarios with 2 `LocalPods` of `bin` and two controllers.
async fn every_scenario_on_the_local_backend(bin: HaproxyBin) {
    if real_provider().is_some() {
        println!("HAPTIC_E2E_CLUSTER selects a real cluster: its case runs the scenarios");
        return;
    }
    let selection = Selection::from_env(&step_names()).unwrap_or_else(|e| panic!("{e}"));
    let pods = 2;
    let mut c = LocalCluster::start(&bin, pods).await.unwrap_or_else(|e| panic!("{e}"));
    let port = c.agent_port();
    if let Err(e) = run_selected(&mut c, pods, port, false, &selection).await {
        panic!("{}: {e}\n{}", bin.label(), c.controller_logs());
    }
}
