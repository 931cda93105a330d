//! The controller's side of a credential rotation, against a real agent process on 127.0.0.1
//! (real HAProxy 2.6, 3.0, 3.2 and 3.4): after `set_credentials`, an agent still on the previous
//! credential is reached with the previous one; once the agent has the new one, the new one is
//! used; a client that never knew the previous credential is refused.

use std::time::Duration;

use haptic_controller::client::{AgentClient, Credentials};
use haptic_controller::seams::Endpoint;
use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::wait::poll;
use haptic_e2e::{on_each_version, HaproxyBin};

fn creds(pw: &str) -> Credentials {
    Credentials { user: "haptic".into(), password: pw.into() }
}

on_each_version!(the_previous_credential_reaches_agents_that_have_not_caught_up);

async fn the_previous_credential_reaches_agents_that_have_not_caught_up(bin: HaproxyBin) {
    println!("--- {}", bin.label());
    // No grace on the agent: the old credential stops working the moment the file changes,
    // so every success below is the credential the agent holds.
    let opts = PodOpts {
        credentials: Some(("haptic".into(), "old-pw".into())),
        extra_args: vec!["--credentials-poll".into(), "200ms".into(), "--credentials-grace".into(), "0s".into()],
        ..PodOpts::default()
    };
    let mut pod = Pod::start(&bin, opts).await.unwrap();
    let ep = Endpoint { name: "pod-0".into(), url: pod.url() };
    let client = AgentClient::new(creds("old-pw"), Duration::from_secs(10)).unwrap();
    client.state(&ep, false).await.expect("the agent's own credential");

    // The Secret rotates: the controller has the new credential, the agent does not yet.
    client.set_credentials(creds("new-pw"));
    client.state(&ep, false).await.expect("the previous credential as the fallback");
    let fresh = AgentClient::new(creds("new-pw"), Duration::from_secs(10)).unwrap();
    let err = fresh.state(&ep, false).await.unwrap_err();
    assert!(err.to_string().contains("401"), "without a previous credential the agent refuses: {err}");

    // The agent catches up: the new credential works on its own.
    pod.rotate_credentials("new-pw").unwrap();
    poll("the agent to take the new credential", Duration::from_secs(60), || async {
        fresh.state(&ep, false).await.map(|_| ()).map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", pod.agent_log()));
    client.state(&ep, false).await.expect("the rotated client after the agent caught up");
    assert_eq!(client.credentials(), creds("new-pw"));
}
