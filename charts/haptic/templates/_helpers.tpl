{{/* The chart name. */}}
{{- define "haptic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object name prefix. */}}
{{- define "haptic.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "haptic.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "haptic.labels" -}}
helm.sh/chart: {{ include "haptic.chart" . }}
app.kubernetes.io/name: {{ include "haptic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: haptic
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of the controller pods. */}}
{{- define "haptic.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "haptic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Selector labels of the HAProxy pods (also the HAProxyConfig's podSelector). */}}
{{- define "haptic.haproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "haptic.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: haproxy
{{- end }}

{{- define "haptic.controller.fullname" -}}
{{- printf "%s-controller" (include "haptic.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "haptic.haproxy.fullname" -}}
{{- printf "%s-haproxy" (include "haptic.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "haptic.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "haptic.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "haptic.haproxy.serviceAccountName" -}}
{{- if .Values.haproxy.serviceAccount.create }}
{{- default (include "haptic.haproxy.fullname" .) .Values.haproxy.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.haproxy.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The HAProxyConfig's name. */}}
{{- define "haptic.configName" -}}
{{- default (include "haptic.fullname" .) .Values.config.name }}
{{- end }}

{{/* The credentials Secret's name. */}}
{{- define "haptic.credentialsSecret" -}}
{{- default (printf "%s-agent-credentials" (include "haptic.fullname" .)) .Values.agent.credentials.existingSecret }}
{{- end }}

{{/* An image reference: repository, then @digest or :tag (default appVersion). */}}
{{- define "haptic.image" -}}
{{- $img := index .root.Values.images .which }}
{{- $repo := $img.repository }}
{{- with (.root.Values.global).imageRegistry }}
{{- /* Replace the repository's registry host (a first component with a dot or a colon, or
       "localhost"), or prefix it when it has none. */}}
{{- $parts := splitList "/" $repo }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq "localhost" $first)) }}
{{- $repo = join "/" (rest $parts) }}
{{- end }}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}
{{- end }}
{{- if $img.digest }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/* The config tree and socket paths, shared by the HAProxy container and the agent. */}}
{{- define "haptic.configRoot" -}}/etc/haproxy{{- end }}
{{- define "haptic.runDir" -}}/run/haptic{{- end }}
{{- define "haptic.masterSocket" -}}/run/haptic/master.sock{{- end }}
{{- define "haptic.credentialsDir" -}}/etc/haptic/credentials{{- end }}
{{- define "haptic.tlsDir" -}}/etc/haptic/tls{{- end }}

{{/* The agents' serving Secret (`tls.crt`, `tls.key`, `ca.crt`). */}}
{{- define "haptic.agentTls.secret" -}}
{{- default (printf "%s-agent-tls" (include "haptic.fullname" .)) .Values.agent.tls.existingSecret }}
{{- end }}

{{/* The DNS name every agent certificate carries and the controller verifies (pod IPs change). */}}
{{- define "haptic.agentTls.serverName" -}}
{{- default (printf "%s-agent.%s.svc" (include "haptic.fullname" .) .Release.Namespace) .Values.agent.tls.serverName }}
{{- end }}

{{/* Who issues the agents' certificate: `existing` (agent.tls.existingSecret), `cert-manager`
     (certManager.enabled true, or `auto` on a cluster serving cert-manager.io/v1), or
     `controller` (the controller makes and rotates it). Empty with TLS off. */}}
{{- define "haptic.agentTls.issuer" -}}
{{- if .Values.agent.tls.enabled }}
{{- $cm := .Values.agent.tls.certManager.enabled }}
{{- if .Values.agent.tls.existingSecret }}existing
{{- else if or (eq (toString $cm) "true") (and (eq (toString $cm) "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}cert-manager
{{- else }}controller
{{- end }}
{{- end }}
{{- end }}

{{/*
The edge fields of spec.render (both render modes): the access log, forwarded headers, PROXY
protocol, timeouts, HSTS, the stats frontend on haproxy.metricsPort and hard-stop-after from
haproxy.drainSeconds.
*/}}
{{- define "haptic.renderEdge" -}}
accessLog: {{ .Values.render.accessLog }}
forwardedHeaders:
  enabled: {{ .Values.render.forwardedHeaders.enabled }}
  {{- with .Values.render.forwardedHeaders.trustedProxies }}
  trustedProxies:
    {{- toYaml . | nindent 4 }}
  {{- end }}
proxyProtocol: {{ .Values.render.proxyProtocol }}
{{- with .Values.render.timeouts }}
timeouts:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.render.hsts }}
hsts:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.haproxy.metricsPort }}
statsPort: {{ . }}
{{- end }}
defaultCertificate:
  name: {{ include "haptic.defaultCertificateSecret" . }}
drainSeconds: {{ .Values.haproxy.drainSeconds }}
{{- with .Values.render.namespaces }}
namespaces:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The HAProxy pods' grace period: haproxy.terminationGracePeriodSeconds, or the preStop sleep, the
drain and 10 s for the agent to see HAProxy gone.
*/}}
{{- define "haptic.haproxy.grace" -}}
{{- if kindIs "invalid" .Values.haproxy.terminationGracePeriodSeconds -}}
{{ add .Values.haproxy.preStopSleepSeconds .Values.haproxy.drainSeconds 10 }}
{{- else -}}
{{ .Values.haproxy.terminationGracePeriodSeconds }}
{{- end -}}
{{- end }}

{{/* Render mode's default certificate Secret: the one given, else the chart's. */}}
{{- define "haptic.defaultCertificateSecret" -}}
{{- default (printf "%s-default-tls" (include "haptic.fullname" .)) .Values.render.defaultCertificate.existingSecret }}
{{- end }}

{{/*
Render mode's read of cluster-scoped kinds: IngressClasses, or GatewayClasses (and their status)
and Namespaces (for allowedRoutes selectors).
*/}}
{{- define "haptic.render.clusterRules" -}}
{{- if .Values.ingress.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [ingressclasses]
  verbs: [get, list, watch]
{{- end }}
{{- if .Values.gateway.enabled }}
- apiGroups: [gateway.networking.k8s.io]
  resources: [gatewayclasses]
  verbs: [get, list, watch]
- apiGroups: [gateway.networking.k8s.io]
  resources: [gatewayclasses/status]
  verbs: [get, update, patch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end }}
{{- end }}

{{/*
Render mode's read of namespaced kinds, granted cluster-wide or, with render.namespaces, by a
Role in each of them: the Ingresses and their status, or the Gateway API kinds and their status
(ConfigMaps, each watched by name, only those BackendTLSPolicies name for CA certificates; each
Gateway's alias in its own namespace, an ExternalName Service the Gateway owns, which the
controller never deletes and never applies over a Service that is not the alias); Services,
EndpointSlices, Secrets (each watched by name) and Events.
*/}}
{{- define "haptic.render.namespacedRules" -}}
{{- if .Values.ingress.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [ingresses]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [ingresses/status]
  verbs: [update, patch]
{{- end }}
{{- if .Values.gateway.enabled }}
- apiGroups: [gateway.networking.k8s.io]
  resources: [gateways, listenersets, httproutes, grpcroutes, tlsroutes, tcproutes, referencegrants, backendtlspolicies]
  verbs: [get, list, watch]
- apiGroups: [gateway.networking.k8s.io]
  resources: [gateways/status, listenersets/status, httproutes/status, grpcroutes/status, tlsroutes/status, tcproutes/status, backendtlspolicies/status]
  verbs: [get, update, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [services]
  verbs: [create, patch]
{{- end }}
- apiGroups: [""]
  resources: [services, secrets]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* The namespaces render mode reads, in words: every one, or render.namespaces and the release's. */}}
{{- define "haptic.render.scope" -}}
{{- with .Values.render.namespaces -}}
namespaces {{ join ", " (uniq (append . $.Release.Namespace)) }} only
{{- else -}}
every namespace
{{- end -}}
{{- end }}
