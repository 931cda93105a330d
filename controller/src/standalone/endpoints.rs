//! The `--agent URL` list as an endpoint source.
//!
//! Owns turning URLs into named endpoints. It must never probe the agents (an unreachable
//! agent is a failed pod in status, not a missing endpoint).

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::seams::{Endpoint, EndpointSource};

/// A fixed endpoint list.
#[derive(Debug)]
pub struct StaticEndpoints {
    initial: Option<Vec<Endpoint>>,
}

impl StaticEndpoints {
    /// Builds the list from agent URLs; refuses URLs that are not `http://host:port[/]`.
    pub fn new(urls: &[String]) -> Result<Self, String> {
        let mut eps = Vec::new();
        for u in urls {
            let url = u.trim_end_matches('/').to_string();
            let name = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))
                .ok_or_else(|| format!("agent URL {u:?} must start with http:// or https://"))?
                .to_string();
            if name.is_empty() || name.contains('/') {
                return Err(format!("agent URL {u:?} must be scheme://host:port with no path"));
            }
            if eps.iter().any(|e: &Endpoint| e.name == name) {
                return Err(format!("agent URL {u:?} is listed twice"));
            }
            eps.push(Endpoint { name, url });
        }
        if eps.is_empty() {
            return Err("at least one --agent URL is needed".into());
        }
        Ok(Self { initial: Some(eps) })
    }
}

impl EndpointSource for StaticEndpoints {
    fn next(&mut self) -> BoxFuture<'_, Option<Vec<Endpoint>>> {
        let first = self.initial.take();
        async move {
            match first {
                Some(eps) => Some(eps),
                None => futures::future::pending().await,
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_refusals() {
        let s = StaticEndpoints::new(&["http://127.0.0.1:9301/".into(), "http://127.0.0.1:9302".into()]).unwrap();
        let eps = s.initial.unwrap();
        assert_eq!(eps[0].name, "127.0.0.1:9301");
        assert_eq!(eps[0].url, "http://127.0.0.1:9301");
        assert!(StaticEndpoints::new(&[]).is_err());
        assert!(StaticEndpoints::new(&["127.0.0.1:1".into()]).is_err());
        assert!(StaticEndpoints::new(&["http://a:1/x".into()]).is_err());
        assert!(StaticEndpoints::new(&["http://a:1".into(), "http://a:1/".into()]).is_err());
    }
}
