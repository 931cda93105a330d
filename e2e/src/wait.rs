//! Owns waiting on state with a deadline, the one way the tests wait: poll a check until it
//! holds or the deadline passes, and say what was awaited and why it did not hold yet.
//!
//! It must never decide a verdict from elapsed time: a deadline only turns "never happened"
//! into a failure with the last reason.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How long between two polls.
const POLL_EVERY: Duration = Duration::from_millis(25);

/// Polls `check` until it returns `Ok`; after `timeout`, fails with `what` and the last `Err`
/// (why the state did not hold yet).
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!("timed out after {timeout:?} waiting for {what}; last: {last}"))
            }
            Err(_) => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// [`poll`] that panics on the deadline, for test bodies.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll(what, timeout, check).await.unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_value_that_holds_and_names_the_last_reason_on_timeout() {
        let mut n = 0;
        let got = poll("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move {
                if n >= 3 {
                    Ok(n)
                } else {
                    Err(format!("n is {n}"))
                }
            }
        })
        .await;
        assert_eq!(got, Ok(3));
        let err = poll::<(), _, _>("never", Duration::from_secs(1), || async { Err("still no".to_string()) })
            .await
            .unwrap_err();
        assert!(err.contains("waiting for never; last: still no"), "{err}");
    }
}
