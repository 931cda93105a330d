//! Renders from the `HAProxyConfig` resource and the ConfigMaps and Secrets it names.
//!
//! Owns the pure [`build`] (spec + lookups → file set, or a [`RenderError`] whose reason is
//! `MissingReference` or `InvalidSpec`), the pure [`references`] (which ConfigMaps and Secrets a
//! spec names), and the watcher that keeps the resource and exactly the objects it references
//! in reflector stores (one watch per name) and publishes each settled change as one render.
//! A change to any referenced object is a new render; an unchanged result is not republished.
//! With `spec.render` the same loop also runs [`super::cluster`]'s reflectors and renders
//! through [`super::routes`] with the slots of the newest plan a pod applied, after checking each
//! allowed snippet alone with `haproxy -c` (so a snippet HAProxy refuses refuses only its
//! Ingress, never the whole render at the gate), and, when the gate still refuses a render,
//! leaving out the objects [`super::narrowing`] names until the culprits are found. It must never
//! deploy, and outside render mode never read objects outside its namespace nor list a kind
//! wholesale.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use haptic_protocol::RelPath;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cluster::ClusterWatch;
use super::context::Context;
use super::crd::{pod_selector, HAProxyConfig, HAProxyConfigSpec};
use super::routes::{IngressOutcome, SlotHistory};
use crate::render::Render;
use crate::seams::RenderEvent;

/// Why the resource is not a render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    /// `MissingReference` or `InvalidSpec` (the `Validated` condition's reason).
    pub reason: &'static str,
    /// What is wrong, naming the field and object.
    pub message: String,
}

impl RenderError {
    /// A referenced object (or key) is missing.
    pub fn missing(message: String) -> Self {
        Self { reason: "MissingReference", message }
    }
    /// The spec cannot be rendered as written.
    pub fn invalid(message: String) -> Self {
        Self { reason: "InvalidSpec", message }
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
pub fn config_map_key(l: &dyn Lookup, name: &str, key: &str, field: &str) -> Result<Vec<u8>, RenderError> {
    let cm = l.config_map(name).ok_or_else(|| RenderError::missing(format!("{field}: ConfigMap {name} not found")))?;
    if let Some(t) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Ok(t.as_bytes().to_vec());
    }
    if let Some(b) = cm.binary_data.as_ref().and_then(|d| d.get(key)) {
        return Ok(b.0.clone());
    }
    Err(RenderError::missing(format!("{field}: ConfigMap {name} has no key {key:?}")))
}

/// Builds the file set of a spec with `config` or `configFrom`: `haproxy.cfg`, then every file.
pub fn build(spec: &HAProxyConfigSpec, l: &dyn Lookup) -> Result<BTreeMap<RelPath, Vec<u8>>, RenderError> {
    pod_selector(&spec.pod_selector).map_err(RenderError::invalid)?;
    let cfg = match (&spec.config, &spec.config_from, &spec.render) {
        (Some(text), None, None) => text.as_bytes().to_vec(),
        (None, Some(from), None) => {
            let r = &from.config_map_key_ref;
            config_map_key(l, &r.name, &r.key, "spec.configFrom.configMapKeyRef")?
        }
        (None, None, None) => {
            return Err(RenderError::invalid("set spec.config, spec.configFrom or spec.render".into()))
        }
        (None, None, Some(_)) => {
            return Err(RenderError::invalid("spec.render is rendered from cluster objects".into()))
        }
        _ => return Err(RenderError::invalid("set only one of spec.config, spec.configFrom and spec.render".into())),
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
) -> Result<(), RenderError> {
    for (i, f) in spec.files.iter().enumerate() {
        let field = format!("spec.files[{i}]");
        let path =
            RelPath::new(&f.path).map_err(|e| RenderError::invalid(format!("{field}.path {:?}: {e}", f.path)))?;
        if path.is_haproxy_cfg() {
            return Err(RenderError::invalid(format!("{field}.path: haproxy.cfg comes from the spec's source")));
        }
        let sources = [f.config_map_key_ref.is_some(), f.secret_ref.is_some(), f.content.is_some()];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(RenderError::invalid(format!(
                "{field} ({}): set exactly one of configMapKeyRef, secretRef, content",
                f.path
            )));
        }
        let bytes = if let Some(r) = &f.config_map_key_ref {
            config_map_key(l, &r.name, &r.key, &format!("{field}.configMapKeyRef"))?
        } else if let Some(r) = &f.secret_ref {
            let s = l
                .secret(&r.name)
                .ok_or_else(|| RenderError::missing(format!("{field}.secretRef: Secret {} not found", r.name)))?;
            secret_file(&s, r.key.as_deref())
                .map_err(|why| RenderError::missing(format!("{field}.secretRef: {why}")))?
        } else {
            f.content.clone().unwrap_or_default().into_bytes()
        };
        if files.insert(path, bytes).is_some() {
            return Err(RenderError::invalid(format!("{field}.path {:?} appears twice", f.path)));
        }
    }
    Ok(())
}

/// A Secret as one file: the `key`'s bytes (the fleet admin's choice of file), or for a
/// `kubernetes.io/tls` Secret without a key the certificate chain followed by the private key
/// (one PEM, as HAProxy's `crt` wants it), parsed, checked and re-encoded by
/// [`haptic_render::pem`].
pub fn secret_file(s: &Secret, key: Option<&str>) -> Result<Vec<u8>, String> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let data = s.data.clone().unwrap_or_default();
    if let Some(k) = key {
        return data.get(k).map(|b| b.0.clone()).ok_or_else(|| format!("Secret {name} has no key {k:?}"));
    }
    if s.type_.as_deref() != Some("kubernetes.io/tls") {
        return Err(format!("Secret {name} is not of type kubernetes.io/tls: name the key to use"));
    }
    let crt = data.get("tls.crt").ok_or_else(|| format!("Secret {name} has no tls.crt"))?;
    let key = data.get("tls.key").ok_or_else(|| format!("Secret {name} has no tls.key"))?;
    haptic_render::pem::certified(&crt.0, &key.0).map(|f| f.pem).map_err(|e| format!("Secret {name}: {e}"))
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

/// Reflector stores of one kind, one per referenced name: each is fed by its own watch with the
/// field selector `metadata.name=<name>`, so no other object of the namespace (Helm release
/// Secrets, unrelated ConfigMaps) is listed or cached.
pub struct Named<K: kube::Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    watches: Arc<Mutex<BTreeMap<String, Watched<K>>>>,
}

/// One name's store and the token that stops its watch.
type Watched<K> = (Store<K>, CancellationToken);

impl<K: kube::Resource + 'static> Clone for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self { watches: self.watches.clone() }
    }
}

impl<K: kube::Resource + 'static> Default for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn default() -> Self {
        Self { watches: Arc::default() }
    }
}

impl<K: kube::Resource + 'static> std::fmt::Debug for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = lock(&self.watches).keys().cloned().collect();
        f.debug_struct("Named").field("names", &names).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K> Named<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    /// The object `name` in `namespace`, if it is watched and exists.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = lock(&self.watches).get(name).map(|(s, _)| s.clone())?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Whether every one of `names` (keys) is watched and its first list has arrived.
    pub(crate) fn ready(&self, names: &BTreeSet<String>) -> bool {
        let w = lock(&self.watches);
        names.iter().all(|n| w.get(n).is_some_and(|(s, _)| ready(s)))
    }

    /// Starts a watch for each of `names` not watched yet; each of its events is sent on
    /// `changes`; all stop with `stop`.
    fn ensure(&self, api: &Api<K>, names: &BTreeSet<String>, changes: &Changes, stop: &CancellationToken) {
        self.ensure_each(names.iter().map(|n| (n.clone(), api.clone(), n.clone())), changes, stop);
    }

    /// Starts a watch for each `(key, api, name)` whose key is not watched yet.
    pub(crate) fn ensure_each(
        &self,
        wanted: impl Iterator<Item = (String, Api<K>, String)>,
        changes: &Changes,
        stop: &CancellationToken,
    ) {
        let mut w = lock(&self.watches);
        for (key, api, name) in wanted {
            if w.contains_key(&key) {
                continue;
            }
            let token = stop.child_token();
            let store = watch_one(api, &name, changes.clone(), token.clone());
            w.insert(key, (store, token));
        }
    }

    /// The object `name` in `namespace` from the watch of `key`.
    pub(crate) fn get_keyed(&self, key: &str, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = lock(&self.watches).get(key).map(|(s, _)| s.clone())?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Stops the watches of names (keys) not in `names`.
    pub(crate) fn retain(&self, names: &BTreeSet<String>) {
        lock(&self.watches).retain(|n, (_, token)| {
            let keep = names.contains(n);
            if !keep {
                token.cancel();
            }
            keep
        });
    }
}

/// One object's watch (by `metadata.name`, backing off on errors) into a store of its own.
fn watch_one<K>(api: Api<K>, name: &str, changes: Changes, stop: CancellationToken) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let what = format!("{} {name}", K::kind(&K::DynamicType::default()));
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watch_into(api, cfg, what, Change::Objects, changes, stop)
}

/// A watch (`cfg`, backing off on errors, managed fields dropped) into a store of its own;
/// each event is sent on `changes` as `kind`; it stops with `stop`.
pub(crate) fn watch_into<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: String,
    kind: Change,
    changes: Changes,
    stop: CancellationToken,
) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (reader, writer) = reflector::store();
    let mut stream =
        watcher(api, cfg).default_backoff().modify(|o| o.meta_mut().managed_fields = None).reflect(writer).boxed();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!("watching {what}: {e}"),
                    Some(Ok(_)) => if changes.unbounded_send(kind).is_err() { return },
                },
            }
        }
    });
    reader
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

/// What the resource watcher publishes.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The resource (absent: not created yet or deleted).
    pub config: Option<Arc<HAProxyConfig>>,
    /// The render of the current spec, or why there is none.
    pub render: Option<Result<Arc<Render>, RenderError>>,
    /// In render mode, the served Ingresses' verdicts and the fleet's address.
    pub ingress: Option<Arc<IngressOutcome>>,
    /// Serving a GatewayClass: every status decided (the Model left out).
    pub gateway: Option<Arc<haptic_render::gateway::GatewayOutput>>,
}

/// What was last published: the resource's generation, the render's plan id or error, and the
/// Ingress outcome.
type PublishedKey = (
    Option<i64>,
    Option<Result<haptic_protocol::PlanId, RenderError>>,
    Option<Arc<IngressOutcome>>,
    Option<Arc<haptic_render::gateway::GatewayOutput>>,
);

/// What one watch event changed: only endpoints (an EndpointSlice), or any other object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An EndpointSlice: a render of it is at most runtime server changes.
    Endpoints,
    /// The resource, an object it names, or a cluster object other than an EndpointSlice.
    Objects,
}

/// Where the watches send their events.
pub type Changes = futures::channel::mpsc::UnboundedSender<Change>;

/// The quiet windows before a burst of changes is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    /// After a change to the resource or any object but an EndpointSlice (`--settle`): long
    /// enough that a ConfigMap and the resource edited together land in one render.
    pub objects: Duration,
    /// After a burst of EndpointSlice changes only (`--endpoint-settle`, never longer than
    /// `objects`): short, so a new endpoint serves soon after it turns ready.
    pub endpoints: Duration,
}

/// How many windows a burst of changes may hold a render back at most.
pub const MAX_SETTLE_WINDOWS: u32 = 2;

/// A burst of changes being settled: pure timekeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    first: tokio::time::Instant,
    last: tokio::time::Instant,
    endpoints_only: bool,
}

impl Burst {
    /// A burst that began with `change` at `at`.
    pub fn new(at: tokio::time::Instant, change: Change) -> Self {
        Burst { first: at, last: at, endpoints_only: change == Change::Endpoints }
    }

    /// `change` joined the burst at `at`.
    pub fn add(&mut self, at: tokio::time::Instant, change: Change) {
        self.last = at;
        self.endpoints_only &= change == Change::Endpoints;
    }

    /// When the burst is rendered: a window after its last change, and never later than
    /// [`MAX_SETTLE_WINDOWS`] windows after its first, so changes that never pause still render.
    /// The window is `settle.endpoints` while the burst holds EndpointSlice changes only.
    pub fn due(&self, settle: Settle) -> tokio::time::Instant {
        let window = if self.endpoints_only { settle.endpoints.min(settle.objects) } else { settle.objects };
        (self.last + window).min(self.first + window * MAX_SETTLE_WINDOWS)
    }
}

/// Watches the resource (by name) and what its spec references, and publishes on `tx`: every
/// burst of changes settles (see [`Burst`]), then the resource is rendered and published (only when the
/// render, its error or the resource's generation changed). A changed reference starts the
/// new object's watch; the old one stops once a render of the new spec is published.
pub async fn watch_renders(
    ctx: Context,
    writer: Writer<HAProxyConfig>,
    tx: watch::Sender<Snapshot>,
    settle: Settle,
    shutdown: CancellationToken,
) {
    let name = ctx.names.config.clone();
    let s = ctx.stores.clone();
    let (changes_tx, changes_rx) = futures::channel::mpsc::unbounded::<Change>();
    let cfgs = watcher(ctx.configs(), watcher::Config::default().fields(&format!("metadata.name={name}")))
        .default_backoff()
        .reflect(writer)
        .map(|r| r.map(|_| Change::Objects).map_err(|e| e.to_string()))
        .boxed();
    let mut events = futures::stream::select(cfgs, changes_rx.map(Ok));
    let (cm_api, secret_api) = (ctx.api::<ConfigMap>(), ctx.api::<Secret>());
    let mut last: Option<PublishedKey> = None;
    let mut cluster: Option<ClusterWatch> = None;
    let mut slots = SlotHistory::default();
    let mut snippets = SnippetVerdicts::default();
    let mut narrowing = super::narrowing::GateNarrowing::default();
    let mut board = ctx.board.subscribe();
    let (mut board_open, mut again) = (true, false);
    loop {
        // Render again at once when a narrowing moved on; else wait for a change, or for the
        // gate's verdict a narrowing waits on.
        let mut change = Change::Objects;
        if !std::mem::take(&mut again) {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = board.changed(), if board_open => {
                    if r.is_err() {
                        board_open = false;
                        continue;
                    }
                    if !narrowing.on_gate(&ctx.board.snapshot().gate) {
                        continue;
                    }
                }
                ev = events.next() => match ev {
                    None => return,
                    Some(Err(e)) => { warn!("watching HAProxyConfig {name}: {e}"); continue; }
                    Some(Ok(c)) => change = c,
                },
            }
        }
        // Settle: let a burst of changes (a ConfigMap and the resource together) land, but
        // never wait out a stream of them (EndpointSlices while a Deployment scales).
        let mut burst = Burst::new(tokio::time::Instant::now(), change);
        let quiet = tokio::time::sleep_until(burst.due(settle));
        tokio::pin!(quiet);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = &mut quiet => break,
                ev = events.next() => match ev {
                    None => return,
                    Some(ev) => {
                        burst.add(tokio::time::Instant::now(), ev.unwrap_or(Change::Objects));
                        quiet.as_mut().reset(burst.due(settle));
                    }
                },
            }
        }
        // Every raw watch event (also a list's end) comes through here, so a store that is
        // not synced yet is checked again on its own next event.
        if !ready(&s.configs) {
            continue;
        }
        let config = s.config(&name);
        let refs = config.as_ref().map(|c| references(&c.spec)).unwrap_or_default();
        s.config_maps.ensure(&cm_api, &refs.config_maps, &changes_tx, &shutdown);
        s.secrets.ensure(&secret_api, &refs.secrets, &changes_tx, &shutdown);
        if !(s.config_maps.ready(&refs.config_maps) && s.secrets.ready(&refs.secrets)) {
            continue;
        }
        // Render mode: the cluster-wide reflectors run while the spec has `render`.
        let render_spec = config.as_ref().and_then(|c| c.spec.render.clone());
        let want_gateway = render_spec.as_ref().is_some_and(|r| r.gateway_class_name.is_some());
        match (&render_spec, &cluster) {
            (Some(_), Some(cw)) if cw.is_gateway() != want_gateway => {
                cluster = Some(ClusterWatch::start(&ctx.client, &changes_tx, &shutdown, want_gateway))
            }
            (Some(_), None) => cluster = Some(ClusterWatch::start(&ctx.client, &changes_tx, &shutdown, want_gateway)),
            (None, Some(_)) => cluster = None,
            _ => {}
        }
        let mut ingress = None;
        let mut gateway = None;
        let render = match (config.as_ref(), render_spec.as_ref(), cluster.as_ref()) {
            (None, _, _) => None,
            (Some(c), Some(r), Some(cw)) => {
                if !cw.ready() {
                    continue;
                }
                let mut objects = cw.objects();
                let refs = if want_gateway {
                    super::routes::gateway_secret_refs(r, &objects)
                } else {
                    super::routes::secret_refs(r, &objects)
                };
                let Some(secrets) = cw.secrets(&refs, &changes_tx) else {
                    continue;
                };
                objects.secrets = secrets;
                let applied = ctx.board.snapshot().pods.iter().filter_map(|p| p.applied).collect();
                let previous = slots.previous(&applied);
                let versions = super::narrowing::object_versions(&objects);
                let mut excluded = narrowing.excluded(&versions);
                let refused = if want_gateway {
                    BTreeMap::new()
                } else {
                    snippets.refused(&ctx.haproxy_bin, &super::routes::snippet_checks(r, &objects)).await
                };
                // Each object's size, measured only once a render is over the limit (it serialises
                // every spec).
                let mut sizes: Option<BTreeMap<haptic_render::ObjectRef, u64>> = None;
                // A render over the size limit leaves out its largest contributors; to_fit leaves
                // out every remaining one when none fits: at most three renders.
                let mut rounds = 0;
                let out = loop {
                    if !excluded.is_empty() {
                        info!("leaving out of the render: {}", {
                            let names: Vec<String> = excluded.keys().map(ToString::to_string).collect();
                            names.join(", ")
                        });
                    }
                    let out = if want_gateway {
                        super::routes::render_gateway(&c.spec, &s, &objects, &previous, &ctx.namespace, &excluded)
                            .and_then(|(out, mut status)| {
                                status.model = Default::default();
                                gateway = Some(Arc::new(status));
                                let render =
                                    Render::new(out.files).map_err(|why| RenderError::invalid(why.to_string()))?;
                                Ok((Arc::new(render), out.slots))
                            })
                    } else {
                        super::routes::render(&c.spec, &s, &objects, &previous, &refused, &excluded).and_then(|out| {
                            ingress =
                                Some(Arc::new(super::routes::outcome(r, &ctx.namespace, &objects, &out.verdicts)));
                            let render = Render::new(out.files).map_err(|why| RenderError::invalid(why.to_string()))?;
                            Ok((Arc::new(render), out.slots))
                        })
                    };
                    let total: u64 = match &out {
                        Ok((render, _)) => render.manifest().iter().map(|f| f.size).sum(),
                        Err(_) => 0,
                    };
                    let limit = super::narrowing::MAX_RENDER_BYTES;
                    if total <= limit {
                        break out;
                    }
                    let left: BTreeMap<_, _> = sizes
                        .get_or_insert_with(|| super::narrowing::object_sizes(&objects))
                        .iter()
                        .filter(|(o, _)| !excluded.contains_key(*o))
                        .map(|(o, b)| (o.clone(), *b))
                        .collect();
                    let more = haptic_render::narrow::to_fit(&left, total, limit);
                    rounds += 1;
                    if more.is_empty() || rounds > 2 {
                        break out;
                    }
                    warn!(
                        bytes = total,
                        limit, "the render is over its size limit: leaving out its largest contributors"
                    );
                    for o in more {
                        excluded.insert(o, format!("{} of {limit} bytes", haptic_render::narrow::TOO_LARGE));
                    }
                };
                let out = out.map(|(render, slot_map)| {
                    slots.record(render.plan_id(), slot_map);
                    render
                });
                if let Ok(r) = &out {
                    again = narrowing.published(r.plan_id(), versions, &excluded, &ctx.board.snapshot().gate);
                }
                Some(out)
            }
            (Some(c), _, _) => Some(build(&c.spec, &s).and_then(|files| {
                Render::new(files).map(Arc::new).map_err(|why| RenderError::invalid(why.to_string()))
            })),
        };
        let key = (
            config.as_ref().and_then(|c| c.metadata.generation),
            render.as_ref().map(|r| r.as_ref().map(|r| r.plan_id()).map_err(Clone::clone)),
            ingress.clone(),
            gateway.clone(),
        );
        if last.as_ref() != Some(&key) {
            match &render {
                Some(Ok(r)) => info!(plan = %r.plan_id(), "render of {name} ready"),
                Some(Err(e)) => warn!(reason = e.reason, "{name} is not a render: {}", e.message),
                None => info!("HAProxyConfig {name} does not exist (yet)"),
            }
            last = Some(key);
            let _ = tx.send(Snapshot { config, render, ingress, gateway });
        }
        // The published spec references only these now.
        s.config_maps.retain(&refs.config_maps);
        s.secrets.retain(&refs.secrets);
    }
}

/// How many snippet verdicts are kept, by the content of the config checked.
const SNIPPET_VERDICTS_KEPT: usize = 256;

/// The longest one snippet's `haproxy -c` may take; past it the snippet is refused.
const SNIPPET_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// `haproxy -c` verdicts on allowed snippets checked alone, by the digest of the config checked:
/// `None` passed, `Some` refused with HAProxy's words about the snippet's own lines. The last
/// [`SNIPPET_VERDICTS_KEPT`] are kept, so a snippet that comes back is not checked again.
#[derive(Debug)]
struct SnippetVerdicts {
    by_config: haptic_sandbox::Lru<haptic_protocol::Digest, Option<String>>,
}

impl Default for SnippetVerdicts {
    fn default() -> Self {
        SnippetVerdicts { by_config: haptic_sandbox::Lru::new(SNIPPET_VERDICTS_KEPT) }
    }
}

impl SnippetVerdicts {
    /// The snippets of `checks` that `haproxy -c` (`bin`) refuses, checking each new one once.
    /// A check that cannot run refuses nothing (the gate still checks the whole render) and is
    /// tried again next time.
    async fn refused(
        &mut self,
        bin: &std::path::Path,
        checks: &[haptic_render::SnippetCheck],
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for c in checks {
            let key = haptic_protocol::Digest::of(c.config.as_bytes());
            let verdict = match self.by_config.get(&key) {
                Some(v) => v,
                None => match check_snippet(bin, c).await {
                    Ok(v) => {
                        if let Some(why) = &v {
                            warn!("haproxy -c refuses the snippet of {}: {why}", c.object);
                        }
                        self.by_config.insert(key, v.clone());
                        v
                    }
                    Err(e) => {
                        warn!("could not check the snippet of {}: {e}", c.object);
                        None
                    }
                },
            };
            if let Some(why) = verdict {
                out.insert(c.snippet.clone(), why);
            }
        }
        out
    }
}

/// Runs `haproxy -c` contained ([`haptic_sandbox`]) over one snippet's check config, alone in a
/// temp dir: `None` when it passes; `Some` with HAProxy's alerts about the snippet's own lines
/// (numbered from the snippet's first line, redacted and capped by
/// `haptic_haproxy::check_output`), never its other output. A check that does not finish within
/// [`SNIPPET_CHECK_TIMEOUT`] or writes too much refuses the snippet.
async fn check_snippet(bin: &std::path::Path, c: &haptic_render::SnippetCheck) -> Result<Option<String>, String> {
    use haptic_haproxy::check_output::{summarize, Checked};
    let dir = tempfile::Builder::new().prefix("haptic-snippet-").tempdir().map_err(|e| e.to_string())?;
    tokio::fs::write(dir.path().join("check.cfg"), &c.config).await.map_err(|e| e.to_string())?;
    let run = haptic_sandbox::Run::check(bin, dir.path(), "check.cfg", SNIPPET_CHECK_TIMEOUT);
    let out = tokio::task::spawn_blocking(move || haptic_sandbox::run(run))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let checked = Checked::Snippet { config: &c.config, snippet: &c.snippet, file: "check.cfg" };
    Ok(summarize(checked, crate::gate::ending(&out.end), &out.output, Some(&dir.path().to_string_lossy())).words())
}

pub(crate) fn ready<K: kube::Resource + Clone + 'static>(s: &Store<K>) -> bool
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    futures::FutureExt::now_or_never(s.wait_until_ready()).is_some()
}

/// A [`crate::seams::RenderSource`] over the published snapshots: yields the current render at
/// once, then each new one. Many can read one feed (one per leadership term).
#[derive(Debug)]
pub struct FeedRenderSource {
    rx: watch::Receiver<Snapshot>,
    first: bool,
}

impl FeedRenderSource {
    /// A source reading `rx`.
    pub fn new(rx: watch::Receiver<Snapshot>) -> Self {
        Self { rx, first: true }
    }
}

impl crate::seams::RenderSource for FeedRenderSource {
    fn next(&mut self) -> futures::future::BoxFuture<'_, Option<RenderEvent>> {
        Box::pin(async move {
            loop {
                if !std::mem::take(&mut self.first) {
                    self.rx.changed().await.ok()?;
                }
                let snap = self.rx.borrow_and_update().clone();
                match snap.render {
                    Some(Ok(r)) => return Some(Ok(r)),
                    Some(Err(e)) => return Some(Err(format!("{}: {}", e.reason, e.message))),
                    None => continue,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    #[tokio::test]
    async fn each_new_snippet_is_checked_once_and_a_refused_one_is_named() {
        let Some(bin) = haptic_e2e::haproxy_bins().into_iter().next() else { return };
        let check = |name: &str, snippet: &str| haptic_render::SnippetCheck {
            object: haptic_render::ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: name.into() },
            snippet: snippet.into(),
            config: haptic_haproxy::snippet::check_config(snippet),
        };
        let checks = [
            check("good", "    http-response set-header X-Good yes\n"),
            check("broken", "    http-response set-header X-Only-A-Name\n"),
        ];
        let mut v = SnippetVerdicts::default();
        let refused = v.refused(&bin.path, &checks).await;
        assert_eq!(refused.keys().collect::<Vec<_>>(), [&checks[1].snippet], "{refused:?}");
        // Numbered from the snippet's own first line, not the check config's.
        assert!(refused[&checks[1].snippet].starts_with("line 1: "), "{refused:?}");
        // Known snippets are not checked again (a binary that cannot run changes nothing).
        let again = v.refused(std::path::Path::new("/nonexistent/haproxy"), &checks).await;
        assert_eq!(again, refused);
        // Only the snippets asked about are answered; a new one that cannot be checked refuses
        // nothing and is not kept.
        let later = v.refused(std::path::Path::new("/nonexistent/haproxy"), &[check("new", "    x y\n")]).await;
        assert!(later.is_empty() && v.by_config.len() == 2, "{later:?}");
    }

    /// A snippet that makes HAProxy read a file outside its check directory is refused without
    /// the file's content reaching its words, `/dev/zero` is refused at once (not by the
    /// deadline), and the benign twin passes: on every HAProxy version.
    #[tokio::test]
    async fn a_snippet_check_reads_no_file_and_echoes_none() {
        let base = tempfile::tempdir().unwrap();
        let secret = base.path().join("token");
        std::fs::write(&secret, "root:x:0:0:s3cr3t\n").unwrap();
        let check = |snippet: String| haptic_render::SnippetCheck {
            object: haptic_render::ObjectRef { kind: "Ingress".into(), namespace: "a".into(), name: "a".into() },
            config: haptic_haproxy::snippet::check_config(&snippet),
            snippet,
        };
        for bin in haptic_e2e::haproxy_bins() {
            for file in [secret.display().to_string(), "/etc/passwd".into(), "/dev/zero".into()] {
                let c = check(format!("    acl x src -f {file}\n    http-request deny if x\n"));
                let why = check_snippet(&bin.path, &c).await.unwrap().unwrap_or_else(|| panic!("{file} passed"));
                assert!(!why.contains("s3cr3t") && !why.contains("root:x"), "{}: {why}", bin.label());
                assert!(!why.contains("did not finish"), "{}: {file}: {why}", bin.label());
                assert!(why.starts_with("line 1: "), "{}: {why}", bin.label());
            }
            let ok = check("    acl x src 10.0.0.1\n    http-request deny if x\n".into());
            assert_eq!(check_snippet(&bin.path, &ok).await.unwrap(), None, "{}", bin.label());
        }
    }

    #[test]
    fn a_burst_settles_after_its_last_change_but_a_stream_within_two_windows() {
        let ms = |n: u64| Duration::from_millis(n);
        let settle = Settle { objects: ms(300), endpoints: ms(50) };
        let t0 = tokio::time::Instant::now();
        let burst = |changes: &[(u64, Change)]| {
            let mut b = Burst::new(t0 + ms(changes[0].0), changes[0].1);
            for (at, c) in &changes[1..] {
                b.add(t0 + ms(*at), *c);
            }
            b.due(settle)
        };
        use Change::{Endpoints as E, Objects as O};
        // One change: a window after it.
        assert_eq!(burst(&[(0, O)]), t0 + ms(300));
        // A second change 100 ms later: a window after that one.
        assert_eq!(burst(&[(0, O), (100, O)]), t0 + ms(400));
        // Changes that never pause: at most two windows after the first.
        assert_eq!(burst(&[(0, O), (550, O)]), t0 + ms(600));
        assert_eq!(burst(&[(0, O), (5000, O)]), t0 + ms(600));
        // EndpointSlices only: the short window, also for a stream of them.
        assert_eq!(burst(&[(0, E)]), t0 + ms(50));
        assert_eq!(burst(&[(0, E), (30, E)]), t0 + ms(80));
        assert_eq!(burst(&[(0, E), (90, E)]), t0 + ms(100));
        // Any other change in the burst: the long window again, from the burst's start.
        assert_eq!(burst(&[(0, E), (30, O)]), t0 + ms(330));
        assert_eq!(burst(&[(0, O), (30, E)]), t0 + ms(330));
        // The endpoint window never exceeds the other.
        let slow = Settle { objects: ms(20), endpoints: ms(50) };
        assert_eq!(Burst::new(t0, E).due(slow), t0 + ms(20));
    }

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
        assert_eq!(e.reason, "MissingReference");
        assert!(e.message.contains("ConfigMap nope not found") && e.message.contains("spec.files[0]"), "{e:?}");
        let bad_key = spec(json!({"configFrom": {"configMapKeyRef": {"name": "cfg", "key": "other"}}}));
        assert!(build(&bad_key, &f).unwrap_err().message.contains("no key \"other\""));
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
        for (v, needle) in [
            (json!({}), "set spec.config, spec.configFrom or spec.render"),
            (json!({"config": "g", "files": [{"path": "../x", "content": "x"}]}), "spec.files[0].path"),
            (
                json!({"config": "g", "files": [{"path": "haproxy.cfg", "content": "x"}]}),
                "comes from the spec's source",
            ),
            (json!({"config": "g", "files": [{"path": "a"}]}), "exactly one of"),
            (json!({"config": "g", "files": [{"path": "a", "content": "1"}, {"path": "a", "content": "2"}]}), "twice"),
            (
                json!({"config": "g", "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}),
                "spec.podSelector",
            ),
        ] {
            let e = build(&spec(v), &f).unwrap_err();
            assert_eq!(e.reason, "InvalidSpec");
            assert!(e.message.contains(needle), "{needle:?} not in {:?}", e.message);
        }
        let mut opaque = Secret::default();
        opaque.metadata.name = Some("o".into());
        assert!(secret_file(&opaque, None).unwrap_err().contains("not of type kubernetes.io/tls"));
    }
}
