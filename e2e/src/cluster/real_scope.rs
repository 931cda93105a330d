//! The namespace scope on a real cluster: the chart installed with `render.namespaces`, so the
//! controller holds a Role in the listed namespace and its own, and a ClusterRole that reads
//! IngressClasses and nothing else. An Ingress in the listed namespace is served and gets its
//! status; one in a namespace outside the scope is never served nor touched; the apiserver's own
//! authorizer (SubjectAccessReviews for the controller's ServiceAccount) says it may read no
//! Secret, Service, EndpointSlice or Ingress cluster-wide nor in the outside namespace.
//!
//! Owns the step [`SCOPE_STEPS`]. It must never send traffic anywhere but the HAProxy Service,
//! nor leave its objects behind on success: it ends with both namespaces deleted and the release
//! back on the scenarios' ConfigMap.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, Patch, PostParams};

use super::real::{RealCluster, NAMESPACE};
use super::real_ingress::{answered, answers_code, load_balancer_ip};
use super::real_steps::{apply_params, ensure, install_reading_config_map};
use super::real_tenants::{delete_namespaces, ingress, namespace_with_web};
use super::scenarios::Selection;
use super::{eventually, status, wait_converged_on_spec, Cluster, ClusterError, Result};

/// The step's name for `HAPTIC_E2E_STEPS`.
pub const SCOPE_STEPS: [&str; 1] = ["scope"];

/// The namespace the release serves besides its own.
const INSIDE: &str = "scope-inside";
/// A namespace outside the scope.
const OUTSIDE: &str = "scope-outside";

/// Runs the step if `selection` wants it, then puts the release back on the scenarios' ConfigMap.
pub async fn run_scope(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    if !SCOPE_STEPS.iter().any(|s| selection.wants(s)) {
        return Ok(());
    }
    let client = c.client();
    // The Role goes into each listed namespace, so they exist before the install.
    namespace_with_web(c, OUTSIDE).await?;
    namespace_with_web(c, INSIDE).await?;
    let result = scoped(c).await;
    let cleaned = delete_namespaces(c, &[INSIDE, OUTSIDE]).await;
    result?;
    cleaned?;
    let rendered = status(&client, NAMESPACE).await?["planId"].clone();
    install_reading_config_map(c).await?;
    wait_converged_on_spec(&client, NAMESPACE, 2, Some(&rendered)).await?;
    println!("ok real scope: both namespaces deleted; the release is back on the scenarios' ConfigMap");
    Ok(())
}

async fn scoped(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    c.install(&["ingress.enabled=true", &format!("render.namespaces={{{INSIDE}}}")])?;
    wait_converged_on_spec(&client, NAMESPACE, 2, None).await?;
    let svc = c.service_ip().await?;
    // The outside Ingress first: once the inside one is served, a render has seen both.
    for ns in [OUTSIDE, INSIDE] {
        let ing = ingress(ns, "web", &format!("{ns}.example"), &[("/", "Prefix")], &[]);
        Api::<Ingress>::namespaced(client.clone(), ns)
            .patch("web", &apply_params(), &Patch::Apply(&ing))
            .await
            .map_err(|e| ClusterError::of(&format!("apply the Ingress {ns}/web"), e))?;
    }
    answered(c, &svc, &format!("{INSIDE}.example"), "/", |b| b == INSIDE).await?;
    answers_code(c, &svc, &format!("{OUTSIDE}.example"), "/", 404).await?;
    eventually("status.loadBalancer on the inside Ingress", std::time::Duration::from_secs(60), || async {
        let i = Api::<Ingress>::namespaced(client.clone(), INSIDE).get("web").await.ok()?;
        (load_balancer_ip(&i).as_deref() == Some(svc.as_str())).then_some(())
    })
    .await?;
    let outside = Api::<Ingress>::namespaced(client.clone(), OUTSIDE)
        .get("web")
        .await
        .map_err(|e| ClusterError::of("get the outside Ingress", e))?;
    ensure(load_balancer_ip(&outside).is_none(), || format!("the outside Ingress got a status: {:?}", outside.status))?;
    authorized_only_inside(c).await?;
    println!(
        "ok scope: render.namespaces={{{INSIDE}}}: its Ingress served 200 with its status, {OUTSIDE}'s never (404, no status); \
         the controller may read Secrets, Services, EndpointSlices and Ingresses in {INSIDE} and its own namespace only"
    );
    Ok(())
}

/// Asks the apiserver's authorizer what the controller's ServiceAccount may read: the render
/// kinds in [`INSIDE`] and the release's namespace, none cluster-wide or in [`OUTSIDE`].
async fn authorized_only_inside(c: &RealCluster) -> Result<()> {
    let client = c.client();
    let lp = ListParams::default().labels("app.kubernetes.io/component=controller");
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .list(&lp)
        .await
        .map_err(|e| ClusterError::of("list the controller's ServiceAccount", e))?;
    let sa = accounts.items.first().and_then(|a| a.metadata.name.clone()).ok_or_else(|| {
        ClusterError(format!("no ServiceAccount labelled app.kubernetes.io/component=controller in {NAMESPACE}"))
    })?;
    let user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let kinds =
        [("", "secrets"), ("", "services"), ("discovery.k8s.io", "endpointslices"), ("networking.k8s.io", "ingresses")];
    let mut wrong = Vec::new();
    for (group, resource) in kinds {
        for verb in ["list", "watch"] {
            for (ns, want) in [(None, false), (Some(OUTSIDE), false), (Some(INSIDE), true), (Some(NAMESPACE), true)] {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some(user.clone()),
                        groups: Some(vec![
                            "system:serviceaccounts".into(),
                            format!("system:serviceaccounts:{NAMESPACE}"),
                        ]),
                        resource_attributes: Some(ResourceAttributes {
                            group: Some(group.into()),
                            resource: Some(resource.into()),
                            verb: Some(verb.into()),
                            namespace: ns.map(String::from),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = reviews
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(|e| ClusterError::of("create a SubjectAccessReview", e))?;
                let allowed = answer.status.is_some_and(|s| s.allowed);
                if allowed != want {
                    let where_ = ns.unwrap_or("every namespace");
                    wrong.push(format!("{verb} {group}/{resource} in {where_}: allowed={allowed}"));
                }
            }
        }
    }
    ensure(wrong.is_empty(), || format!("{user}: {wrong:?}"))
}
