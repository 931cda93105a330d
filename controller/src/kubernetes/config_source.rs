//! The config source: the `HAProxyConfig` resource and the ConfigMaps and Secrets it names.
//!
//! Owns the pure [`build`] (spec + lookups → file set, or a [`SpecError`] whose reason is
//! `MissingReference` or `InvalidSpec`), the pure [`references`] (which ConfigMaps and Secrets a
//! spec names), and the [`Stores`] that hold the resource and exactly the objects it references.
//! It must never watch, settle or publish ([`super::feed`] does), nor read objects outside its
//! namespace or list a kind wholesale.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use haptic_protocol::RelPath;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};

use super::crd::{pod_selector, HAProxyConfig, HAProxyConfigSpec};
use super::watch::Named;

/// Why the resource is not a render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// `MissingReference` or `InvalidSpec` (the `Validated` condition's reason).
    pub reason: &'static str,
    /// The field of the resource at fault (`spec.files[0].path`; `spec` for the whole).
    pub field: String,
    /// What is wrong, naming the field and object (the condition's message).
    pub message: String,
}

impl SpecError {
    /// A referenced object (or key) at `field` is missing.
    pub fn missing(field: impl Into<String>, message: String) -> Self {
        Self { reason: "MissingReference", field: field.into(), message }
    }
    /// The spec cannot be rendered as written: `field` is at fault.
    pub fn invalid(field: impl Into<String>, message: String) -> Self {
        Self { reason: "InvalidSpec", field: field.into(), message }
    }
}

/// Reads named objects of the namespace.
pub trait Lookup {
    /// A ConfigMap by name.
    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>>;
    /// A Secret by name.
    fn secret(&self, name: &str) -> Option<Arc<Secret>>;
}

/// One key of a ConfigMap (text or binary data), with `field` named when it is missing.
pub fn config_map_key(l: &dyn Lookup, name: &str, key: &str, field: &str) -> Result<Vec<u8>, SpecError> {
    let cm =
        l.config_map(name).ok_or_else(|| SpecError::missing(field, format!("{field}: ConfigMap {name} not found")))?;
    if let Some(t) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Ok(t.as_bytes().to_vec());
    }
    if let Some(b) = cm.binary_data.as_ref().and_then(|d| d.get(key)) {
        return Ok(b.0.clone());
    }
    Err(SpecError::missing(field, format!("{field}: ConfigMap {name} has no key {key:?}")))
}

/// Builds the file set of a spec with `config` or `configFrom`: `haproxy.cfg`, then every file.
pub fn build(spec: &HAProxyConfigSpec, l: &dyn Lookup) -> Result<BTreeMap<RelPath, Vec<u8>>, SpecError> {
    pod_selector(&spec.pod_selector).map_err(|e| SpecError::invalid("spec.podSelector", e))?;
    let cfg = match (&spec.config, &spec.config_from, &spec.render) {
        (Some(text), None, None) => text.as_bytes().to_vec(),
        (None, Some(from), None) => {
            let r = &from.config_map_key_ref;
            config_map_key(l, &r.name, &r.key, "spec.configFrom.configMapKeyRef")?
        }
        (None, None, None) => {
            return Err(SpecError::invalid("spec", "set spec.config, spec.configFrom or spec.render".into()))
        }
        (None, None, Some(_)) => {
            return Err(SpecError::invalid("spec.render", "spec.render is rendered from cluster objects".into()))
        }
        _ => {
            return Err(SpecError::invalid(
                "spec",
                "set only one of spec.config, spec.configFrom and spec.render".into(),
            ))
        }
    };
    let mut files = BTreeMap::from([(RelPath::haproxy_cfg(), cfg)]);
    add_files(spec, l, &mut files)?;
    Ok(files)
}

/// Adds the spec's `files` to `files` (a path already there is refused).
pub fn add_files(
    spec: &HAProxyConfigSpec,
    l: &dyn Lookup,
    files: &mut BTreeMap<RelPath, Vec<u8>>,
) -> Result<(), SpecError> {
    for (i, f) in spec.files.iter().enumerate() {
        let field = format!("spec.files[{i}]");
        let path = RelPath::new(&f.path)
            .map_err(|e| SpecError::invalid(format!("{field}.path"), format!("{field}.path {:?}: {e}", f.path)))?;
        if path.is_haproxy_cfg() {
            return Err(SpecError::invalid(
                format!("{field}.path"),
                format!("{field}.path: haproxy.cfg comes from the spec's source"),
            ));
        }
        let sources = [f.config_map_key_ref.is_some(), f.secret_ref.is_some(), f.content.is_some()];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(SpecError::invalid(
                &field,
                format!("{field} ({}): set exactly one of configMapKeyRef, secretRef, content", f.path),
            ));
        }
        let bytes = if let Some(r) = &f.config_map_key_ref {
            config_map_key(l, &r.name, &r.key, &format!("{field}.configMapKeyRef"))?
        } else if let Some(r) = &f.secret_ref {
            let s = l.secret(&r.name).ok_or_else(|| {
                SpecError::missing(
                    format!("{field}.secretRef"),
                    format!("{field}.secretRef: Secret {} not found", r.name),
                )
            })?;
            secret_file(&s, r.key.as_deref())
                .map_err(|why| SpecError::missing(format!("{field}.secretRef"), format!("{field}.secretRef: {why}")))?
        } else {
            f.content.clone().unwrap_or_default().into_bytes()
        };
        if files.insert(path, bytes).is_some() {
            return Err(SpecError::invalid(
                format!("{field}.path"),
                format!("{field}.path {:?} appears twice", f.path),
            ));
        }
    }
    Ok(())
}

/// Why a Secret is not one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretFileError {
    /// The Secret (named) lacks the key.
    NoKey(String, String),
    /// No key named and the Secret (named) is not `kubernetes.io/tls`.
    NotTls(String),
    /// The TLS Secret (named) has neither or not both of `tls.crt` and `tls.key`: the one missing.
    NoTlsKey(String, &'static str),
    /// The TLS Secret (named) is not a certificate and its key.
    Pem(String, haptic_render::pem::PemError),
}

impl std::fmt::Display for SecretFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretFileError::NoKey(name, k) => write!(f, "Secret {name} has no key {k:?}"),
            SecretFileError::NotTls(name) => {
                write!(f, "Secret {name} is not of type kubernetes.io/tls: name the key to use")
            }
            SecretFileError::NoTlsKey(name, k) => write!(f, "Secret {name} has no {k}"),
            SecretFileError::Pem(name, e) => write!(f, "Secret {name}: {e}"),
        }
    }
}

/// A Secret as one file: the `key`'s bytes (the fleet admin's choice of file), or for a
/// `kubernetes.io/tls` Secret without a key the certificate chain followed by the private key
/// (one PEM, as HAProxy's `crt` wants it), parsed, checked and re-encoded by
/// [`haptic_render::pem`].
pub fn secret_file(s: &Secret, key: Option<&str>) -> Result<Vec<u8>, SecretFileError> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let data = s.data.clone().unwrap_or_default();
    if let Some(k) = key {
        return data.get(k).map(|b| b.0.clone()).ok_or_else(|| SecretFileError::NoKey(name, k.to_string()));
    }
    if s.type_.as_deref() != Some("kubernetes.io/tls") {
        return Err(SecretFileError::NotTls(name));
    }
    let crt = data.get("tls.crt").ok_or_else(|| SecretFileError::NoTlsKey(name.clone(), "tls.crt"))?;
    let key = data.get("tls.key").ok_or_else(|| SecretFileError::NoTlsKey(name.clone(), "tls.key"))?;
    haptic_render::pem::certified(&crt.0, &key.0).map(|f| f.pem).map_err(|e| SecretFileError::Pem(name, e))
}

/// The names of the objects a spec references: every ConfigMap and Secret a render reads, and
/// the agents' credentials Secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMap names.
    pub config_maps: BTreeSet<String>,
    /// Secret names.
    pub secrets: BTreeSet<String>,
}

/// What `spec` references (pure).
pub fn references(spec: &HAProxyConfigSpec) -> References {
    let mut r = References::default();
    if let Some(from) = &spec.config_from {
        r.config_maps.insert(from.config_map_key_ref.name.clone());
    }
    if let Some(t) = spec.render.as_ref().and_then(|r| r.template.as_ref()) {
        r.config_maps.insert(t.config_map_key_ref.name.clone());
    }
    if let Some(d) = spec.render.as_ref().and_then(|r| r.default_certificate.as_ref()) {
        r.secrets.insert(d.name.clone());
    }
    for f in &spec.files {
        if let Some(k) = &f.config_map_key_ref {
            r.config_maps.insert(k.name.clone());
        }
        if let Some(s) = &f.secret_ref {
            r.secrets.insert(s.name.clone());
        }
    }
    r.secrets.insert(spec.agent.credentials_secret_ref.name.clone());
    r
}

/// The reflector stores: the resource (by name) and what its spec references.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The referenced ConfigMaps.
    pub config_maps: Named<ConfigMap>,
    /// The referenced Secrets (and the agents' credentials Secret).
    pub secrets: Named<Secret>,
    /// The `HAProxyConfig` (a watch of its name only).
    pub configs: Store<HAProxyConfig>,
    namespace: String,
}

impl Lookup for Stores {
    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
        self.config_maps.get(&self.namespace, name)
    }
    fn secret(&self, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&self.namespace, name)
    }
}

impl Stores {
    /// Empty stores for `namespace`, and the writer of the resource's store.
    pub fn new(namespace: &str) -> (Self, Writer<HAProxyConfig>) {
        let (configs, writer) = reflector::store();
        let s = Stores {
            config_maps: Named::default(),
            secrets: Named::default(),
            configs,
            namespace: namespace.to_string(),
        };
        (s, writer)
    }

    /// The watched resource, if it exists.
    pub fn config(&self, name: &str) -> Option<Arc<HAProxyConfig>> {
        self.configs.get(&ObjectRef::new(name).within(&self.namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    #[derive(Default)]
    struct Fake {
        cms: BTreeMap<String, Arc<ConfigMap>>,
        secrets: BTreeMap<String, Arc<Secret>>,
    }

    impl Lookup for Fake {
        fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
            self.cms.get(name).cloned()
        }
        fn secret(&self, name: &str) -> Option<Arc<Secret>> {
            self.secrets.get(name).cloned()
        }
    }

    fn spec(v: serde_json::Value) -> HAProxyConfigSpec {
        let mut base = json!({"podSelector": {"matchLabels": {"app": "haproxy"}}});
        base.as_object_mut().unwrap().extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn builds_from_every_source_and_names_what_is_missing() {
        let mut f = Fake::default();
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cfg"},
            "data": {"haproxy.cfg": "global\n", "hosts.map": "a b\n"}}))
        .unwrap();
        f.cms.insert("cfg".into(), Arc::new(cm));
        let mut tls = Secret::default();
        tls.metadata.name = Some("site".into());
        tls.type_ = Some("kubernetes.io/tls".into());
        let pair = rcgen::generate_simple_self_signed(vec!["site.example.com".into()]).unwrap();
        let (crt, key) = (pair.cert.pem(), pair.signing_key.serialize_pem());
        tls.data = Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(format!("# text around\n{crt}").into_bytes())),
            ("tls.key".to_string(), ByteString(key.clone().into_bytes())),
        ]));
        f.secrets.insert("site".into(), Arc::new(tls));
        let s = spec(json!({
            "configFrom": {"configMapKeyRef": {"name": "cfg", "key": "haproxy.cfg"}},
            "files": [
                {"path": "maps/hosts.map", "configMapKeyRef": {"name": "cfg", "key": "hosts.map"}},
                {"path": "certs/site.pem", "secretRef": {"name": "site"}},
                {"path": "errors/503.http", "content": "HTTP/1.0 503\r\n\r\n"},
            ],
        }));
        let files = build(&s, &f).unwrap();
        let get = |p: &str| String::from_utf8(files[&RelPath::new(p).unwrap()].clone()).unwrap();
        assert_eq!(get("haproxy.cfg"), "global\n");
        assert_eq!(get("maps/hosts.map"), "a b\n");
        assert_eq!(get("certs/site.pem"), format!("{crt}{key}").replace("\r\n", "\n"), "re-encoded, text dropped");
        assert_eq!(get("errors/503.http"), "HTTP/1.0 503\r\n\r\n");

        let missing = spec(json!({"config": "global\n",
            "files": [{"path": "maps/x.map", "configMapKeyRef": {"name": "nope", "key": "k"}}]}));
        let e = build(&missing, &f).unwrap_err();
        assert_eq!((e.reason, e.field.as_str()), ("MissingReference", "spec.files[0].configMapKeyRef"));
        let bad_key = spec(json!({"configFrom": {"configMapKeyRef": {"name": "cfg", "key": "other"}}}));
        let e = build(&bad_key, &f).unwrap_err();
        assert_eq!((e.reason, e.field.as_str()), ("MissingReference", "spec.configFrom.configMapKeyRef"));
    }

    #[test]
    fn references_name_every_config_map_and_secret_a_render_reads_and_the_credentials() {
        let s = spec(json!({
            "configFrom": {"configMapKeyRef": {"name": "cfg", "key": "haproxy.cfg"}},
            "agent": {"credentialsSecretRef": {"name": "creds"}},
            "files": [
                {"path": "maps/a.map", "configMapKeyRef": {"name": "maps", "key": "a"}},
                {"path": "maps/b.map", "configMapKeyRef": {"name": "cfg", "key": "b"}},
                {"path": "certs/site.pem", "secretRef": {"name": "site"}},
                {"path": "errors/503.http", "content": "x"},
            ],
        }));
        let r = references(&s);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(r.config_maps, set(&["cfg", "maps"]));
        assert_eq!(r.secrets, set(&["creds", "site"]));
        let inline = references(&spec(json!({"config": "global\n"})));
        assert!(inline.config_maps.is_empty());
        assert_eq!(inline.secrets, set(&["haptic-agent-credentials"]), "the default credentials Secret");
    }

    #[test]
    fn refuses_bad_specs_with_the_field_named() {
        let f = Fake::default();
        for (v, field) in [
            (json!({}), "spec"),
            (json!({"config": "g", "render": {}}), "spec"),
            (json!({"render": {}}), "spec.render"),
            (json!({"config": "g", "files": [{"path": "../x", "content": "x"}]}), "spec.files[0].path"),
            (json!({"config": "g", "files": [{"path": "haproxy.cfg", "content": "x"}]}), "spec.files[0].path"),
            (json!({"config": "g", "files": [{"path": "a"}]}), "spec.files[0]"),
            (
                json!({"config": "g", "files": [{"path": "a", "content": "1"}, {"path": "a", "content": "2"}]}),
                "spec.files[1].path",
            ),
            (
                json!({"config": "g", "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}),
                "spec.podSelector",
            ),
        ] {
            let e = build(&spec(v.clone()), &f).unwrap_err();
            assert_eq!((e.reason, e.field.as_str()), ("InvalidSpec", field), "{v}: {e:?}");
        }
        let mut opaque = Secret::default();
        opaque.metadata.name = Some("o".into());
        assert_eq!(secret_file(&opaque, None), Err(SecretFileError::NotTls("o".into())));
        assert_eq!(secret_file(&opaque, Some("k")), Err(SecretFileError::NoKey("o".into(), "k".into())));
        opaque.type_ = Some("kubernetes.io/tls".into());
        assert_eq!(secret_file(&opaque, None), Err(SecretFileError::NoTlsKey("o".into(), "tls.crt")));
    }
}
