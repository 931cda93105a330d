//! The real-HAProxy harness tested against every installed HAProxy version (2.6, 3.0, 3.2 and 3.4).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haptic_e2e::config::BASIC_BODY;
use haptic_e2e::{
    assert_no_stray, basic_config, free_port, haproxy_bins, http_get, on_each_version, pid_alive, wait_http_body,
    Haproxy, HaproxyBin, HaproxyOpts, ReloadOutcome,
};

/// Writes a basic config into a fresh temp dir and starts `bin` on it.
async fn start(bin: &HaproxyBin) -> (tempfile::TempDir, Haproxy, SocketAddr) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    std::fs::write(dir.path().join("haproxy.cfg"), basic_config(port, "")).expect("write cfg");
    let hap = Haproxy::start(bin, HaproxyOpts::new(dir.path()))
        .await
        .unwrap_or_else(|e| panic!("{} failed to start: {e}", bin.label()));
    (dir, hap, SocketAddr::from(([127, 0, 0, 1], port)))
}

on_each_version!(lifecycle);

async fn lifecycle(bin: HaproxyBin) {
    let (_dir, mut hap, addr) = start(&bin).await;
    let label = bin.label();

    // Worker pid through the master CLI `@1`, consistent with `show proc`.
    let worker = hap.worker_pid().await.unwrap();
    let proc0 = hap.show_proc().await.unwrap();
    assert_eq!(proc0.master_pid(), hap.master_pid(), "{label}");
    assert_eq!(proc0.current_worker().unwrap().pid, worker, "{label}");
    let info = hap.show_info().await.unwrap();
    assert_eq!(info.stopping(), Some(false), "{label}");
    assert_eq!(haptic_haproxy::cli::parse_version(info.version().unwrap()).unwrap(), bin.version);
    println!("{label} ({}) started master={} worker={worker}", bin.version_string, hap.master_pid());

    // Traffic through the frontend.
    assert_eq!(http_get(addr, "/").await.unwrap(), (200, BASIC_BODY.to_string()), "{label}");

    // A good reload gives a new worker that serves.
    let new_worker = match hap.reload_verified().await.unwrap() {
        ReloadOutcome::Reloaded { old_worker, new_worker, .. } => {
            assert_eq!(old_worker, worker, "{label}");
            new_worker
        }
        other => panic!("{label}: reload failed: {other:?}\n{}", hap.stderr_text()),
    };
    assert_ne!(new_worker, worker, "{label}");
    assert_eq!(hap.worker_pid().await.unwrap(), new_worker, "{label}");
    assert_eq!(hap.show_proc().await.unwrap().master_reloads(), 1);
    wait_http_body(addr, "/", BASIC_BODY, Duration::from_secs(5)).await;
    println!("{label}: reloaded -> new worker {new_worker}");

    // A broken config is reported as failed with HAProxy's [ALERT], and the old worker serves.
    let cfg = hap.cfg_path();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("    this_is_not_a_keyword here\n");
    std::fs::write(&cfg, text).unwrap();
    match hap.reload_verified().await.unwrap() {
        ReloadOutcome::Failed { worker, text } => {
            assert_eq!(worker, new_worker, "{label}");
            assert!(text.contains("[ALERT]"), "{label}: {text}");
            assert!(text.contains("this_is_not_a_keyword"), "{label}: {text}");
            println!(
                "{label}: broken reload failed as expected: {}",
                text.lines().find(|l| l.contains("[ALERT]")).unwrap_or("")
            );
        }
        other => panic!("{label}: broken reload was not reported as failed: {other:?}"),
    }
    let after = hap.show_proc().await.unwrap();
    assert_eq!(after.failed_reloads, 1, "{label}");
    assert_eq!(after.serving_worker().unwrap().pid, new_worker, "{label}");
    assert_eq!(hap.worker_pid().await.unwrap(), new_worker, "{label}");
    assert_eq!(http_get(addr, "/").await.unwrap(), (200, BASIC_BODY.to_string()), "{label}");

    // Shutdown leaves nothing behind.
    let pids = hap.kill();
    assert!(pids.contains(&hap.master_pid()) && pids.contains(&worker) && pids.contains(&new_worker));
    assert_no_stray(&pids);
    println!("{label}: stopped, no stray processes among {pids:?}");
}

on_each_version!(sync panicking_test_leaves_no_processes);

fn panicking_test_leaves_no_processes(bin: HaproxyBin) {
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let seen2 = seen.clone();
    let label = bin.label();
    let result = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (_dir, hap, _addr) = start(&bin).await;
            hap.worker_pid().await.unwrap();
            *seen2.lock().unwrap() = hap.known_pids();
            panic!("deliberate panic while {} runs", bin.label());
        })
    })
    .join();
    assert!(result.is_err(), "the thread should have panicked");
    let pids = seen.lock().unwrap().clone();
    assert!(pids.len() >= 2, "{label}: expected master and worker, got {pids:?}");
    assert!(pids.iter().all(|p| !pid_alive(*p)), "{label}: {pids:?} survived the panic");
    assert_no_stray(&pids);
    println!("{label}: panic dropped the harness, no stray among {pids:?}");
}

#[tokio::test]
async fn start_failure_reports_haproxy_output() {
    let bin = haproxy_bins().remove(0);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("haproxy.cfg"), "global\n    bogus_keyword\n").unwrap();
    let err = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.expect_err("a broken config must not start");
    let msg = err.to_string();
    assert!(msg.contains("bogus_keyword"), "{msg}");
}
