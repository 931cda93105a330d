//! Credential rotation on a running agent (real process on 127.0.0.1, real HAProxy 2.6, 3.0, 3.2 and 3.4):
//! rewriting `--credentials-file` the way the kubelet updates a mounted Secret makes the new
//! credential work without a restart; the previous one is accepted for `--credentials-grace`,
//! then refused. A malformed file keeps the last good credential.

use std::time::{Duration, Instant};

use haptic_e2e::pod::{AgentClient, Pod, PodOpts};
use haptic_e2e::wait::{eventually, poll};
use haptic_e2e::{on_each_version, HaproxyBin};

const DEADLINE: Duration = Duration::from_secs(60);
/// Long enough that "the old one is still accepted" is checked inside the window on any machine;
/// the end of the window is waited for, never timed.
const GRACE: Duration = Duration::from_secs(20);

fn as_user(pod: &Pod, password: &str) -> AgentClient {
    AgentClient { addr: pod.addr(), auth: Some((pod.credentials().0.to_string(), password.to_string())) }
}

async fn status(c: &AgentClient) -> u16 {
    c.get("/v1/state").await.expect("GET /v1/state").0
}

/// Polls until `password` gets `want` from `/v1/state`, or panics at [`DEADLINE`].
async fn until_status(pod: &Pod, password: &str, want: u16, what: &str) {
    let c = as_user(pod, password);
    let check = || async {
        match status(&c).await {
            got if got == want => Ok(()),
            got => Err(format!("{got}")),
        }
    };
    poll(what, DEADLINE, check).await.unwrap_or_else(|e| panic!("{e}, wanted {want}\n{}", pod.agent_log()));
}

on_each_version!(a_rewritten_credentials_file_is_used_without_a_restart_and_the_old_one_expires);

async fn a_rewritten_credentials_file_is_used_without_a_restart_and_the_old_one_expires(bin: HaproxyBin) {
    println!("--- {}", bin.label());
    let opts = PodOpts {
        credentials: Some(("haptic".into(), "first-pw".into())),
        extra_args: vec![
            "--credentials-poll".into(),
            "200ms".into(),
            "--credentials-grace".into(),
            format!("{}s", GRACE.as_secs()),
        ],
        ..PodOpts::default()
    };
    let mut pod = Pod::start(&bin, opts).await.unwrap();
    let pid = pod.agent_pid();
    assert_eq!(status(&pod.client()).await, 200);
    assert_eq!(status(&as_user(&pod, "second-pw")).await, 401, "not yet rotated");

    let old = pod.rotate_credentials("second-pw").unwrap();
    until_status(&pod, "second-pw", 200, "the new credential to be accepted").await;
    let rotated_at = Instant::now();
    // Inside the window: both.
    let old_answer = status(&as_user(&pod, &old)).await;
    assert!(rotated_at.elapsed() < GRACE, "the check ran past the window; the verdict would mean nothing");
    assert_eq!(old_answer, 200, "the previous credential inside the grace window\n{}", pod.agent_log());
    assert_eq!(status(&as_user(&pod, "neither")).await, 401);
    // After the window: only the new one.
    until_status(&pod, &old, 401, "the previous credential to expire").await;
    assert_eq!(status(&pod.client()).await, 200);

    // A malformed file (empty password) keeps the last good credential.
    pod.rotate_credentials("").unwrap();
    let c = as_user(&pod, "second-pw");
    // The watch has seen the bad file once it has warned about it.
    let warned = || async {
        let log = pod.agent_log();
        if log.contains("credentials file unusable") {
            Ok(())
        } else {
            Err(log)
        }
    };
    eventually("a warning about the bad file", DEADLINE, warned).await;
    assert_eq!(status(&c).await, 200, "the last good credential stays");
    assert_eq!(pod.agent_pid(), pid, "the agent was never restarted");
}
