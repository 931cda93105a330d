//! The agents' serving certificates in Kubernetes mode.
//!
//! Owns the pure renewal rule ([`renewal`]: keep, a new serving certificate, or a new CA, from the
//! validity the Secrets record), making a CA and a serving certificate for the fixed agent name
//! ([`issue_ca`], [`issue_cert`]), and the shell ([`run`]) that keeps the serving Secret current
//! when the controller issues (`--agent-tls-issue`) and gives the agent client the Secret's
//! `ca.crt` whenever it changes (with or without issuing: cert-manager may write the Secret).
//!
//! The serving Secret (`kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`) is what the agents
//! mount; the CA's key lives only in a second Secret (`<name>-ca`) that no pod mounts. A new CA
//! is published beside the previous one in `ca.crt`, so agents still serving a certificate of the
//! previous CA stay trusted while their mounted Secret catches up. Both Secrets belong to the
//! `HAProxyConfig` (owner reference), so deleting it (or `helm uninstall`) removes them; Secrets
//! owned by anything else are replaced. It must never deploy nor talk to an agent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent_tls::AgentTrust;

/// How long a CA the controller makes is valid.
pub const CA_LIFETIME: time::Duration = time::Duration::days(5 * 365);
/// A CA is replaced when less than this is left.
pub const CA_RENEW_BEFORE: time::Duration = time::Duration::days(365);
/// How long a serving certificate is valid.
pub const CERT_LIFETIME: time::Duration = time::Duration::days(90);
/// A serving certificate is replaced when less than this is left.
pub const CERT_RENEW_BEFORE: time::Duration = time::Duration::days(30);
/// How often the Secrets are read again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// Annotation on both Secrets: the end of the CA's validity (RFC 3339).
pub const CA_NOT_AFTER: &str = "haptic.dev/ca-not-after";
/// Annotation on the serving Secret: the end of the serving certificate's validity (RFC 3339).
pub const CERT_NOT_AFTER: &str = "haptic.dev/cert-not-after";
/// Annotation on the serving Secret: the DNS name its certificate carries.
pub const SERVER_NAME: &str = "haptic.dev/server-name";
/// The CA Secret's keys.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";

/// What the Secrets record of the current CA and serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The CA's end of validity (`None`: no usable CA Secret).
    pub ca_not_after: Option<OffsetDateTime>,
    /// The serving certificate's end of validity and the name it carries (`None`: no usable
    /// serving Secret, or one of another CA).
    pub cert: Option<(OffsetDateTime, String)>,
}

/// What the issuer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Everything is valid for long enough.
    Keep,
    /// A new serving certificate from the current CA.
    NewCert,
    /// A new CA, then a new serving certificate from it.
    NewCa,
}

/// The renewal rule: a CA missing or with less than [`CA_RENEW_BEFORE`] left is replaced; a
/// serving certificate missing, for another name, outliving its CA, or with less than
/// [`CERT_RENEW_BEFORE`] left is reissued.
pub fn renewal(now: OffsetDateTime, r: &Recorded, server_name: &str) -> Renewal {
    let Some(ca) = r.ca_not_after.filter(|t| *t - now > CA_RENEW_BEFORE) else { return Renewal::NewCa };
    match &r.cert {
        Some((t, name)) if name == server_name && *t - now > CERT_RENEW_BEFORE && *t <= ca => Renewal::Keep,
        _ => Renewal::NewCert,
    }
}

/// A CA's certificate and key, PEM.
#[derive(Clone)]
pub struct Ca {
    /// The certificate.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
    /// Its end of validity.
    pub not_after: OffsetDateTime,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("not_after", &self.not_after).finish_non_exhaustive()
    }
}

/// A CA's parameters. Its subject names its end of validity, so each CA has a name of its own
/// (a certificate of another CA is then an unknown issuer, never a bad signature), and the
/// issuer can be rebuilt from what the CA Secret records.
fn ca_params(not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, format!("haptic agent CA {}", not_after.unix_timestamp()));
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_before = not_before;
    p.not_after = not_after;
    p
}

/// A new CA valid from an hour before `now` for [`CA_LIFETIME`].
pub fn issue_ca(now: OffsetDateTime) -> Result<Ca, rcgen::Error> {
    let key = KeyPair::generate()?;
    // Whole seconds: the end of validity is recorded in RFC 3339 and names the CA.
    let not_after = (now + CA_LIFETIME).replace_nanosecond(0).unwrap_or(now + CA_LIFETIME);
    let cert = ca_params(now - time::Duration::hours(1), not_after).self_signed(&key)?;
    Ok(Ca { cert_pem: cert.pem(), key_pem: key.serialize_pem(), not_after })
}

/// A serving certificate for `server_name` signed by `ca`, valid for [`CERT_LIFETIME`] (never
/// beyond the CA); returns (certificate PEM, key PEM, end of validity).
pub fn issue_cert(
    ca: &Ca,
    server_name: &str,
    now: OffsetDateTime,
) -> Result<(String, String, OffsetDateTime), rcgen::Error> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    // The issuer's name and key identifier are those of `ca_params`, as in the CA certificate.
    let issuer = Issuer::new(ca_params(now, ca.not_after), ca_key);
    let mut p = CertificateParams::new(vec![server_name.to_string()])?;
    p.distinguished_name.push(DnType::CommonName, server_name);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = now - time::Duration::hours(1);
    let not_after = (now + CERT_LIFETIME).min(ca.not_after);
    p.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

fn annotation(s: &Secret, key: &str) -> Option<String> {
    s.metadata.annotations.as_ref()?.get(key).cloned()
}

fn time_of(s: &Secret, key: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(&annotation(s, key)?, &time::format_description::well_known::Rfc3339).ok()
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn data(s: &Secret, key: &str) -> Option<String> {
    String::from_utf8(s.data.as_ref()?.get(key)?.0.clone()).ok().filter(|t| !t.is_empty())
}

/// The CA a CA Secret holds, if it holds a whole one.
pub fn ca_of(s: &Secret) -> Option<Ca> {
    Some(Ca { cert_pem: data(s, CA_CERT)?, key_pem: data(s, CA_KEY)?, not_after: time_of(s, CA_NOT_AFTER)? })
}

/// Whether `s` belongs to the object with `uid`.
fn owned_by(s: &Secret, uid: &str) -> bool {
    s.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| o.uid == uid))
}

/// What the two Secrets owned by `owner_uid` record (a serving Secret of another CA, or a
/// Secret of another owner, counts as none).
pub fn recorded(ca: Option<&Secret>, serving: Option<&Secret>, owner_uid: &str) -> Recorded {
    let ca = ca.filter(|s| owned_by(s, owner_uid)).and_then(ca_of);
    let cert = serving.filter(|s| owned_by(s, owner_uid)).and_then(|s| {
        let same_ca = ca.as_ref().is_some_and(|c| time_of(s, CA_NOT_AFTER) == Some(c.not_after));
        let whole = data(s, "tls.crt").is_some() && data(s, "tls.key").is_some();
        (same_ca && whole).then(|| Some((time_of(s, CERT_NOT_AFTER)?, annotation(s, SERVER_NAME)?))).flatten()
    });
    Recorded { ca_not_after: ca.map(|c| c.not_after), cert }
}

/// `ca.crt` of the serving Secret: the current CA, then the previous one while it is valid.
pub fn bundle(current: &Ca, previous: Option<&Ca>, now: OffsetDateTime) -> String {
    let mut b = current.cert_pem.clone();
    if let Some(p) = previous.filter(|p| p.not_after > now && p.cert_pem != current.cert_pem) {
        b.push_str(&p.cert_pem);
    }
    b
}

fn secret(
    name: &str,
    owner: &OwnerReference,
    type_: &str,
    annotations: BTreeMap<String, String>,
    data: &[(&str, &str)],
) -> Secret {
    let mut s = Secret::default();
    s.metadata.owner_references = Some(vec![owner.clone()]);
    s.metadata.name = Some(name.to_string());
    s.metadata.annotations = Some(annotations);
    s.metadata.labels =
        Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "haptic-controller".to_string())]));
    s.type_ = Some(type_.to_string());
    s.data = Some(data.iter().map(|(k, v)| ((*k).to_string(), ByteString(v.as_bytes().to_vec()))).collect());
    s
}

/// Creates `new`, or replaces `old` with it at `old`'s resourceVersion (a concurrent writer makes
/// this fail; the next pass reads again).
async fn put(api: &Api<Secret>, old: Option<&Secret>, mut new: Secret) -> Result<(), kube::Error> {
    let pp = PostParams::default();
    match old {
        None => api.create(&pp, &new).await.map(|_| ()),
        Some(o) => {
            new.metadata.resource_version = o.metadata.resource_version.clone();
            let name = new.metadata.name.clone().unwrap_or_default();
            api.replace(&name, &pp, &new).await.map(|_| ())
        }
    }
}

/// One pass of the issuer over the serving Secret `name` and its CA Secret `<name>-ca`.
async fn issue_pass(
    api: &Api<Secret>,
    name: &str,
    server_name: &str,
    owner: Option<OwnerReference>,
) -> Result<(), String> {
    let owner = owner.ok_or("waiting for the HAProxyConfig, which owns the agents' TLS Secrets")?;
    let ca_name = format!("{name}-ca");
    let get = |n: String| async move { api.get_opt(&n).await.map_err(|e| format!("get Secret {n}: {e}")) };
    let ca_secret = get(ca_name.clone()).await?;
    let serving = get(name.to_string()).await?;
    let now = OffsetDateTime::now_utc();
    let r = recorded(ca_secret.as_ref(), serving.as_ref(), &owner.uid);
    let step = renewal(now, &r, server_name);
    if step == Renewal::Keep {
        return Ok(());
    }
    let previous = ca_secret.as_ref().filter(|s| owned_by(s, &owner.uid)).and_then(ca_of);
    let ca = match (step, &previous) {
        (Renewal::NewCert, Some(c)) => c.clone(),
        _ => {
            let ca = issue_ca(now).map_err(|e| format!("make a CA: {e}"))?;
            let ann = BTreeMap::from([(CA_NOT_AFTER.to_string(), rfc3339(ca.not_after))]);
            let s = secret(&ca_name, &owner, "Opaque", ann, &[(CA_CERT, &ca.cert_pem), (CA_KEY, &ca.key_pem)]);
            put(api, ca_secret.as_ref(), s).await.map_err(|e| format!("write Secret {ca_name}: {e}"))?;
            info!(secret = %ca_name, not_after = %rfc3339(ca.not_after), "made a new agent CA");
            ca
        }
    };
    let (cert, key, not_after) = issue_cert(&ca, server_name, now).map_err(|e| format!("make a certificate: {e}"))?;
    let ann = BTreeMap::from([
        (CA_NOT_AFTER.to_string(), rfc3339(ca.not_after)),
        (CERT_NOT_AFTER.to_string(), rfc3339(not_after)),
        (SERVER_NAME.to_string(), server_name.to_string()),
    ]);
    let b = bundle(&ca, previous.as_ref(), now);
    let s = secret(name, &owner, "kubernetes.io/tls", ann, &[("tls.crt", &cert), ("tls.key", &key), (CA_CERT, &b)]);
    put(api, serving.as_ref(), s).await.map_err(|e| format!("write Secret {name}: {e}"))?;
    info!(secret = %name, %server_name, not_after = %rfc3339(not_after), "issued the agents' serving certificate");
    Ok(())
}

/// Until `shutdown`: every [`RECHECK`], issues into the serving Secret `name` when `issue` (owned
/// by what `owner` gives), then gives `trust` its `ca.crt` when that changed. Failures are logged
/// and tried again.
pub async fn run(
    api: Api<Secret>,
    name: String,
    server_name: String,
    issue: bool,
    owner: impl Fn() -> Option<OwnerReference> + Send,
    trust: Arc<AgentTrust>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(RECHECK);
    let mut last_error = String::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pass = async {
            if issue {
                issue_pass(&api, &name, &server_name, owner()).await?;
            }
            let s = api.get_opt(&name).await.map_err(|e| format!("get Secret {name}: {e}"))?;
            let Some(pem) = s.as_ref().and_then(|s| data(s, CA_CERT)) else {
                return Err(format!("Secret {name} has no ca.crt yet: every agent is refused until it does"));
            };
            if trust.set_ca(pem.as_bytes()).map_err(|e| format!("Secret {name}: {e}"))? {
                info!(secret = %name, "trusting the agent CA bundle of the Secret");
            }
            Ok::<_, String>(())
        };
        match pass.await {
            Ok(()) => last_error.clear(),
            Err(e) => {
                if e != last_error {
                    warn!("agent TLS: {e}");
                    last_error = e;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(days: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000 + days)
    }

    #[test]
    fn renewal_rule() {
        let name = "haptic-agent.edge.svc";
        let now = at(0);
        let fresh = Recorded { ca_not_after: Some(at(1000)), cert: Some((at(80), name.into())) };
        assert_eq!(renewal(now, &fresh, name), Renewal::Keep);
        assert_eq!(renewal(now, &Recorded { ca_not_after: None, cert: None }, name), Renewal::NewCa);
        // The CA's last year: a new CA (and so a new certificate).
        assert_eq!(renewal(now, &Recorded { ca_not_after: Some(at(300)), ..fresh.clone() }, name), Renewal::NewCa);
        // The certificate's last 30 days, none, another name, or outliving the CA.
        assert_eq!(
            renewal(now, &Recorded { cert: Some((at(29), name.into())), ..fresh.clone() }, name),
            Renewal::NewCert
        );
        assert_eq!(renewal(now, &Recorded { cert: None, ..fresh.clone() }, name), Renewal::NewCert);
        assert_eq!(renewal(now, &fresh, "other.edge.svc"), Renewal::NewCert);
        let outliving = Recorded { ca_not_after: Some(at(400)), cert: Some((at(401), name.into())) };
        assert_eq!(renewal(now, &outliving, name), Renewal::NewCert);
    }

    #[test]
    fn a_serving_certificate_chains_to_its_ca_for_the_fixed_name() {
        let now = OffsetDateTime::now_utc();
        let ca = issue_ca(now).unwrap();
        let (cert, key, not_after) = issue_cert(&ca, "haptic-agent.edge.svc", now).unwrap();
        assert!(not_after <= ca.not_after && not_after > now + CERT_RENEW_BEFORE);
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----") && key.contains("PRIVATE KEY"));
        // The Secrets written from them read back as the same record.
        let owner = OwnerReference { uid: "u1".into(), ..OwnerReference::default() };
        let ann = BTreeMap::from([(CA_NOT_AFTER.to_string(), rfc3339(ca.not_after))]);
        let ca_s = secret("t-ca", &owner, "Opaque", ann, &[(CA_CERT, &ca.cert_pem), (CA_KEY, &ca.key_pem)]);
        let ann = BTreeMap::from([
            (CA_NOT_AFTER.to_string(), rfc3339(ca.not_after)),
            (CERT_NOT_AFTER.to_string(), rfc3339(not_after)),
            (SERVER_NAME.to_string(), "haptic-agent.edge.svc".to_string()),
        ]);
        let serving = secret(
            "t",
            &owner,
            "kubernetes.io/tls",
            ann,
            &[("tls.crt", &cert), ("tls.key", &key), (CA_CERT, &ca.cert_pem)],
        );
        let r = recorded(Some(&ca_s), Some(&serving), "u1");
        assert_eq!(renewal(now, &r, "haptic-agent.edge.svc"), Renewal::Keep, "{r:?}");
        // Secrets of another owner (a deleted HAProxyConfig's, before garbage collection): none.
        assert_eq!(recorded(Some(&ca_s), Some(&serving), "u2"), Recorded { ca_not_after: None, cert: None });
        // A serving Secret of another CA is reissued.
        let other = issue_ca(now).unwrap();
        let ann = BTreeMap::from([(CA_NOT_AFTER.to_string(), rfc3339(other.not_after + time::Duration::seconds(1)))]);
        let other_s = secret("t-ca", &owner, "Opaque", ann, &[(CA_CERT, &other.cert_pem), (CA_KEY, &other.key_pem)]);
        assert_eq!(recorded(Some(&other_s), Some(&serving), "u1").cert, None);
        // The bundle keeps the previous CA while it is valid.
        assert_eq!(bundle(&other, Some(&ca), now), format!("{}{}", other.cert_pem, ca.cert_pem));
        assert_eq!(bundle(&other, Some(&ca), ca.not_after), other.cert_pem);
    }
}

/// Real TLS on 127.0.0.1: the agent client verifies the fixed name through the trust's CA,
/// refuses a certificate of another CA or for another name with the verifier's reason, and
/// takes a new CA without a new client.
#[cfg(test)]
mod handshake {
    use super::*;
    use crate::client::{AgentClient, CallError, Credentials, TlsRefusal};
    use crate::seams::Endpoint;

    const NAME: &str = "haptic-agent.edge.svc";

    /// A TLS server answering every request with a 418 (an answer: TLS went through).
    async fn serve(cert: &str, key: &str) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let resp = "HTTP/1.1 418 I'm a teapot\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".to_string();
        haptic_e2e::tls::answering_server(cert.as_bytes(), key.as_bytes(), resp).await
    }

    fn client(trust: Arc<AgentTrust>) -> AgentClient {
        let creds = Credentials { user: "u".into(), password: "p".into() };
        AgentClient::with_trust(creds, Duration::from_secs(10), Some(trust)).unwrap()
    }

    #[tokio::test]
    async fn the_fixed_name_is_verified_and_another_ca_is_refused() {
        let now = OffsetDateTime::now_utc();
        let (ours, theirs) = (issue_ca(now).unwrap(), issue_ca(now + time::Duration::seconds(5)).unwrap());
        let (cert, key, _) = issue_cert(&ours, NAME, now).unwrap();
        let (addr, server) = serve(&cert, &key).await;
        let ep = Endpoint {
            name: "pod-0".into(),
            url: crate::agent_tls::agent_url(true, &addr.ip().to_string(), addr.port()),
        };
        // Trusting our CA: the handshake passes for the fixed name although the URL names an IP
        // (the server's 418 is an answer, so TLS went through).
        let t = AgentTrust::new(Some(NAME)).unwrap();
        t.set_ca(ours.cert_pem.as_bytes()).unwrap();
        match client(t).state(&ep, false).await {
            Err(CallError::Status { status, .. }) => assert_eq!(status.as_u16(), 418),
            other => panic!("wanted the server's answer over TLS, got {other:?}"),
        }
        // Another CA: refused, saying why.
        let t = AgentTrust::new(Some(NAME)).unwrap();
        t.set_ca(theirs.cert_pem.as_bytes()).unwrap();
        let c = client(t.clone());
        let err = c.state(&ep, false).await.unwrap_err();
        assert!(matches!(err, CallError::Connect { tls: Some(TlsRefusal::UnknownIssuer), .. }), "{err}");
        // The same client after the CA changed (a rotated bundle holding both): trusted.
        let both = format!("{}{}", theirs.cert_pem, ours.cert_pem);
        assert!(t.set_ca(both.as_bytes()).unwrap());
        assert!(matches!(c.state(&ep, false).await, Err(CallError::Status { .. })));
        // Our CA, another name: refused.
        let t = AgentTrust::new(Some("other.edge.svc")).unwrap();
        t.set_ca(ours.cert_pem.as_bytes()).unwrap();
        let err = client(t).state(&ep, false).await.unwrap_err();
        assert!(matches!(err, CallError::Connect { tls: Some(TlsRefusal::WrongName), .. }), "{err}");
        // No CA yet: refused, saying so.
        let err = client(AgentTrust::new(Some(NAME)).unwrap()).state(&ep, false).await.unwrap_err();
        assert!(matches!(err, CallError::Connect { tls: Some(TlsRefusal::NoCa), .. }), "{err}");
        server.abort();
    }
}
