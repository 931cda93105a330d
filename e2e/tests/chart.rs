//! The Helm chart `charts/haptic`, checked with the real `helm` CLI and the real apiserver.
//!
//! Renders the chart with its default values and with `charts/haptic/ci/production-values.yaml`
//! (`helm template`), runs `helm lint --strict`, asserts on the rendered manifests (shared volumes,
//! master socket path, agent port and credentials wiring, probes, security contexts, RBAC verbs,
//! NetworkPolicy), runs the default `haproxy.cfg` through every HAProxy's `haproxy -c`, then starts
//! the local control plane, applies the generated CRD for real and creates every rendered object
//! with a server-side dry run, so the apiserver's own schemas check them; and installs, upgrades
//! and uninstalls the chart for real there (the generated credential is kept throughout).
//! prometheus-operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule) and cert-manager's
//! (Certificate, Issuer) have no CRD on that control plane: they are rendered, linted and asserted
//! on, not dry-run.
//!
//! The monitoring pack: the PrometheusRule passes `promtool check rules` and `promtool test
//! rules` (each alert fires on its condition, and not on a healthy fleet); every `haproxy_*` name
//! the dashboard and the rules read is served by HAProxy's own exporter, started on each version
//! with the chart's default config (the `haptic_*` names: controller/tests/metrics.rs).
//!
//! Needs `scripts/install-helm.sh` (helm; or `HAPTIC_HELM`), `scripts/install-k8s.sh`,
//! `scripts/install-haproxy.sh` and `scripts/install-promtool.sh` (or `HAPTIC_PROMTOOL`) to have
//! run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use haptic_e2e::k8s::ControlPlane;
use haptic_e2e::monitoring::{exposed_names, missing, names_read};
use haptic_e2e::tools::{chart_dir, chart_monitoring_queries, helm, promtool, render_chart};
use haptic_e2e::wait::eventually;
use haptic_e2e::{assert_no_stray, free_port, on_each_version, Haproxy, HaproxyBin, HaproxyOpts};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::{pinned_kind, Scope};
use serde_json::{json, Value};

const NAMESPACE: &str = "haptic-chart";
const RELEASE: &str = "demo";

/// `helm template` with extra args; the rendered objects (empty documents dropped).
fn render(extra: &[&str]) -> Vec<Value> {
    render_chart(RELEASE, NAMESPACE, extra)
}

fn production_values() -> PathBuf {
    chart_dir().join("ci/production-values.yaml")
}

fn render_default() -> Vec<Value> {
    render(&[])
}

fn render_production() -> Vec<Value> {
    let values = production_values();
    render(&["-f", values.to_str().unwrap()])
}

/// `ci/<name>-values.yaml`: the DaemonSet and HPA profiles.
fn ci_values(name: &str) -> PathBuf {
    chart_dir().join(format!("ci/{name}-values.yaml"))
}

fn render_ci(name: &str) -> Vec<Value> {
    let values = ci_values(name);
    render(&["-f", values.to_str().unwrap()])
}

fn kind_of(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name_of(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn one<'a>(objs: &'a [Value], kind: &str, name_suffix: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| kind_of(o) == kind && name_of(o).ends_with(name_suffix)).collect();
    assert_eq!(found.len(), 1, "want exactly one {kind} named *{name_suffix}, got {}", found.len());
    found[0]
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .into_iter()
        .chain(pod["initContainers"].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A container's command and args as one list.
fn argv(c: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .flat_map(|k| c[*k].as_array().cloned().unwrap_or_default())
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The value of `--flag=value` or `--flag value` in argv.
fn flag(argv: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&eq).map(str::to_string).or_else(|| (a == name).then(|| argv.get(i + 1).cloned()).flatten())
    })
}

/// mountPath by volume name.
fn mounts(c: &Value) -> BTreeMap<String, String> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["name"].as_str().unwrap().to_string(), m["mountPath"].as_str().unwrap().to_string()))
        .collect()
}

fn port_named(c: &Value, name: &str) -> u64 {
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("container {} has no port {name}", c["name"]))
}

fn assert_hardened(c: &Value) {
    let sc = &c["securityContext"];
    let who = c["name"].as_str().unwrap();
    assert_eq!(sc["runAsNonRoot"], true, "{who}");
    assert_eq!(sc["runAsUser"], 65532, "{who}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{who}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{who}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{who}");
    assert!(c["resources"]["requests"].is_object(), "{who} has resource requests");
}

fn assert_http_probe(c: &Value, probe: &str, path: &str, port: &str) {
    let p = &c[probe]["httpGet"];
    assert_eq!(p["path"], path, "{} {probe}", c["name"]);
    assert_eq!(p["port"], port, "{} {probe}", c["name"]);
}

/// Who issues the agents' certificate in a render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentTls {
    /// The controller (`--agent-tls-issue`): the default.
    Controller,
    /// cert-manager (`Certificate` objects).
    CertManager,
    /// The admin's Secret (`agent.tls.existingSecret`).
    Existing,
    /// Plain HTTP (`agent.tls.enabled=false`).
    Off,
}

/// The TLS wiring of the control channel: the agent serves the serving Secret's files over
/// HTTPS (probes too), the controller verifies the fixed name and reads the same Secret, RBAC
/// reaches exactly that Secret (and the CA Secret when the controller issues), and cert-manager's
/// Certificate names the same Secret and name.
fn check_agent_tls(objs: &[Value], mode: AgentTls) {
    let hap = one(objs, "Deployment", "-haproxy");
    let pod = &hap["spec"]["template"]["spec"];
    let agent = container(pod, "agent");
    let aa = argv(agent);
    let ac = argv(container(&one(objs, "Deployment", "-controller")["spec"]["template"]["spec"], "controller"));
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "agent-tls");
    let role = one(objs, "Role", "-controller");
    let named: Vec<&Value> =
        role["rules"].as_array().unwrap().iter().filter(|r| r["resourceNames"].is_array()).collect();
    let certs: Vec<&Value> = objs.iter().filter(|o| kind_of(o) == "Certificate").collect();
    let scheme = |probe: &str| agent[probe]["httpGet"]["scheme"].as_str().map(str::to_string);
    if mode == AgentTls::Off {
        assert!(volume.is_none() && flag(&aa, "--tls-cert-file").is_none(), "plain HTTP: no certificate");
        assert!(flag(&ac, "--agent-tls-secret").is_none() && flag(&ac, "--agent-tls-server-name").is_none());
        assert!(!ac.contains(&"--agent-tls-issue".to_string()));
        assert!(named.is_empty() && certs.is_empty());
        assert_eq!((scheme("livenessProbe"), scheme("readinessProbe")), (None, None));
        return;
    }
    let secret = flag(&ac, "--agent-tls-secret").expect("the controller reads the agents' serving Secret");
    let server_name = flag(&ac, "--agent-tls-server-name").expect("the controller verifies a fixed name");
    let want_secret =
        if mode == AgentTls::Existing { "mine".to_string() } else { format!("{RELEASE}-haptic-agent-tls") };
    assert_eq!(secret, want_secret);
    assert_eq!(server_name, format!("{RELEASE}-haptic-agent.{NAMESPACE}.svc"));
    assert_eq!(ac.contains(&"--agent-tls-issue".to_string()), mode == AgentTls::Controller);
    let volume = volume.expect("the agent-tls volume");
    assert_eq!(volume["secret"]["secretName"], secret.as_str());
    let dir = &mounts(agent)["agent-tls"];
    assert_eq!(flag(&aa, "--tls-cert-file"), Some(format!("{dir}/tls.crt")));
    assert_eq!(flag(&aa, "--tls-key-file"), Some(format!("{dir}/tls.key")));
    assert!(flag(&aa, "--tls-poll").is_some());
    let items: BTreeSet<&str> =
        volume["secret"]["items"].as_array().unwrap().iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(items, BTreeSet::from(["tls.crt", "tls.key"]), "the agent sees only its certificate and key");
    assert_eq!((scheme("livenessProbe"), scheme("readinessProbe")), (Some("HTTPS".into()), Some("HTTPS".into())));
    assert!(!mounts(container(pod, "haproxy")).contains_key("agent-tls"), "only the agent sees the key");
    // RBAC: the named Secrets only; create (not limitable by name) only when the controller issues.
    assert_eq!(named.len(), 1);
    let names: Vec<&str> = named[0]["resourceNames"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let verbs: Vec<&str> = named[0]["verbs"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let creates = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["resources"] == json!(["secrets"]) && r["verbs"] == json!(["create"]));
    if mode == AgentTls::Controller {
        assert_eq!(names, [secret.clone(), format!("{secret}-ca")]);
        assert_eq!(verbs, ["get", "update"]);
        assert!(creates);
    } else {
        assert_eq!(names, [secret.as_str()]);
        assert_eq!(verbs, ["get"]);
        assert!(!creates);
    }
    if mode == AgentTls::CertManager {
        let serving = certs.iter().find(|c| c["spec"]["secretName"] == secret.as_str()).expect("a Certificate");
        assert_eq!(serving["spec"]["dnsNames"], json!([server_name]));
        assert_eq!(serving["spec"]["issuerRef"]["name"], format!("{RELEASE}-haptic-agent-ca"));
        let ca = certs.iter().find(|c| c["spec"]["isCA"] == true).expect("a CA Certificate");
        let issuer = one(objs, "Issuer", "-agent-ca");
        assert_eq!(issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"]);
    } else {
        assert!(certs.is_empty(), "no cert-manager object without cert-manager");
    }
}

/// Every assertion on one render. `agent_port`, `min_reload` and `reload_timeout` are the values
/// the render was made with.
fn check_render(objs: &[Value], agent_port: u64, min_reload: &str, reload_timeout: &str) {
    let kinds = check_kinds(objs);
    let hap = one(objs, "Deployment", "-haproxy");
    let pod = &hap["spec"]["template"]["spec"];
    check_haproxy_pod(pod);
    check_containers(pod, agent_port, min_reload, reload_timeout);
    let hapc = check_credentials(objs, hap, agent_port);
    let ctl = check_controller(objs, hapc);
    check_rbac(objs, &kinds, ctl);
    check_network_policy(objs, pod, ctl, hapc, agent_port);
    check_services(objs, hapc);
}

/// Every kind the chart renders is there, each object in the release's namespace; the kinds
/// rendered.
fn check_kinds(objs: &[Value]) -> BTreeSet<&str> {
    let kinds: BTreeSet<&str> = objs.iter().map(kind_of).collect();
    for k in [
        "Deployment",
        "HAProxyConfig",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "NetworkPolicy",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(k), "no {k} rendered: {kinds:?}");
    }
    for o in objs {
        if kind_of(o) != "CustomResourceDefinition" {
            assert_eq!(o["metadata"]["namespace"], NAMESPACE, "{} {} namespace", kind_of(o), name_of(o));
        }
    }
    kinds
}

/// The HAProxy pod: init + HAProxy + agent, hardened, sharing the config tree and the socket
/// dir; only the agent sees the credential.
fn check_haproxy_pod(pod: &Value) {
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let init = container(pod, "init");
    let haproxy = container(pod, "haproxy");
    let agent = container(pod, "agent");
    for c in [init, haproxy, agent] {
        assert_hardened(c);
    }
    let volumes = volumes(pod);
    assert!(volumes["config"]["emptyDir"].is_object());
    assert!(volumes["run"]["emptyDir"].is_object());
    let (mi, mh, ma) = (mounts(init), mounts(haproxy), mounts(agent));
    assert_eq!(mi.get("config").map(String::as_str), Some("/etc/haproxy"));
    assert_eq!(mh.get("config").map(String::as_str), Some("/etc/haproxy"));
    assert_eq!(ma.get("config").map(String::as_str), Some("/etc/haproxy"));
    assert_eq!(mh.get("run").map(String::as_str), Some("/run/haptic"));
    assert_eq!(ma.get("run").map(String::as_str), Some("/run/haptic"));
    assert!(!mh.contains_key("credentials") && !mi.contains_key("credentials"), "only the agent sees the credential");
}

/// A pod's volumes by name.
fn volumes(pod: &Value) -> BTreeMap<&str, &Value> {
    pod["volumes"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect()
}

/// The HAProxy pod's containers: HAProxy in master-worker mode on the shared master socket and
/// the agent on the same socket with the render's flags; their ports and probes.
fn check_containers(pod: &Value, agent_port: u64, min_reload: &str, reload_timeout: &str) {
    let init = container(pod, "init");
    let haproxy = container(pod, "haproxy");
    let agent = container(pod, "agent");
    let ai = argv(init);
    assert_eq!(&ai[..2], ["haptic-agent", "init"]);
    assert_eq!(flag(&ai, "--root").as_deref(), Some("/etc/haproxy"));
    let health_port = port_named(haproxy, "health");
    assert_eq!(flag(&ai, "--health-bind"), Some(format!(":{health_port}")));
    let ah = argv(haproxy);
    assert_eq!(
        ah[..7],
        ["haproxy", "-W", "-db", "-S", "/run/haptic/master.sock,level,admin", "-f", "/etc/haproxy/current/haproxy.cfg"]
    );
    let aa = argv(agent);
    assert_eq!(&aa[..2], ["haptic-agent", "run"]);
    let master_socket = ah[4].split(',').next().unwrap();
    assert_eq!(flag(&aa, "--master-socket").as_deref(), Some(master_socket));
    assert_eq!(flag(&aa, "--root").as_deref(), Some("/etc/haproxy"));
    assert_eq!(flag(&aa, "--haproxy-bin").as_deref(), Some("/usr/sbin/haproxy"));
    assert_eq!(flag(&aa, "--listen"), Some(format!("0.0.0.0:{agent_port}")));
    assert_eq!(flag(&aa, "--min-reload-interval").as_deref(), Some(min_reload));
    assert_eq!(flag(&aa, "--reload-timeout").as_deref(), Some(reload_timeout));
    assert_eq!(port_named(agent, "agent"), agent_port);

    // Ports: HAProxy's traffic and health ports never clash with the agent's.
    let hap_ports: Vec<u64> =
        haproxy["ports"].as_array().unwrap().iter().map(|p| p["containerPort"].as_u64().unwrap()).collect();
    assert!(hap_ports.contains(&8080) && hap_ports.contains(&8443), "HAProxy serves 8080/8443: {hap_ports:?}");
    assert!(!hap_ports.contains(&agent_port), "agent port {agent_port} clashes with HAProxy's {hap_ports:?}");

    // Probes: HAProxy /healthz (liveness) and /ready (readiness), agent /healthz and /readyz.
    assert_http_probe(haproxy, "livenessProbe", "/healthz", "health");
    assert_http_probe(haproxy, "readinessProbe", "/ready", "health");
    assert_http_probe(agent, "livenessProbe", "/healthz", "agent");
    assert_http_probe(agent, "readinessProbe", "/readyz", "agent");
}

/// The credential: one Secret, the agent's file from its `credentials` key, the HAProxyConfig
/// naming the same Secret and selecting exactly the HAProxy pods. Returns the HAProxyConfig.
fn check_credentials<'a>(objs: &'a [Value], hap: &Value, agent_port: u64) -> &'a Value {
    let pod = &hap["spec"]["template"]["spec"];
    let volumes = volumes(pod);
    let ma = mounts(container(pod, "agent"));
    let aa = argv(container(pod, "agent"));
    let secret = one(objs, "Secret", "-agent-credentials");
    let secret_name = name_of(secret);
    let creds = &volumes["credentials"]["secret"];
    assert_eq!(creds["secretName"], secret_name);
    assert_eq!(creds["items"][0]["key"], "credentials");
    let cred_path = format!("{}/{}", ma["credentials"], creds["items"][0]["path"].as_str().unwrap());
    assert_eq!(flag(&aa, "--credentials-file"), Some(cred_path));
    assert!(secret["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(), "uninstall must remove it");
    let typed: Secret = serde_json::from_value(secret.clone()).unwrap();
    let data = typed.data.unwrap_or_default();
    let decode =
        |k: &str| String::from_utf8(data.get(k).unwrap_or_else(|| panic!("Secret has no {k}")).0.clone()).unwrap();
    let (user, pass, line) = (decode("username"), decode("password"), decode("credentials"));
    assert_eq!(line, format!("{user}:{pass}"));
    assert!(pass.len() >= 32, "a generated password of 32 characters");

    let hapc = one(objs, "HAProxyConfig", "");
    let spec = &hapc["spec"];
    assert_eq!(spec["agent"]["port"], agent_port);
    assert_eq!(spec["agent"]["container"], "agent");
    assert_eq!(spec["agent"]["credentialsSecretRef"]["name"], secret_name);
    assert!(spec.get("dataplane").is_none(), "the agents' flags are not part of the HAProxyConfig");
    // The podSelector selects exactly the HAProxy pods.
    let pod_labels = &hap["spec"]["template"]["metadata"]["labels"];
    for (k, v) in spec["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "podSelector label {k}");
    }
    assert_eq!(&hap["spec"]["selector"], &spec["podSelector"]);
    hapc
}

/// The controller: leader election on >= 2 replicas, identity from the downward API, the
/// HAProxyConfig `hapc` by name. Returns its Deployment.
fn check_controller<'a>(objs: &'a [Value], hapc: &Value) -> &'a Value {
    let ctl = one(objs, "Deployment", "-controller");
    assert!(ctl["spec"]["replicas"].as_u64().unwrap() >= 2);
    let cpod = &ctl["spec"]["template"]["spec"];
    let c = container(cpod, "controller");
    assert_hardened(c);
    let ac = argv(c);
    assert_eq!(ac[0], "run");
    assert!(ac.contains(&"--kubernetes".to_string()));
    assert_eq!(flag(&ac, "--config").as_deref(), Some(name_of(hapc)));
    assert_eq!(flag(&ac, "--haproxy-bin").as_deref(), Some("/usr/sbin/haproxy"));
    let admin_port = port_named(c, "metrics");
    assert_eq!(flag(&ac, "--admin-listen"), Some(format!("0.0.0.0:{admin_port}")));
    let env: BTreeMap<&str, &Value> =
        c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), &e["valueFrom"])).collect();
    assert_eq!(env["POD_NAME"]["fieldRef"]["fieldPath"], "metadata.name");
    assert_eq!(env["POD_NAMESPACE"]["fieldRef"]["fieldPath"], "metadata.namespace");
    assert_http_probe(c, "livenessProbe", "/healthz", "metrics");
    assert_http_probe(c, "readinessProbe", "/healthz", "metrics");
    assert_eq!(mounts(c).get("tmp").map(String::as_str), Some("/tmp"), "the gate's temp dir is writable");
    ctl
}

/// RBAC: exactly the verbs the controller uses, in its namespace only, bound to the
/// controller's ServiceAccount.
fn check_rbac(objs: &[Value], kinds: &BTreeSet<&str>, ctl: &Value) {
    let sa = ctl["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
    assert!(!kinds.contains("ClusterRole") && !kinds.contains("ClusterRoleBinding"));
    let role = one(objs, "Role", "-controller");
    let mut rules: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in role["rules"].as_array().unwrap() {
        for g in r["apiGroups"].as_array().unwrap() {
            for res in r["resources"].as_array().unwrap() {
                let verbs = rules.entry((g.as_str().unwrap().into(), res.as_str().unwrap().into())).or_default();
                verbs.extend(r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()));
            }
        }
    }
    let want: BTreeMap<(String, String), BTreeSet<String>> = [
        ("", "pods", &["list", "watch"][..]),
        ("", "configmaps", &["list", "watch"]),
        ("", "secrets", &["list", "watch", "get", "update", "create"]),
        ("coordination.k8s.io", "leases", &["get", "create", "update"]),
        ("haptic.dev", "haproxyconfigs", &["get", "list", "watch"]),
        ("haptic.dev", "haproxyconfigs/status", &["patch"]),
        ("events.k8s.io", "events", &["create", "patch"]),
    ]
    .into_iter()
    .map(|(g, r, v)| ((g.to_string(), r.to_string()), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(rules, want, "RBAC rules");
    let binding = one(objs, "RoleBinding", "-controller");
    assert_eq!(binding["roleRef"]["name"], name_of(role));
    assert_eq!(binding["subjects"][0]["name"], sa);
    one(objs, "ServiceAccount", sa);
}

/// NetworkPolicy: the HAProxy pods; the agent port only from the controller pods; HAProxy's
/// exporter port open like its health port.
fn check_network_policy(objs: &[Value], pod: &Value, ctl: &Value, hapc: &Value, agent_port: u64) {
    let spec = &hapc["spec"];
    let haproxy = container(pod, "haproxy");
    let health_port = port_named(haproxy, "health");
    let np = one(objs, "NetworkPolicy", "-haproxy");
    assert_eq!(&np["spec"]["podSelector"], &spec["podSelector"]);
    let ctl_labels = &ctl["spec"]["selector"]["matchLabels"];
    let rules = np["spec"]["ingress"].as_array().unwrap();
    let agent_rules: Vec<&Value> = rules
        .iter()
        .filter(|r| r["ports"].as_array().unwrap().iter().any(|p| p["port"].as_u64() == Some(agent_port)))
        .collect();
    assert_eq!(agent_rules.len(), 1, "one rule opens the agent port");
    assert_eq!(agent_rules[0]["ports"].as_array().unwrap().len(), 1, "that rule opens only the agent port");
    assert_eq!(&agent_rules[0]["from"][0]["podSelector"]["matchLabels"], ctl_labels);
    assert!(agent_rules[0]["from"].as_array().is_some_and(|f| !f.is_empty()), "the agent port is never open to all");
    let metrics_port = port_named(haproxy, "metrics");
    assert!(
        rules.iter().any(|r| r["ports"].as_array().unwrap().iter().any(|p| p["port"].as_u64() == Some(metrics_port))
            && r["ports"].as_array().unwrap().iter().any(|p| p["port"].as_u64() == Some(health_port))),
        "the exporter port {metrics_port} is opened with the health port"
    );
}

/// The HAProxy Service (80/443 to the named container ports, selecting the HAProxy pods) and
/// PDBs for both Deployments.
fn check_services(objs: &[Value], hapc: &Value) {
    let spec = &hapc["spec"];
    let svc = one(objs, "Service", "-haproxy");
    let ports: BTreeMap<&str, (&Value, &Value)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), (&p["port"], &p["targetPort"])))
        .collect();
    assert_eq!(ports["http"], (&json!(80), &json!("http")));
    assert_eq!(ports["https"], (&json!(443), &json!("https")));
    assert_eq!(&svc["spec"]["selector"], &spec["podSelector"]["matchLabels"]);

    assert_eq!(objs.iter().filter(|o| kind_of(o) == "PodDisruptionBudget").count(), 2);
}

#[test]
fn helm_lint_strict_passes_with_default_and_production_values() {
    let chart = chart_dir();
    let (ok, out, err) = helm(&["lint", "--strict", chart.to_str().unwrap()]);
    assert!(ok, "helm lint --strict:\n{out}\n{err}");
    let values = production_values();
    let (ok, out, err) = helm(&["lint", "--strict", chart.to_str().unwrap(), "-f", values.to_str().unwrap()]);
    assert!(ok, "helm lint --strict -f production-values.yaml:\n{out}\n{err}");
    for profile in ["daemonset", "hpa", "ingress", "cert-manager", "plain-http"] {
        let values = ci_values(profile);
        let (ok, out, err) = helm(&["lint", "--strict", chart.to_str().unwrap(), "-f", values.to_str().unwrap()]);
        assert!(ok, "helm lint --strict -f {profile}-values.yaml:\n{out}\n{err}");
    }
    let (_, version, _) = helm(&["version", "--short"]);
    println!("helm {} lints the chart clean (default and production values)", version.trim());
}

#[test]
fn default_render_is_wired_as_the_brief_says() {
    let objs = render_default();
    check_render(&objs, 9080, "2s", "10s");
    check_agent_tls(&objs, AgentTls::Controller);
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(!objs.iter().any(|o| kind_of(o) == kind), "{kind} is opt-in");
    }
    assert!(!objs.iter().any(|o| name_of(o).ends_with("-dashboard")), "the dashboard is opt-in");
    // HAProxy's own exporter: the default config serves it on the container port `metrics`.
    let hap = one(&objs, "Deployment", "-haproxy");
    let metrics_port = port_named(container(&hap["spec"]["template"]["spec"], "haproxy"), "metrics");
    assert_eq!(metrics_port, 8405);
    // Rollouts drain: the grace period covers the preStop sleep and the drain; the agent waits.
    let pod = &hap["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 75, "5 s preStop + 60 s drain + 10 s");
    let args = container(pod, "agent")["command"].as_array().unwrap().clone();
    assert!(args.contains(&json!("--drain-wait=70s")), "{args:?}");
    // New backends at runtime where HAProxy can, by default.
    assert!(args.contains(&json!("--runtime-backends=true")), "{args:?}");
    assert_eq!(pod["topologySpreadConstraints"][0]["whenUnsatisfiable"], "ScheduleAnyway", "a soft spread by default");
    let cfg = one(&objs, "HAProxyConfig", "")["spec"]["config"].as_str().unwrap().to_string();
    let exporter = cfg.split("\nfrontend ").find(|f| f.starts_with("prometheus")).expect("a frontend prometheus");
    assert!(exporter.contains(&format!("bind :{metrics_port}")), "{exporter}");
    assert!(exporter.contains("http-request use-service prometheus-exporter if { path /metrics }"), "{exporter}");
    assert_eq!(hap["spec"]["replicas"], 2);
    let image = container(&hap["spec"]["template"]["spec"], "agent")["image"].as_str().unwrap().to_string();
    assert_eq!(image, "ghcr.io/haptic/haptic-agent:0.1.0");
    // `helm template` renders no CRD (it lives in crds/, installed by `helm install`).
    assert!(!objs.iter().any(|o| kind_of(o) == "CustomResourceDefinition"));
    let with_crds = render(&["--include-crds"]);
    let crd = one(&with_crds, "CustomResourceDefinition", "haproxyconfigs.haptic.dev");
    let committed: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("crds/haproxyconfig.yaml")).unwrap()).unwrap();
    assert_eq!(crd, &committed, "the chart ships the committed (generated) CRD unchanged");
}

/// TLS on the control channel in each mode: the controller issues (default), cert-manager
/// (`certManager.enabled: true`; `auto` without cert-manager on the cluster is the controller),
/// the admin's Secret, and off.
#[test]
fn agent_tls_in_every_mode() {
    check_agent_tls(&render_ci("cert-manager"), AgentTls::CertManager);
    check_agent_tls(&render(&["--set", "agent.tls.existingSecret=mine"]), AgentTls::Existing);
    check_agent_tls(&render_ci("plain-http"), AgentTls::Off);
    // `auto` follows what the cluster serves (helm's --api-versions stands in for it here).
    check_agent_tls(&render(&["--api-versions", "cert-manager.io/v1"]), AgentTls::CertManager);
    check_agent_tls(
        &render(&["--set", "agent.tls.certManager.enabled=false", "--api-versions", "cert-manager.io/v1"]),
        AgentTls::Controller,
    );
    // An existing issuer replaces the chart's self-signed CA.
    let objs = render(&[
        "-f",
        ci_values("cert-manager").to_str().unwrap(),
        "--set",
        "agent.tls.certManager.issuerRef.name=corp",
        "--set",
        "agent.tls.certManager.issuerRef.kind=ClusterIssuer",
    ]);
    let certs: Vec<&Value> = objs.iter().filter(|o| kind_of(o) == "Certificate").collect();
    assert_eq!(certs.len(), 1, "only the serving Certificate");
    assert_eq!(
        certs[0]["spec"]["issuerRef"],
        json!({"name": "corp", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert!(!objs.iter().any(|o| kind_of(o) == "Issuer"));
    // The PodMonitor scrapes the agents over TLS, verified like the controller does.
    let objs = render(&["--set", "metrics.podMonitor.enabled=true"]);
    let pm = one(&objs, "PodMonitor", "-haproxy");
    let agent = pm["spec"]["podMetricsEndpoints"].as_array().unwrap().iter().find(|e| e["port"] == "agent").unwrap();
    assert_eq!(agent["scheme"], "https");
    assert_eq!(agent["tlsConfig"]["serverName"], format!("{RELEASE}-haptic-agent.{NAMESPACE}.svc"));
    assert_eq!(
        agent["tlsConfig"]["ca"]["secret"],
        json!({"name": format!("{RELEASE}-haptic-agent-tls"), "key": "ca.crt"})
    );
}

#[test]
fn production_render_is_wired_as_the_brief_says() {
    let objs = render_production();
    check_render(&objs, 9090, "5s", "20s");
    assert_eq!(one(&objs, "Deployment", "-controller")["spec"]["replicas"], 3);
    assert_eq!(one(&objs, "Deployment", "-haproxy")["spec"]["replicas"], 6);
    assert_eq!(one(&objs, "HAProxyConfig", "edge")["spec"]["controller"]["gate"], "pessimistic");
    let sm = one(&objs, "ServiceMonitor", "-controller");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    check_monitoring(&objs);
    let np = one(&objs, "NetworkPolicy", "-haproxy");
    assert_eq!(np["spec"]["ingress"][0]["from"].as_array().unwrap().len(), 2, "controller pods + agentFrom");
    let ctl = one(&objs, "Deployment", "-controller");
    let image = container(&ctl["spec"]["template"]["spec"], "controller")["image"].as_str().unwrap().to_string();
    assert!(image.starts_with("registry.example.com/haptic/haptic-controller@sha256:"), "{image}");
}

/// The PodMonitor, the dashboard ConfigMap and the PrometheusRule of a render that enables them
/// (`ci/production-values.yaml`).
fn check_monitoring(objs: &[Value]) {
    let hap = one(objs, "Deployment", "-haproxy");
    let pod = &hap["spec"]["template"]["spec"];
    let pm = one(objs, "PodMonitor", "-haproxy");
    assert_eq!(pm["metadata"]["labels"]["release"], "prometheus", "metrics.podMonitor.labels");
    assert_eq!(&pm["spec"]["selector"], &hap["spec"]["selector"], "the PodMonitor selects the HAProxy pods");
    let endpoints: Vec<(&str, &str)> = pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["port"].as_str().unwrap(), e["path"].as_str().unwrap()))
        .collect();
    assert_eq!(endpoints, [("metrics", "/metrics"), ("agent", "/metrics")]);
    port_named(container(pod, "haproxy"), "metrics");
    port_named(container(pod, "agent"), "agent");

    let cm = one(objs, "ConfigMap", "-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1", "the Grafana sidecar's label");
    let shipped: Value = serde_json::from_str(cm["data"]["haptic.json"].as_str().unwrap()).unwrap();
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(chart_dir().join("dashboards/haptic.json")).unwrap()).unwrap();
    assert_eq!(shipped, committed, "the ConfigMap carries dashboards/haptic.json unchanged");
    let titles: BTreeSet<&str> =
        shipped["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    for want in [
        "Fleet convergence",
        "Deploys by mode",
        "Reloads avoided vs done",
        "Gate state",
        "Requests per backend",
        "Errors per backend",
        "Latency per backend",
    ] {
        assert!(titles.contains(want), "dashboard panel {want:?} missing: {titles:?}");
    }

    let rule = one(objs, "PrometheusRule", "");
    let alerts: BTreeSet<&str> =
        rule["spec"]["groups"][0]["rules"].as_array().unwrap().iter().map(|r| r["alert"].as_str().unwrap()).collect();
    let want: BTreeSet<&str> = [
        "HapticNoLeader",
        "HapticGatePinned",
        "HapticPodsNotConverged",
        "HapticApplyRejected",
        "HapticReloadFailures",
        "HapticRenderInvalid",
        "HapticCertificateExpiring",
        "HapticOldWorkersPiling",
    ]
    .into();
    assert_eq!(alerts, want);
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        assert!(r["expr"].as_str().unwrap().contains(&format!("namespace=\"{NAMESPACE}\"")), "{r}");
    }
}

#[test]
fn without_an_exporter_port_the_pod_monitor_scrapes_only_the_agent() {
    let objs = render(&["--set", "haproxy.metricsPort=null", "--set", "metrics.podMonitor.enabled=true"]);
    let hap = one(&objs, "Deployment", "-haproxy");
    let haproxy = container(&hap["spec"]["template"]["spec"], "haproxy");
    assert!(!haproxy["ports"].as_array().unwrap().iter().any(|p| p["name"] == "metrics"), "{haproxy}");
    let pm = one(&objs, "PodMonitor", "-haproxy");
    assert_eq!(pm["spec"]["podMetricsEndpoints"].as_array().unwrap().len(), 1);
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"], "agent");
}

/// The PrometheusRule's `spec` as a Prometheus rule file, in a temp dir.
fn rule_file(dir: &std::path::Path) -> PathBuf {
    let objs = render_production();
    let rule = one(&objs, "PrometheusRule", "");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_json::to_string_pretty(&rule["spec"]).unwrap()).unwrap();
    path
}

#[test]
fn the_prometheus_rules_pass_promtool_check_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = rule_file(dir.path());
    let (ok, said) = promtool(&["check", "rules", "--lint=all", "--lint-fatal", path.to_str().unwrap()], "");
    assert!(ok, "promtool check rules:\n{said}");
    assert!(said.contains("SUCCESS: 8 rules found"), "{said}");
}

/// `promtool test rules`: each alert fires on the series that mean its condition, with the
/// labels an operator routes on, and stays silent on a healthy fleet.
#[test]
fn each_alert_fires_on_its_condition_and_not_on_a_healthy_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rule_file(dir.path());
    let ns = NAMESPACE;
    let ctl = |pod: &str| format!("namespace=\"{ns}\",job=\"edge-controller\",pod=\"{pod}\"");
    let agent = format!("namespace=\"{ns}\",job=\"{ns}/edge-haproxy\",pod=\"edge-haproxy-0\"");
    // 1m steps over 30m: the healthy replica c0 leads until minute 15, then nobody does.
    let tests = json!({
        "rule_files": [rules.to_str().unwrap()],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": format!("haptic_leader{{{}}}", ctl("c0")), "values": "1x15 0x15"},
                {"series": format!("haptic_leader{{{}}}", ctl("c1")), "values": "0x30"},
                {"series": format!("haptic_gate_pinned{{{}}}", ctl("c0")), "values": "0x5 1x25"},
                {"series": format!("haptic_pods{{{}}}", ctl("c0")), "values": "3x30"},
                {"series": format!("haptic_pods_converged{{{}}}", ctl("c0")), "values": "3x2 2x28"},
                {"series": format!("haptic_pods{{{}}}", ctl("c1")), "values": "3x30"},
                {"series": format!("haptic_pods_converged{{{}}}", ctl("c1")), "values": "0x30"},
                {"series": format!("haptic_apply_rejected_total{{{},haproxy_pod=\"edge-haproxy-1\"}}", ctl("c0")), "values": "0x20 1x10"},
                {"series": format!("haptic_agent_reloads_total{{{agent},result=\"ok\"}}"), "values": "0+1x30"},
                {"series": format!("haptic_agent_reloads_total{{{agent},result=\"timeout\"}}"), "values": "0x24 1x6"},
                {"series": format!("haptic_agent_haproxy_old_workers{{{agent}}}"), "values": "1x10 5x20"},
                {"series": format!("haptic_render_valid{{{},config=\"edge\"}}", ctl("c0")), "values": "1x12 0x18"},
                {"series": format!("haptic_render_valid{{{},config=\"edge\"}}", ctl("c1")), "values": "1x12 0x18"},
                {"series": format!("haptic_certificate_expiry_timestamp_seconds{{{},secret_namespace=\"shop\",secret=\"far\"}}", ctl("c0")), "values": "90000000x70"},
                {"series": format!("haptic_certificate_expiry_timestamp_seconds{{{},secret_namespace=\"shop\",secret=\"soon\"}}", ctl("c0")), "values": "900000x70"}
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "HapticNoLeader", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "HapticGatePinned", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "HapticApplyRejected", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "HapticReloadFailures", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "HapticRenderInvalid", "exp_alerts": []},
                {"eval_time": "18m", "alertname": "HapticRenderInvalid", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller", "config": "edge"},
                    "exp_annotations": {
                        "summary": "The HAProxyConfig does not render",
                        "description": format!("spec.render in {ns} has not rendered for 5m (a missing template, Secret or class); the pods keep their last config. `kubectl describe hapc` shows why.")
                    }
                }]},
                {"eval_time": "20m", "alertname": "HapticOldWorkersPiling", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "HapticCertificateExpiring", "exp_alerts": []},
                {"eval_time": "61m", "alertname": "HapticCertificateExpiring", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller", "secret_namespace": "shop", "secret": "soon"},
                    "exp_annotations": {
                        "summary": "A certificate the fleet serves expires soon",
                        "description": "The certificate of Secret shop/soon expires within 14 days (or has expired); clients that check it will refuse it."
                    }
                }]},
                {"eval_time": "27m", "alertname": "HapticOldWorkersPiling", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": format!("{ns}/edge-haproxy"), "pod": "edge-haproxy-0"},
                    "exp_annotations": {
                        "summary": "Old HAProxy workers pile up",
                        "description": "5 HAProxy workers in pod edge-haproxy-0 still drain connections after reloads: reloads come faster than long connections end (each holds its memory); `hard-stop-after` (haproxy.drainSeconds) bounds how long they stay."
                    }
                }]},
                {"eval_time": "11m", "alertname": "HapticPodsNotConverged", "exp_alerts": []},
                {"eval_time": "14m", "alertname": "HapticPodsNotConverged", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller", "pod": "c0"},
                    "exp_annotations": {
                        "summary": "HAProxy pods do not run the target plan",
                        "description": format!("1 HAProxy pod(s) in {ns} have not run the target plan for 10m.")
                    }
                }]},
                {"eval_time": "14m", "alertname": "HapticNoLeader", "exp_alerts": []},
                {"eval_time": "21m", "alertname": "HapticNoLeader", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller"},
                    "exp_annotations": {
                        "summary": "No haptic controller holds the Lease",
                        "description": format!("No controller replica in {ns} has deployed for 5m (none holds the Lease, or none is scraped); changes to the HAProxyConfig reach no pod.")
                    }
                }]},
                {"eval_time": "16m", "alertname": "HapticGatePinned", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller"},
                    "exp_annotations": {
                        "summary": "The gate keeps the fleet on its last good render",
                        "description": format!("The latest render in {ns} failed the gate for 10m; the pods keep the last good config. `kubectl describe hapc` shows why.")
                    }
                }]},
                {"eval_time": "22m", "alertname": "HapticApplyRejected", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": "edge-controller", "haproxy_pod": "edge-haproxy-1"},
                    "exp_annotations": {
                        "summary": "HAProxy refused an apply",
                        "description": "HAProxy in pod edge-haproxy-1 refused an apply in the last 10 minutes (the agent answered NACK and kept its previous config)."
                    }
                }]},
                {"eval_time": "27m", "alertname": "HapticReloadFailures", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": ns, "job": format!("{ns}/edge-haproxy"), "pod": "edge-haproxy-0"},
                    "exp_annotations": {
                        "summary": "HAProxy reloads fail",
                        "description": "Reloads of HAProxy in pod edge-haproxy-0 failed or timed out in the last 10 minutes."
                    }
                }]}
            ]
        }]
    });
    let test_file = dir.path().join("tests.yaml");
    std::fs::write(&test_file, serde_json::to_string_pretty(&tests).unwrap()).unwrap();
    let (ok, said) = promtool(&["test", "rules", test_file.to_str().unwrap()], "");
    assert!(ok, "promtool test rules:\n{said}");
}

#[test]
fn the_dashboard_and_rules_read_only_haptic_and_haproxy_metrics() {
    let wanted = names_read(&chart_monitoring_queries()).unwrap_or_else(|e| panic!("{e}"));
    let strays: Vec<&String> =
        wanted.keys().filter(|n| !n.starts_with("haptic_") && !n.starts_with("haproxy_")).collect();
    assert!(strays.is_empty(), "metrics neither haptic's nor HAProxy's exporter's: {strays:?}");
    assert!(wanted.keys().any(|n| n.starts_with("haproxy_backend_")), "per-backend traffic panels");
}

/// Starts `bin` with the chart's default haproxy.cfg, every `bind :PORT` moved to a free port on
/// 127.0.0.1, and checks HAProxy's exporter: it serves every `haproxy_*` name the dashboard and
/// the rules read, and its exposition parses (`promtool check metrics --extended --lint=none`).
///
/// HAProxy's own output does not pass promtool's lint: it reports
/// `haproxy_process_failed_resolutions counter metrics should have "_total" suffix` (2.6 and
/// 3.0). That name is HAProxy's, not ours, so only the parse is asserted here; haptic's own
/// `/metrics` pass every lint (controller/tests/metrics.rs).
async fn exporter_serves_every_haproxy_metric_read(bin: HaproxyBin) {
    let objs = render_default();
    let mut cfg = one(&objs, "HAProxyConfig", "")["spec"]["config"].as_str().unwrap().to_string();
    let hap = one(&objs, "Deployment", "-haproxy");
    let metrics_port = port_named(container(&hap["spec"]["template"]["spec"], "haproxy"), "metrics");
    let mut exporter = None;
    let binds: Vec<u64> =
        cfg.lines().filter_map(|l| l.trim().strip_prefix("bind :").and_then(|p| p.trim().parse().ok())).collect();
    for port in binds {
        let local = free_port();
        cfg = cfg.replace(&format!("bind :{port}\n"), &format!("bind 127.0.0.1:{local}\n"));
        if port == metrics_port {
            exporter = Some(std::net::SocketAddr::from(([127, 0, 0, 1], local)));
        }
    }
    let exporter = exporter.expect("the default config binds the exporter port");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("config")).unwrap();
    std::fs::write(dir.path().join("haproxy.cfg"), &cfg).unwrap();
    let mut hap = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap_or_else(|e| panic!("{e}"));
    // The exporter answers chunked: reqwest decodes it.
    let resp = reqwest::get(format!("http://{exporter}/metrics")).await.expect("GET the exporter's /metrics");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();

    let wanted = names_read(&chart_monitoring_queries()).unwrap_or_else(|e| panic!("{e}"));
    let absent = missing(&wanted, "haproxy_", &exposed_names(&text));
    assert!(absent.is_empty(), "{} serves no {absent:?}", bin.label());
    let (ok, said) = promtool(&["check", "metrics", "--extended", "--lint=none"], &text);
    assert!(ok, "promtool cannot parse {}'s exposition:\n{said}", bin.label());
    let (_, lint) = promtool(&["check", "metrics"], &text);
    println!(
        "{}: every haproxy_* name read is served; promtool's lint on HAProxy's own names: {}",
        bin.label(),
        lint.trim()
    );
    let pids = hap.kill();
    assert_no_stray(&pids);
}

on_each_version!(exporter_serves_every_haproxy_metric_read);

#[test]
fn daemonset_mode_with_host_network_and_every_extension_point() {
    let objs = render_ci("daemonset");
    assert!(!objs.iter().any(|o| kind_of(o) == "Deployment" && name_of(o).ends_with("-haproxy")));
    assert!(!objs.iter().any(|o| kind_of(o) == "HorizontalPodAutoscaler"));
    let ds = one(&objs, "DaemonSet", "-haproxy");
    assert!(ds["spec"].get("replicas").is_none());
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 2);
    assert_eq!(
        (ds["spec"]["minReadySeconds"].as_u64(), ds["spec"]["revisionHistoryLimit"].as_u64()),
        (Some(5), Some(3))
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        (pod["hostNetwork"].as_bool(), pod["dnsPolicy"].as_str()),
        (Some(true), Some("ClusterFirstWithHostNet"))
    );
    assert!(pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "geoip"));
    let hap = container(pod, "haproxy");
    let http = hap["ports"].as_array().unwrap().iter().find(|p| p["name"] == "http").unwrap();
    assert_eq!(http["hostPort"], 8080);
    assert_eq!(mounts(hap).get("geoip").map(String::as_str), Some("/usr/share/geoip"));
    assert_eq!(hap["env"][0]["name"], "HAPROXY_EXTRA");
    assert_eq!(hap["lifecycle"]["preStop"]["exec"]["command"], json!(["sleep", "7"]), "lifecycle replaces the sleep");
    assert!(
        hap["image"].as_str().unwrap().starts_with("mirror.internal:5000/haptic/haptic-agent:"),
        "{}",
        hap["image"]
    );
    let agent = container(pod, "agent");
    assert_eq!(mounts(agent).get("geoip").map(String::as_str), Some("/geoip"));
    let agent_env: Vec<&Value> = agent["env"].as_array().unwrap().iter().map(|e| &e["name"]).collect();
    assert!(agent_env.contains(&&json!("AGENT_EXTRA")), "{agent_env:?}");
    // HAProxy's variables reach the agent too: its haproxy -c of a config naming them sees them.
    assert!(agent_env.contains(&&json!("HAPROXY_EXTRA")), "{agent_env:?}");
    assert_eq!(agent["lifecycle"]["preStop"]["exec"]["command"], json!(["sleep", "1"]));
    assert_eq!(container(pod, "logger")["image"], "busybox:1.36");
    assert_eq!(hap["envFrom"][0]["configMapRef"]["name"], "haproxy-vars");
    assert_eq!(agent["envFrom"], hap["envFrom"], "the agent's haproxy -c sees HAProxy's variables");
    let inits: Vec<&Value> = pod["initContainers"].as_array().unwrap().iter().map(|c| &c["name"]).collect();
    assert_eq!(inits, [&json!("init"), &json!("warm-geoip")], "the chart's first");
    assert!(pod.get("topologySpreadConstraints").is_none(), "no default spread for a DaemonSet");
    let ctl = one(&objs, "Deployment", "-controller");
    assert_eq!(
        mounts(container(&ctl["spec"]["template"]["spec"], "controller")).get("templates").map(String::as_str),
        Some("/templates")
    );
    let image = container(&ctl["spec"]["template"]["spec"], "controller")["image"].as_str().unwrap().to_string();
    assert!(image.starts_with("mirror.internal:5000/haptic/haptic-controller:"), "{image}");
    let svc = one(&objs, "Service", "-haproxy");
    assert_eq!(svc["metadata"]["labels"]["team"], "edge");
    assert_eq!(svc["spec"]["loadBalancerClass"], "example.com/internal");
    assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(svc["spec"]["ipFamilyPolicy"], "SingleStack");
    let http = svc["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "http").unwrap();
    assert_eq!(http["nodePort"], 30080);
}

#[test]
fn ingress_mode_creates_the_class_renders_and_grows_rbac_by_the_watchers() {
    // Off (the default): namespace-scoped only, no IngressClass, a raw config.
    let objs = render_default();
    for k in ["ClusterRole", "ClusterRoleBinding", "IngressClass"] {
        assert!(!objs.iter().any(|o| kind_of(o) == k), "no {k} without ingress.enabled");
    }
    assert!(one(&objs, "HAProxyConfig", "")["spec"].get("render").is_none());

    let objs = render_ci("ingress");
    let class = one(&objs, "IngressClass", "haptic");
    assert_eq!(class["spec"]["controller"], "haptic.dev/ingress-controller");
    assert_eq!(class["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"], "true");
    let spec = &one(&objs, "HAProxyConfig", "")["spec"];
    assert!(spec.get("config").is_none() && spec.get("configFrom").is_none(), "render replaces config: {spec}");
    let r = &spec["render"];
    assert_eq!(r["ingressClassName"], "haptic");
    assert_eq!(r["publishService"]["name"], name_of(one(&objs, "Service", "-haproxy")), "the HAProxy Service");
    let hap = one(&objs, "Deployment", "-haproxy");
    let haproxy = container(&hap["spec"]["template"]["spec"], "haproxy");
    assert_eq!(r["httpPort"], port_named(haproxy, "http"));
    assert_eq!(r["healthPort"], port_named(haproxy, "health"), "the probes' port");
    assert_eq!(r["serverSlots"], 16);
    assert_eq!(r["snippets"]["defaults"], "    timeout http-request 10s");
    // The ClusterRole: exactly what the watchers, the Ingress status and the Events need.
    let got = grants(one(&objs, "ClusterRole", ""));
    assert_eq!(
        got,
        [
            "/secrets: get,list,watch",
            "/services: get,list,watch",
            "discovery.k8s.io/endpointslices: get,list,watch",
            "events.k8s.io/events: create,patch",
            "networking.k8s.io/ingressclasses: get,list,watch",
            "networking.k8s.io/ingresses/status: update,patch",
            "networking.k8s.io/ingresses: get,list,watch",
        ]
    );
    let binding = one(&objs, "ClusterRoleBinding", "");
    assert_eq!(binding["roleRef"]["name"], one(&objs, "ClusterRole", "")["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], name_of(one(&objs, "ServiceAccount", "-controller")));
    // The namespaced Role stays as it is.
    one(&objs, "Role", "-controller");
}

/// A Role's or ClusterRole's rules, one `group/resource: verbs` line per group and resource,
/// sorted.
fn grants(role: &Value) -> Vec<String> {
    let mut got: Vec<String> = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for g in rule["apiGroups"].as_array().unwrap() {
            for res in rule["resources"].as_array().unwrap() {
                got.push(format!("{}/{}: {}", g.as_str().unwrap(), res.as_str().unwrap(), verbs.join(",")));
            }
        }
    }
    got.sort();
    got
}

#[test]
fn render_namespaces_grant_a_role_in_each_and_keep_cluster_read_to_cluster_kinds() {
    let objs = render(&["--set", "ingress.enabled=true", "--set", "render.namespaces={team-a,team-b}"]);
    let r = &one(&objs, "HAProxyConfig", "")["spec"]["render"];
    assert_eq!(r["namespaces"], json!(["team-a", "team-b"]));
    // Cluster-wide: only the cluster-scoped kind; no Secret, Service or Ingress read.
    assert_eq!(grants(one(&objs, "ClusterRole", "")), ["networking.k8s.io/ingressclasses: get,list,watch"]);
    let namespaced = [
        "/secrets: get,list,watch",
        "/services: get,list,watch",
        "discovery.k8s.io/endpointslices: get,list,watch",
        "events.k8s.io/events: create,patch",
        "networking.k8s.io/ingresses/status: update,patch",
        "networking.k8s.io/ingresses: get,list,watch",
    ];
    // A Role and its binding in each listed namespace and the release's, for the controller.
    let sa = name_of(one(&objs, "ServiceAccount", "-controller"));
    let mut in_ns: Vec<String> = Vec::new();
    for o in objs.iter().filter(|o| kind_of(o) == "Role" && name_of(o).ends_with(&format!("-render-{NAMESPACE}"))) {
        assert_eq!(grants(o), namespaced, "{o}");
        let ns = o["metadata"]["namespace"].as_str().unwrap();
        let b = objs
            .iter()
            .find(|b| kind_of(b) == "RoleBinding" && b["metadata"]["namespace"] == ns && name_of(b) == name_of(o))
            .unwrap_or_else(|| panic!("no RoleBinding for the Role in {ns}"));
        assert_eq!((b["roleRef"]["kind"].as_str(), b["subjects"][0]["name"].as_str()), (Some("Role"), Some(sa)));
        in_ns.push(ns.to_string());
    }
    in_ns.sort();
    assert_eq!(in_ns, [NAMESPACE, "team-a", "team-b"]);

    // Gateway mode: GatewayClasses and Namespaces stay cluster-wide, the rest moves into Roles.
    let objs = render(&["--set", "gateway.enabled=true", "--set", "render.namespaces={team-a}"]);
    assert_eq!(
        grants(one(&objs, "ClusterRole", "")),
        [
            "/namespaces: get,list,watch",
            "gateway.networking.k8s.io/gatewayclasses/status: get,update,patch",
            "gateway.networking.k8s.io/gatewayclasses: get,list,watch",
        ]
    );
    let roles: Vec<&Value> =
        objs.iter().filter(|o| kind_of(o) == "Role" && name_of(o).ends_with(&format!("-render-{NAMESPACE}"))).collect();
    assert_eq!(roles.len(), 2);
    assert!(roles
        .iter()
        .all(|r| grants(r).contains(&"gateway.networking.k8s.io/httproutes: get,list,watch".to_string())));
}

#[test]
fn gateway_mode_creates_the_class_renders_and_grows_rbac_by_the_watchers() {
    assert!(!render_default().iter().any(|o| kind_of(o) == "GatewayClass"), "no GatewayClass without gateway.enabled");
    let objs = render(&["--set", "gateway.enabled=true"]);
    let class = one(&objs, "GatewayClass", "haptic");
    assert_eq!(class["spec"]["controllerName"], "haptic.dev/gateway-controller");
    let r = &one(&objs, "HAProxyConfig", "")["spec"]["render"];
    assert_eq!(r["gatewayClassName"], "haptic");
    assert!(r.get("ingressClassName").is_none());
    let got = grants(one(&objs, "ClusterRole", ""));
    assert_eq!(
        got,
        [
            "/configmaps: get,list,watch",
            "/namespaces: get,list,watch",
            "/secrets: get,list,watch",
            "/services: create,patch",
            "/services: get,list,watch",
            "discovery.k8s.io/endpointslices: get,list,watch",
            "events.k8s.io/events: create,patch",
            "gateway.networking.k8s.io/backendtlspolicies/status: get,update,patch",
            "gateway.networking.k8s.io/backendtlspolicies: get,list,watch",
            "gateway.networking.k8s.io/gatewayclasses/status: get,update,patch",
            "gateway.networking.k8s.io/gatewayclasses: get,list,watch",
            "gateway.networking.k8s.io/gateways/status: get,update,patch",
            "gateway.networking.k8s.io/gateways: get,list,watch",
            "gateway.networking.k8s.io/grpcroutes/status: get,update,patch",
            "gateway.networking.k8s.io/grpcroutes: get,list,watch",
            "gateway.networking.k8s.io/httproutes/status: get,update,patch",
            "gateway.networking.k8s.io/httproutes: get,list,watch",
            "gateway.networking.k8s.io/listenersets/status: get,update,patch",
            "gateway.networking.k8s.io/listenersets: get,list,watch",
            "gateway.networking.k8s.io/referencegrants: get,list,watch",
            "gateway.networking.k8s.io/tcproutes/status: get,update,patch",
            "gateway.networking.k8s.io/tcproutes: get,list,watch",
            "gateway.networking.k8s.io/tlsroutes/status: get,update,patch",
            "gateway.networking.k8s.io/tlsroutes: get,list,watch",
        ]
    );
    // The Gateways' own Services, in the release's namespace only.
    let role = one(&objs, "Role", "-controller");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"][0] == "services" && r["verbs"].as_array().unwrap().iter().any(|v| v == "delete")),
        "{role}"
    );
    // One HAProxyConfig serves either Ingresses or a GatewayClass.
    let chart = chart_dir().display().to_string();
    let (ok, _, err) =
        helm(&["template", "t", &chart, "--set", "gateway.enabled=true", "--set", "ingress.enabled=true"]);
    assert!(!ok && err.contains("only one of"), "{err}");
}

#[test]
fn hpa_mode_scales_the_haproxy_deployment() {
    let objs = render_ci("hpa");
    let hap = one(&objs, "Deployment", "-haproxy");
    assert!(hap["spec"].get("replicas").is_none(), "the HPA owns replicas");
    let hpa = one(&objs, "HorizontalPodAutoscaler", "-haproxy");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], hap["metadata"]["name"]);
    assert_eq!((hpa["spec"]["minReplicas"].as_u64(), hpa["spec"]["maxReplicas"].as_u64()), (Some(3), Some(12)));
    assert_eq!(hpa["spec"]["metrics"].as_array().unwrap().len(), 2);
    assert_eq!(hap["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0, "the default strategy");
}

#[test]
fn the_values_schema_refuses_bad_values() {
    for bad in [
        "agent.port=0",
        "config.controller.gate=sometimes",
        "controller.leaseDuration=soon",
        "nope=1",
        "haproxy.kind=StatefulSet",
        "haproxy.service.ipFamilyPolicy=Maybe",
        "haproxy.hostPorts.http=0",
        "agent.credentials.grace=soon",
        "haproxy.metricsPort=0",
        "metrics.prometheusRule.noLeaderFor=soon",
        "metrics.podMonitor.interval=often",
        "metrics.dashboard.extra=1",
        "agent.tls.enabled=maybe",
        "agent.tls.certManager.enabled=sometimes",
        "agent.tls.certManager.issuerRef.kind=Issuer",
        "agent.tls.serverName=Not_A_Name",
        "agent.tls.poll=often",
    ] {
        let chart = chart_dir();
        let (ok, _, err) = helm(&["template", RELEASE, chart.to_str().unwrap(), "--set", bad]);
        assert!(!ok, "--set {bad} rendered");
        assert!(err.contains("schema"), "--set {bad}: {err}");
    }
}

on_each_version!(sync the_default_haproxy_cfg_passes_haproxy_check);

fn the_default_haproxy_cfg_passes_haproxy_check(bin: HaproxyBin) {
    let objs = render_default();
    let cfg = one(&objs, "HAProxyConfig", "")["spec"]["config"].as_str().unwrap().to_string();
    assert!(cfg.contains("default-path config"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, &cfg).unwrap();
    let out = Command::new(&bin.path).arg("-c").arg("-f").arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "haproxy {} -c refused the chart's default config:\n{}{}",
        bin.version_string,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_rendered_object_passes_a_server_side_dry_run() {
    let started = Instant::now();
    let mut cp = ControlPlane::start().await.unwrap_or_else(|e| panic!("control plane did not start: {e}"));
    let client = cp.client().await.unwrap();

    // The generated CRD, for real (a dry-run HAProxyConfig needs it established).
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("crds/haproxyconfig.yaml")).unwrap()).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    eventually("the CRD to become Established", Duration::from_secs(30), || async {
        let c = crds.get("haproxyconfigs.haptic.dev").await.map_err(|e| e.to_string())?;
        let conditions = c.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
            Ok(())
        } else {
            Err(format!("conditions {conditions:?}"))
        }
    })
    .await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();

    let dry = PostParams { dry_run: true, ..Default::default() };
    let mut checked = 0;
    for (profile, objs) in [
        ("default", render_default()),
        ("production", render_production()),
        ("daemonset", render_ci("daemonset")),
        ("hpa", render_ci("hpa")),
        ("ingress", render_ci("ingress")),
        ("cert-manager", render_ci("cert-manager")),
        ("plain-http", render_ci("plain-http")),
    ] {
        for o in objs {
            let (kind, name) = (kind_of(&o).to_string(), name_of(&o).to_string());
            let api_version = o["apiVersion"].as_str().unwrap();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            if group == "monitoring.coreos.com" || group == "cert-manager.io" {
                // prometheus-operator's and cert-manager's CRDs are not part of this control plane.
                println!("{profile}: {kind} {name}: skipped (no {group} CRD here)");
                continue;
            }
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let (ar, caps) = pinned_kind(&client, &gvk).await.unwrap_or_else(|e| panic!("{profile}: {kind}: {e}"));
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), NAMESPACE, &ar),
                Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            let obj: DynamicObject = serde_json::from_value(o.clone()).unwrap();
            if let Err(e) = api.create(&dry, &obj).await {
                panic!("{profile}: the apiserver refused {kind} {name} (dry run): {e}\n{o:#}");
            }
            checked += 1;
        }
    }
    println!(
        "{checked} rendered objects accepted by kube-apiserver {} (dryRun: All) in {:?}",
        cp.version(),
        started.elapsed()
    );
    assert!(checked >= 58, "every render checked");
    let pids = cp.pids();
    cp.stop();
    assert_no_stray(&pids);
}

#[tokio::test]
async fn helm_install_then_upgrade_keeps_the_generated_credential() {
    let mut cp = ControlPlane::start().await.unwrap_or_else(|e| panic!("control plane did not start: {e}"));
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.kubeconfig().to_str().unwrap().to_string();
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let ns = "haptic-install";
    let common = ["--namespace", ns, "--kubeconfig", kubeconfig.as_str()];

    // A real install (CRD from crds/ first, then every template); no kubelet runs the pods.
    let mut args = vec!["install", RELEASE, chart, "--create-namespace"];
    args.extend_from_slice(&common);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm install:\n{out}\n{err}");
    assert!(out.contains("kubectl -n haptic-install get hapc demo-haptic"), "NOTES:\n{out}");
    assert!(out.contains("(Lease haptic-demo-haptic)") && out.contains("2 pod(s) of"), "NOTES:\n{out}");
    assert!(out.contains("helm show crds"), "NOTES say how to upgrade the CRD:\n{out}");
    // NOTES name the Lease actually used, and the DaemonSet (a server-side dry run of an upgrade).
    let daemonset = ci_values("daemonset");
    let mut args = vec!["upgrade", RELEASE, chart, "--dry-run=server", "-f", daemonset.to_str().unwrap()];
    args.extend_from_slice(&common);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm upgrade --dry-run=server -f daemonset-values.yaml:\n{out}\n{err}");
    assert!(
        out.contains("(Lease edge-leader)") && out.contains("a DaemonSet (one pod per node, host network)"),
        "NOTES:\n{out}"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let password = |s: Secret| s.data.unwrap_or_default()["password"].0.clone();
    let first = password(secrets.get("demo-haptic-agent-credentials").await.unwrap());
    assert_eq!(first.len(), 32);
    let gvk = GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig");
    let (ar, _) = pinned_kind(&client, &gvk).await.unwrap();
    let hapc = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar).get("demo-haptic").await.unwrap();
    assert_eq!(hapc.data["spec"]["agent"]["port"], 9080);

    // An upgrade renders a fresh random password, but `lookup` keeps the one the cluster holds.
    let mut args = vec!["upgrade", RELEASE, chart, "--set", "haproxy.replicas=3"];
    args.extend_from_slice(&common);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm upgrade:\n{out}\n{err}");
    let second = password(secrets.get("demo-haptic-agent-credentials").await.unwrap());
    assert_eq!(first, second, "the credential survives an upgrade");

    // Uninstall removes it with the release (a reinstall makes new pods with a new one).
    let mut args = vec!["uninstall", RELEASE];
    args.extend_from_slice(&common);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm uninstall:\n{out}\n{err}");
    assert!(secrets.get_opt("demo-haptic-agent-credentials").await.unwrap().is_none());
    println!(
        "helm install, upgrade and uninstall against kube-apiserver {}: the credential survived the upgrade",
        cp.version()
    );
    let pids = cp.pids();
    cp.stop();
    assert_no_stray(&pids);
}
