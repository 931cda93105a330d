//! The end-to-end scenario suite on Kubernetes. One suite, two backends: `local` (default: the
//! local control plane, `LocalPods` with real HAProxy 2.6 and 3.0, two controller processes) and
//! `kind` (`HAPTIC_E2E_CLUSTER=kind`: a real cluster with the chart installed; see
//! `scripts/e2e-kind.sh`). Needs `scripts/install-k8s.sh` for `local`.

use haptic_e2e::cluster::kind::KindCluster;
use haptic_e2e::cluster::local::LocalCluster;
use haptic_e2e::cluster::scenarios::run_all;
use haptic_e2e::cluster::Cluster as _;
use haptic_e2e::haproxy_bins;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_on_the_selected_backend() {
    match std::env::var("HAPTIC_E2E_CLUSTER").as_deref() {
        Ok("kind") => {
            let mut c = KindCluster::connect().await.unwrap_or_else(|e| panic!("{e}"));
            let pods = c.haproxy_pods().await.unwrap_or_else(|e| panic!("{e}")).len();
            let port = std::env::var("HAPTIC_E2E_AGENT_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(9080);
            run_all(&mut c, pods, port, false).await.unwrap_or_else(|e| panic!("kind: {e}"));
        }
        Ok("local") | Err(_) => {
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
        Ok(other) => panic!("HAPTIC_E2E_CLUSTER={other}: use local or kind"),
    }
}
