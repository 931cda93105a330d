//! Gateway API on the real cluster of `scripts/cluster.sh` (`HAPTIC_E2E_CLUSTER=real`), after
//! `scripts/conformance.sh` applied the Gateway API standard CRDs: the steps of
//! `haptic_e2e::cluster::real_gateway`. Needs `KUBECONFIG`, `HAPTIC_E2E_VALUES` and `HAPTIC_HELM`
//! as the scenario suite does; without `HAPTIC_E2E_CLUSTER=real` it does nothing (the local
//! control plane's Gateway tests are the controller's).

use haptic_e2e::cluster::real::RealCluster;
use haptic_e2e::cluster::real_gateway::run_gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_on_a_real_cluster() {
    if std::env::var("HAPTIC_E2E_CLUSTER").as_deref() != Ok("real") {
        println!("HAPTIC_E2E_CLUSTER is not real: the Gateway steps need the real cluster");
        return;
    }
    let mut c = RealCluster::connect(RealCluster::local_provider()).await.unwrap_or_else(|e| panic!("{e}"));
    run_gateway(&mut c).await.unwrap_or_else(|e| panic!("{e}"));
}
