//! The feed loop: watches the `HAProxyConfig` resource (by name) and what its spec references,
//! settles each burst of changes ([`super::settle`]), renders, and publishes each new result as
//! one [`Snapshot`].
//!
//! A change to any referenced object is a new render; an unchanged result is not republished.
//! With `spec.render` the same loop also runs [`super::cluster`]'s reflectors and renders
//! through [`super::routes`] with the slots of the newest plan a pod applied, after checking each
//! allowed snippet alone ([`super::snippet_check`]), and, when the gate still refuses a render,
//! leaving out the objects [`super::narrowing`] names until the culprits are found. Owns the loop,
//! the one [`Incremental`] Ingress render its passes share (so an EndpointSlice change redoes
//! only the endpoints) and [`FeedBundles`], the render source over its snapshots. It must never
//! deploy, and
//! outside render mode never read objects outside its namespace nor list a kind wholesale.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use haptic_protocol::PlanId;
use haptic_render::gateway::GatewayOutput;
use haptic_render::narrow::Exclusion;
use haptic_render::{Incremental, ObjectRef, SlotMap};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cluster::ClusterWatch;
use super::config_source::{build, references, References, SpecError, Stores};
use super::context::Context;
use super::crd::{HAProxyConfig, RenderSpec};
use super::narrowing::{self, GateNarrowing};
use super::published::Snapshot;
use super::routes::{self, IngressOutcome, Objects, SlotHistory};
use super::scope::Scope;
use super::settle::{Burst, Change, Settle};
use super::snippet_check::SnippetVerdicts;
use super::watch::{ready, Changes, SpecChanges};
use crate::bundle::Bundle;
use crate::seams::BundleEvent;

/// What was last published: the resource's generation, the render's plan id or error, and the
/// Ingress and Gateway outcomes.
#[derive(Debug, Clone, PartialEq)]
struct PublishedKey {
    generation: Option<i64>,
    bundle: Option<Result<PlanId, SpecError>>,
    ingress: Option<Arc<IngressOutcome>>,
    gateway: Option<Arc<GatewayOutput>>,
}

/// What one render pass produced: the render (or why there is none; `None`: no resource), and
/// in render mode the Ingress or Gateway outcome.
#[derive(Debug, Default)]
struct Produced {
    bundle: Option<Result<Arc<Bundle>, SpecError>>,
    ingress: Option<Arc<IngressOutcome>>,
    gateway: Option<Arc<GatewayOutput>>,
}

/// What woke the loop.
enum Wake {
    /// Settle and render after this change.
    Change(Change),
    /// Nothing to render: wait again.
    Idle,
    /// Shutdown, or the resource's watch ended.
    Stop,
}

/// The loop's state between renders.
struct Feed {
    ctx: Context,
    tx: watch::Sender<Snapshot>,
    settle: Settle,
    shutdown: CancellationToken,
    events: BoxStream<'static, Result<Change, String>>,
    changes: Changes,
    apis: (Api<ConfigMap>, Api<Secret>),
    last: Option<PublishedKey>,
    cluster: Option<ClusterWatch>,
    slots: SlotHistory,
    /// The Ingress render keeping its last translation, so an EndpointSlice change redoes only
    /// the endpoints.
    incremental: Incremental,
    snippets: SnippetVerdicts,
    narrowing: GateNarrowing,
    board: watch::Receiver<u64>,
    board_open: bool,
    /// Render again at once: a narrowing moved on.
    again: bool,
}

/// Watches the resource (by name) and what its spec references, and publishes on `tx`: every
/// burst of changes settles (see [`Burst`]), then the resource is rendered and published (only when the
/// render, its error or the resource's generation changed). A changed reference starts the
/// new object's watch; the old one stops once a render of the new spec is published.
pub async fn watch_config(
    ctx: Context,
    writer: Writer<HAProxyConfig>,
    tx: watch::Sender<Snapshot>,
    settle: Settle,
    shutdown: CancellationToken,
) {
    let mut feed = Feed::new(ctx, writer, tx, settle, shutdown);
    loop {
        let change = match feed.wait().await {
            Wake::Stop => return,
            Wake::Idle => continue,
            Wake::Change(c) => c,
        };
        if !feed.settled(change).await {
            return;
        }
        feed.pass().await;
    }
}

impl Feed {
    fn new(
        ctx: Context,
        writer: Writer<HAProxyConfig>,
        tx: watch::Sender<Snapshot>,
        settle: Settle,
        shutdown: CancellationToken,
    ) -> Self {
        let name = &ctx.names.config;
        let (changes, changes_rx) = futures::channel::mpsc::unbounded::<Change>();
        // The controller's own status writes to the resource come back as events: they are no
        // change to render (and would hold a new route back by the long window).
        let mut specs = SpecChanges::default();
        let cfgs = watcher(ctx.configs(), watcher::Config::default().fields(&format!("metadata.name={name}")))
            .default_backoff()
            .reflect(writer)
            .filter_map(move |r| {
                futures::future::ready(match r {
                    Ok(ev) => specs.is_change(&ev).then_some(Ok(Change::Objects)),
                    Err(e) => Some(Err(e.to_string())),
                })
            })
            .boxed();
        let events = futures::stream::select(cfgs, changes_rx.map(Ok)).boxed();
        let apis = (ctx.api::<ConfigMap>(), ctx.api::<Secret>());
        let board = ctx.board.subscribe();
        Feed {
            ctx,
            tx,
            settle,
            shutdown,
            events,
            changes,
            apis,
            last: None,
            cluster: None,
            slots: SlotHistory::default(),
            incremental: Incremental::new(),
            snippets: SnippetVerdicts::default(),
            narrowing: GateNarrowing::default(),
            board,
            board_open: true,
            again: false,
        }
    }

    /// Renders again at once when a narrowing moved on; else waits for a change, or for the
    /// gate's verdict a narrowing waits on.
    async fn wait(&mut self) -> Wake {
        if std::mem::take(&mut self.again) {
            return Wake::Change(Change::Objects);
        }
        tokio::select! {
            _ = self.shutdown.cancelled() => Wake::Stop,
            r = self.board.changed(), if self.board_open => {
                if r.is_err() {
                    self.board_open = false;
                    return Wake::Idle;
                }
                if self.narrowing.on_gate(&self.ctx.board.snapshot().gate) {
                    Wake::Change(Change::Objects)
                } else {
                    Wake::Idle
                }
            }
            ev = self.events.next() => match ev {
                None => Wake::Stop,
                Some(Err(e)) => {
                    warn!("watching HAProxyConfig {}: {e}", self.ctx.names.config);
                    Wake::Idle
                }
                Some(Ok(c)) => Wake::Change(c),
            },
        }
    }

    /// Settles: lets a burst of changes (a ConfigMap and the resource together) land, but never
    /// waits out a stream of them (EndpointSlices while a Deployment scales). `false`: stop.
    async fn settled(&mut self, change: Change) -> bool {
        let mut burst = Burst::new(tokio::time::Instant::now(), change);
        let quiet = tokio::time::sleep_until(burst.due(self.settle));
        tokio::pin!(quiet);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                _ = &mut quiet => return true,
                ev = self.events.next() => match ev {
                    None => return false,
                    Some(ev) => {
                        burst.add(tokio::time::Instant::now(), ev.unwrap_or(Change::Objects));
                        quiet.as_mut().reset(burst.due(self.settle));
                    }
                },
            }
        }
    }

    /// One render pass over the stores; publishes when the result changed. A pass whose stores
    /// have not synced yet does nothing: every raw watch event (also a list's end) comes
    /// through the loop, so it is tried again on the store's own next event.
    async fn pass(&mut self) {
        let s = self.ctx.stores.clone();
        if !ready(&s.configs) {
            return;
        }
        let config = s.config(&self.ctx.names.config);
        let refs = config.as_ref().map(|c| references(&c.spec)).unwrap_or_default();
        s.config_maps.ensure(&self.apis.0, &refs.config_maps, &self.changes, &self.shutdown);
        s.secrets.ensure(&self.apis.1, &refs.secrets, &self.changes, &self.shutdown);
        if !(s.config_maps.ready(&refs.config_maps) && s.secrets.ready(&refs.secrets)) {
            return;
        }
        // Render mode: the cluster-wide reflectors run while the spec has `render`.
        let render_spec = config.as_ref().and_then(|c| c.spec.render.clone());
        self.keep_cluster_watch(render_spec.as_ref());
        let produced = match (config.as_ref(), render_spec.as_ref()) {
            (None, _) => Produced::default(),
            (Some(c), Some(r)) => match self.render_cluster(c, r).await {
                Some(p) => p,
                None => return,
            },
            (Some(c), None) => Produced {
                bundle: Some(build(&c.spec, &s).and_then(|files| {
                    Bundle::new(files).map(Arc::new).map_err(|why| SpecError::invalid("spec", why.to_string()))
                })),
                ..Produced::default()
            },
        };
        self.publish(config, produced, &refs);
    }

    /// Starts, restarts (Ingress ↔ Gateway, another namespace scope) or stops the render-mode
    /// reflectors to match `spec.render`.
    fn keep_cluster_watch(&mut self, render_spec: Option<&RenderSpec>) {
        let want_gateway = render_spec.is_some_and(|r| r.gateway_class_name.is_some());
        let scope = render_spec.map_or(Scope::All, |r| Scope::of(r, &self.ctx.namespace));
        let start = |f: &Feed| ClusterWatch::start(&f.ctx.client, &f.changes, &f.shutdown, want_gateway, scope.clone());
        match (render_spec, &self.cluster) {
            (Some(_), Some(cw)) if cw.is_gateway() != want_gateway || *cw.scope() != scope => {
                self.cluster = Some(start(self))
            }
            (Some(_), None) => self.cluster = Some(start(self)),
            (None, Some(_)) => self.cluster = None,
            _ => {}
        }
    }

    /// Renders from the cluster's objects; `None` while the reflectors or the referenced
    /// Secrets have not synced yet.
    async fn render_cluster(&mut self, c: &HAProxyConfig, r: &RenderSpec) -> Option<Produced> {
        let cw = self.cluster.as_ref()?;
        if !cw.ready() {
            return None;
        }
        let gateway = r.gateway_class_name.is_some();
        let mut objects = cw.objects();
        let refs = if gateway { routes::gateway_secret_refs(r, &objects) } else { routes::secret_refs(r, &objects) };
        objects.secrets = cw.secrets(&refs, &self.changes)?;
        objects.config_maps = cw.config_maps(&routes::config_map_refs(r, &objects), &self.changes)?;
        let applied = self.ctx.board.snapshot().pods.iter().filter_map(|p| p.applied).collect();
        let previous = self.slots.previous(&applied);
        let versions = narrowing::object_versions(&objects);
        let mut excluded = self.narrowing.excluded(&versions);
        let refused = if gateway {
            BTreeMap::new()
        } else {
            self.snippets.refused(&self.ctx.haproxy_bin, &routes::snippet_checks(r, &objects)).await
        };
        let pass = ClusterPass {
            spec: c,
            render_spec: r,
            stores: &self.ctx.stores,
            objects: &objects,
            previous: &previous,
            refused: &refused,
            namespace: &self.ctx.namespace,
        };
        let (out, ingress, gateway) = pass.fitting(&mut excluded, &mut self.incremental);
        let out = out.map(|(render, slot_map)| {
            self.slots.record(render.plan_id(), slot_map, &applied);
            render
        });
        if let Ok(r) = &out {
            self.again = self.narrowing.published(r.plan_id(), versions, &excluded, &self.ctx.board.snapshot().gate);
        }
        Some(Produced { bundle: Some(out), ingress, gateway })
    }

    /// Publishes `produced` when it differs from what was last published; then stops the
    /// watches of objects the spec no longer references.
    fn publish(&mut self, config: Option<Arc<HAProxyConfig>>, produced: Produced, refs: &References) {
        let name = &self.ctx.names.config;
        let Produced { bundle, ingress, gateway } = produced;
        let key = PublishedKey {
            generation: config.as_ref().and_then(|c| c.metadata.generation),
            bundle: bundle.as_ref().map(|r| r.as_ref().map(|r| r.plan_id()).map_err(Clone::clone)),
            ingress: ingress.clone(),
            gateway: gateway.clone(),
        };
        if self.last.as_ref() != Some(&key) {
            match &bundle {
                Some(Ok(r)) => info!(plan = %r.plan_id(), "render of {name} ready"),
                Some(Err(e)) => warn!(reason = e.reason, "{name} is not a render: {}", e.message),
                None => info!("HAProxyConfig {name} does not exist (yet)"),
            }
            self.last = Some(key);
            let _ = self.tx.send(Snapshot { config, bundle, ingress, gateway });
        }
        // The published spec references only these now.
        let s = &self.ctx.stores;
        s.config_maps.retain(&refs.config_maps);
        s.secrets.retain(&refs.secrets);
    }
}

/// A render (or why there is none) with the slots it used.
type Built = Result<(Arc<Bundle>, SlotMap), SpecError>;

/// The inputs of one render from the cluster's objects.
struct ClusterPass<'a> {
    spec: &'a HAProxyConfig,
    render_spec: &'a RenderSpec,
    stores: &'a Stores,
    objects: &'a Objects,
    previous: &'a SlotMap,
    refused: &'a BTreeMap<String, String>,
    namespace: &'a str,
}

impl ClusterPass<'_> {
    /// Renders once, leaving out `excluded`; with the Ingress or Gateway outcome of a render
    /// the source accepted.
    fn once(
        &self,
        excluded: &BTreeMap<ObjectRef, Exclusion>,
        incremental: &mut Incremental,
    ) -> (Built, Option<Arc<IngressOutcome>>, Option<Arc<GatewayOutput>>) {
        let (spec, objects, previous) = (&self.spec.spec, self.objects, self.previous);
        let bundle = |files| Bundle::new(files).map_err(|why| SpecError::invalid("spec", why.to_string()));
        if self.render_spec.gateway_class_name.is_some() {
            match routes::render_gateway(spec, self.stores, objects, previous, self.namespace, excluded) {
                Ok((out, mut status)) => {
                    status.model = Default::default();
                    let gateway = Some(Arc::new(status));
                    (bundle(out.files).map(|r| (Arc::new(r), out.slots)), None, gateway)
                }
                Err(e) => (Err(e), None, None),
            }
        } else {
            match routes::render(spec, self.stores, objects, previous, self.refused, excluded, incremental) {
                Ok(out) => {
                    let mut ingress = routes::outcome(self.render_spec, self.namespace, objects, &out.verdicts);
                    ingress.certificates = out.certificates;
                    (bundle(out.files).map(|r| (Arc::new(r), out.slots)), Some(Arc::new(ingress)), None)
                }
                Err(e) => (Err(e), None, None),
            }
        }
    }

    /// Renders; a render over the size limit leaves out its largest contributors (added to
    /// `excluded`), and `to_fit` leaves out every remaining one when none fits: at most three
    /// renders. The outcomes are those of the last render the source accepted.
    fn fitting(
        &self,
        excluded: &mut BTreeMap<ObjectRef, Exclusion>,
        incremental: &mut Incremental,
    ) -> (Built, Option<Arc<IngressOutcome>>, Option<Arc<GatewayOutput>>) {
        let (mut ingress, mut gateway) = (None, None);
        // Each object's size, measured only once a render is over the limit (it serialises
        // every spec).
        let mut sizes: Option<BTreeMap<ObjectRef, u64>> = None;
        let mut rounds = 0;
        loop {
            if !excluded.is_empty() {
                let names: Vec<String> = excluded.keys().map(ToString::to_string).collect();
                info!("leaving out of the render: {}", names.join(", "));
            }
            let (out, i, g) = self.once(excluded, incremental);
            ingress = i.or(ingress);
            gateway = g.or(gateway);
            let total: u64 = match &out {
                Ok((render, _)) => render.manifest().iter().map(|f| f.size).sum(),
                Err(_) => 0,
            };
            let limit = narrowing::MAX_RENDER_BYTES;
            if total <= limit {
                return (out, ingress, gateway);
            }
            let left: BTreeMap<_, _> = sizes
                .get_or_insert_with(|| narrowing::object_sizes(self.objects))
                .iter()
                .filter(|(o, _)| !excluded.contains_key(*o))
                .map(|(o, b)| (o.clone(), *b))
                .collect();
            let more = haptic_render::narrow::to_fit(&left, total, limit);
            rounds += 1;
            if more.is_empty() || rounds > 2 {
                return (out, ingress, gateway);
            }
            warn!(bytes = total, limit, "the render is over its size limit: leaving out its largest contributors");
            for o in more {
                excluded.insert(o, Exclusion::TooLarge(limit));
            }
        }
    }
}

/// A [`crate::seams::BundleSource`] over the published snapshots: yields the current render at
/// once, then each new one. Many can read one feed (one per leadership term).
#[derive(Debug)]
pub struct FeedBundles {
    rx: watch::Receiver<Snapshot>,
    first: bool,
}

impl FeedBundles {
    /// A source reading `rx`.
    pub fn new(rx: watch::Receiver<Snapshot>) -> Self {
        Self { rx, first: true }
    }
}

impl crate::seams::BundleSource for FeedBundles {
    fn next(&mut self) -> futures::future::BoxFuture<'_, Option<BundleEvent>> {
        Box::pin(async move {
            loop {
                if !std::mem::take(&mut self.first) {
                    self.rx.changed().await.ok()?;
                }
                let snap = self.rx.borrow_and_update().clone();
                match snap.bundle {
                    Some(Ok(r)) => return Some(Ok(r)),
                    Some(Err(e)) => return Some(Err(format!("{}: {}", e.reason, e.message))),
                    None => continue,
                }
            }
        })
    }
}
