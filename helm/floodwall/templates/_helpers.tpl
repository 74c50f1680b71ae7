{{/*
Named templates. Every one of them reads only .Values and .Release, so an application's own
chart can use them with floodwall as a dependency:

  {{- $fw := include "floodwall.sidecar" (dict "Values" .Values.floodwall "Release" .Release) | fromYaml }}

"floodwall.sidecar" renders a mapping for the application's pod spec:
  containers      the floodwall container (empty when sidecar.native)
  initContainers  the floodwall container as a native sidecar (empty unless sidecar.native)
  volumes         its volumes: policies ConfigMap, spool, telemetry, /tmp, the management Secret
  annotations     Prometheus scrape annotations for the pod template (metrics.podAnnotations)
  terminationGracePeriodSeconds  preStop sleep + drain deadline + margin
The policies ConfigMap itself is rendered by this chart (templates/configmap.yaml).
*/}}

{{- define "floodwall.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "floodwall" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-floodwall" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "floodwall.selectorLabels" -}}
app.kubernetes.io/name: floodwall
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of this chart's own objects (needs .Chart: not for the sidecar). */}}
{{- define "floodwall.labels" -}}
{{ include "floodwall.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "floodwall.policiesConfigMap" -}}
{{- if .Values.policies.existingConfigMap -}}
{{- .Values.policies.existingConfigMap -}}
{{- else -}}
{{- include "floodwall.fullname" . }}-policies
{{- end -}}
{{- end -}}

{{- define "floodwall.listenHost" -}}
{{- if .Values.listen.host -}}
{{- .Values.listen.host -}}
{{- else if eq .Values.mode "standalone" -}}
0.0.0.0
{{- else -}}
127.0.0.1
{{- end -}}
{{- end -}}

{{- define "floodwall.terminationGracePeriodSeconds" -}}
{{- add .Values.drain.preStopSleepSeconds .Values.drain.timeoutSeconds .Values.drain.graceMarginSeconds -}}
{{- end -}}

{{- define "floodwall.telemetryOn" -}}
{{- if and .Values.telemetry.enabled .Values.policies.enabled -}}true{{- end -}}
{{- end -}}

{{- define "floodwall.podAnnotations" -}}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.admin.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The container, as a mapping (callers put it in a list). */}}
{{- define "floodwall.container" -}}
name: floodwall
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- if and .Values.sidecar.native (ne .Values.mode "standalone") }}
restartPolicy: Always
{{- end }}
args:
  - run
  {{- if .Values.extraArgs }}
  {{- toYaml .Values.extraArgs | nindent 2 }}
  {{- end }}
ports:
  {{- if or (not .Values.tls.listener.enabled) .Values.tls.listener.plainListener }}
  - name: floodwall-amqp
    containerPort: {{ .Values.listen.port }}
    protocol: TCP
  {{- end }}
  - name: floodwall-admin
    containerPort: {{ .Values.admin.port }}
    protocol: TCP
  {{- if .Values.tls.listener.enabled }}
  - name: floodwall-amqps
    containerPort: {{ .Values.tls.listener.port }}
    protocol: TCP
  {{- end }}
env:
  - name: FLOODWALL_UPSTREAM
    value: {{ .Values.upstream | quote }}
  - name: FLOODWALL_LISTEN
    {{- if and .Values.tls.listener.enabled (not .Values.tls.listener.plainListener) }}
    value: "off"
    {{- else }}
    value: {{ printf "%s:%d" (include "floodwall.listenHost" .) (int .Values.listen.port) | quote }}
    {{- end }}
  {{- include "floodwall.tlsEnv" . }}
  - name: FLOODWALL_ADMIN
    value: {{ printf "%s:%d" .Values.admin.host (int .Values.admin.port) | quote }}
  - name: FLOODWALL_DRAIN_TIMEOUT
    value: {{ printf "%ds" (int .Values.drain.timeoutSeconds) | quote }}
  {{- if .Values.policies.enabled }}
  - name: FLOODWALL_POLICIES
    value: {{ printf "%s/policies.yaml" .Values.policies.mountPath | quote }}
  {{- end }}
  {{- if .Values.management.url }}
  - name: FLOODWALL_MANAGEMENT
    value: {{ .Values.management.url | quote }}
  {{- end }}
  {{- if .Values.management.existingSecret }}
  - name: FLOODWALL_MANAGEMENT_USERNAME
    valueFrom:
      secretKeyRef:
        name: {{ .Values.management.existingSecret }}
        key: {{ .Values.management.usernameKey }}
  {{- if .Values.management.passwordAsFile }}
  - name: FLOODWALL_MANAGEMENT_PASSWORD_FILE
    value: {{ printf "/etc/floodwall/management/%s" .Values.management.passwordKey | quote }}
  {{- else }}
  - name: FLOODWALL_MANAGEMENT_PASSWORD
    valueFrom:
      secretKeyRef:
        name: {{ .Values.management.existingSecret }}
        key: {{ .Values.management.passwordKey }}
  {{- end }}
  {{- end }}
  {{- if .Values.policies.shadow }}
  - name: FLOODWALL_SHADOW
    value: "true"
  {{- end }}
  - name: FLOODWALL_SPOOL_DIR
    value: {{ .Values.spool.mountPath | quote }}
  - name: FLOODWALL_TELEMETRY_DIR
    value: {{ if include "floodwall.telemetryOn" . }}{{ .Values.telemetry.mountPath | quote }}{{ else }}""{{ end }}
  {{- if include "floodwall.telemetryOn" . }}
  - name: FLOODWALL_TELEMETRY_MAX_TOTAL
    value: {{ .Values.telemetry.maxTotal | quote }}
  {{- end }}
  - name: FLOODWALL_LOG_LEVEL
    value: {{ .Values.logLevel | quote }}
  - name: FLOODWALL_LOG_FORMAT
    value: {{ .Values.logFormat | quote }}
  {{- if .Values.extraEnv }}
  {{- toYaml .Values.extraEnv | nindent 2 }}
  {{- end }}
volumeMounts:
  {{- if .Values.policies.enabled }}
  - name: floodwall-policies
    mountPath: {{ .Values.policies.mountPath }}
    readOnly: true
  {{- end }}
  - name: floodwall-spool
    mountPath: {{ .Values.spool.mountPath }}
  - name: floodwall-telemetry
    mountPath: {{ .Values.telemetry.mountPath }}
  - name: floodwall-tmp
    mountPath: /tmp
  {{- if and .Values.management.existingSecret .Values.management.passwordAsFile }}
  - name: floodwall-management
    mountPath: /etc/floodwall/management
    readOnly: true
  {{- end }}
  {{- range $name, $secret := include "floodwall.tlsSecrets" . | fromYaml }}
  - name: floodwall-tls-{{ $name }}
    mountPath: /etc/floodwall/tls/{{ $name }}
    readOnly: true
  {{- end }}
{{- if .Values.probes.readiness.enabled }}
readinessProbe:
  httpGet:
    path: /readyz
    port: floodwall-admin
  periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
{{- end }}
livenessProbe:
  httpGet:
    path: /healthz
    port: floodwall-admin
  initialDelaySeconds: {{ .Values.probes.liveness.initialDelaySeconds }}
  periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
{{- if gt (int .Values.drain.preStopSleepSeconds) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ int .Values.drain.preStopSleepSeconds }}"]
{{- end }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end -}}

{{/* The pod's volumes, as list items. */}}
{{- define "floodwall.volumes" -}}
{{- if .Values.policies.enabled }}
- name: floodwall-policies
  configMap:
    name: {{ include "floodwall.policiesConfigMap" . }}
{{- end }}
{{- if not .Values.spool.persistence.enabled }}
- name: floodwall-spool
  emptyDir:
    sizeLimit: {{ .Values.spool.emptyDir.sizeLimit }}
{{- else if .Values.spool.persistence.existingClaim }}
- name: floodwall-spool
  persistentVolumeClaim:
    claimName: {{ .Values.spool.persistence.existingClaim }}
{{- else if eq .Values.mode "standalone" }}
- name: floodwall-spool
  persistentVolumeClaim:
    claimName: {{ include "floodwall.fullname" . }}-spool
{{- end }}
- name: floodwall-telemetry
  emptyDir:
    sizeLimit: {{ .Values.telemetry.sizeLimit }}
- name: floodwall-tmp
  emptyDir:
    sizeLimit: 16Mi
{{- if and .Values.management.existingSecret .Values.management.passwordAsFile }}
- name: floodwall-management
  secret:
    secretName: {{ .Values.management.existingSecret }}
{{- end }}
{{- range $name, $secret := include "floodwall.tlsSecrets" . | fromYaml }}
- name: floodwall-tls-{{ $name }}
  secret:
    secretName: {{ $secret }}
{{- end }}
{{- end -}}

{{/* The TLS Secrets to mount, as a mapping: directory name under /etc/floodwall/tls -> Secret.
Whole Secrets are mounted, never single keys: a rotated certificate reaches the pod, and
floodwall re-reads it. */}}
{{- define "floodwall.tlsSecrets" -}}
{{- if .Values.tls.upstream.ca.existingSecret }}
upstream-ca: {{ .Values.tls.upstream.ca.existingSecret }}
{{- end }}
{{- if .Values.tls.upstream.clientCertificate.existingSecret }}
upstream-client: {{ .Values.tls.upstream.clientCertificate.existingSecret }}
{{- end }}
{{- if and .Values.tls.listener.enabled .Values.tls.listener.certificate.existingSecret }}
listener: {{ .Values.tls.listener.certificate.existingSecret }}
{{- end }}
{{- if and .Values.tls.listener.enabled .Values.tls.listener.clientCa.existingSecret }}
listener-client-ca: {{ .Values.tls.listener.clientCa.existingSecret }}
{{- end }}
{{- if .Values.tls.management.ca.existingSecret }}
management-ca: {{ .Values.tls.management.ca.existingSecret }}
{{- end }}
{{- end -}}

{{/* FLOODWALL_*TLS* variables naming the mounted files (env list items). */}}
{{- define "floodwall.tlsEnv" -}}
{{- $upstreamTls := or .Values.tls.upstream.ca.existingSecret .Values.tls.upstream.clientCertificate.existingSecret .Values.tls.upstream.serverName .Values.tls.upstream.saslExternal .Values.tls.upstream.relayExternal .Values.tls.upstream.insecure }}
{{- if and $upstreamTls (not (hasPrefix "amqps://" (lower .Values.upstream))) }}
{{- fail "tls.upstream is set but upstream is not amqps://HOST[:PORT]: floodwall would refuse to start" }}
{{- end }}
{{- if and .Values.tls.listener.enabled (not .Values.tls.listener.certificate.existingSecret) }}
{{- fail "tls.listener.enabled needs tls.listener.certificate.existingSecret (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if .Values.tls.upstream.ca.existingSecret }}
  - name: FLOODWALL_UPSTREAM_TLS_CA
    value: {{ printf "/etc/floodwall/tls/upstream-ca/%s" .Values.tls.upstream.ca.key | quote }}
{{- end }}
{{- if .Values.tls.upstream.clientCertificate.existingSecret }}
  - name: FLOODWALL_UPSTREAM_TLS_CERT
    value: /etc/floodwall/tls/upstream-client/tls.crt
  - name: FLOODWALL_UPSTREAM_TLS_KEY
    value: /etc/floodwall/tls/upstream-client/tls.key
{{- end }}
{{- if .Values.tls.upstream.serverName }}
  - name: FLOODWALL_UPSTREAM_TLS_SERVER_NAME
    value: {{ .Values.tls.upstream.serverName | quote }}
{{- end }}
{{- if .Values.tls.upstream.saslExternal }}
  - name: FLOODWALL_UPSTREAM_TLS_SASL_EXTERNAL
    value: "true"
{{- end }}
{{- if .Values.tls.upstream.relayExternal }}
  - name: FLOODWALL_UPSTREAM_TLS_RELAY_EXTERNAL
    value: "true"
{{- end }}
{{- if .Values.tls.upstream.insecure }}
  - name: FLOODWALL_UPSTREAM_TLS_INSECURE
    value: "true"
{{- end }}
{{- if .Values.tls.listener.enabled }}
  - name: FLOODWALL_LISTEN_TLS
    value: {{ printf "%s:%d" (include "floodwall.listenHost" .) (int .Values.tls.listener.port) | quote }}
  - name: FLOODWALL_LISTEN_TLS_CERT
    value: /etc/floodwall/tls/listener/tls.crt
  - name: FLOODWALL_LISTEN_TLS_KEY
    value: /etc/floodwall/tls/listener/tls.key
{{- if .Values.tls.listener.clientCa.existingSecret }}
  - name: FLOODWALL_LISTEN_TLS_CLIENT_CA
    value: {{ printf "/etc/floodwall/tls/listener-client-ca/%s" .Values.tls.listener.clientCa.key | quote }}
{{- end }}
{{- end }}
{{- if .Values.tls.management.ca.existingSecret }}
  - name: FLOODWALL_MANAGEMENT_TLS_CA
    value: {{ printf "/etc/floodwall/tls/management-ca/%s" .Values.tls.management.ca.key | quote }}
{{- end }}
{{- end -}}

{{/* Everything an application's pod needs; see the comment at the top. */}}
{{- define "floodwall.sidecar" -}}
{{- if .Values.sidecar.native }}
containers: []
initContainers:
  - {{ include "floodwall.container" . | nindent 4 | trim }}
{{- else }}
containers:
  - {{ include "floodwall.container" . | nindent 4 | trim }}
initContainers: []
{{- end }}
volumes:
  {{- include "floodwall.volumes" . | trim | nindent 2 }}
annotations:
  {{- include "floodwall.podAnnotations" . | trim | nindent 2 }}
terminationGracePeriodSeconds: {{ include "floodwall.terminationGracePeriodSeconds" . }}
{{- end -}}
