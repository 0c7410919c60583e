{{/* The chart's name. */}}
{{- define "toa-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name, suffixed with the chart's unless it holds it. */}}
{{- define "toa-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "toa-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toa-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "toa-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "toa-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "toa-operator.serviceAccountName" -}}
{{- default (include "toa-operator.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "toa-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "toa-operator.agentImage" -}}
{{- printf "%s:%s" .Values.agentImage.repository (default .Chart.AppVersion .Values.agentImage.tag) }}
{{- end }}

{{/* What the controller does in the namespaces it watches (see docs/composition.md): it watches
their Compositions and the objects it owns, applies those objects by server-side apply (a patch;
they are deleted by the garbage collector through their owner references, never by the
operator), lists and watches its compositions' pods (IPs for halts, statuses for Degraded), and
records events. Reading the server version needs no grant. */}}
{{- define "toa-operator.rules" -}}
# Watched (never read one by one); their annotations are patched (halts).
- apiGroups: ["toa.io"]
  resources: ["compositions"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["toa.io"]
  resources: ["compositions/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion need this where
# OwnerReferencesPermissionEnforcement is enabled.
- apiGroups: ["toa.io"]
  resources: ["compositions/finalizers"]
  verbs: ["update"]
# Owned, applied server-side; create is granted for an apply that creates the object. Each is
# read first (one under the derived name that the Composition does not control is never
# changed); a Deployment is read for its drain key too, the declarations ConfigMap for its parts.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The control token's Secret: written (its tokens are derived from the operator's key), never
# read, listed or watched (that would be reading every Secret there); a JSON Patch that tests
# its owner keeps a Secret of that name someone else made unchanged.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch"]
# Each composition's NetworkPolicy (networkPolicy.enabled), read and applied like the rest.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
# Each composition's PodDisruptionBudget (two replicas or more), read and applied like the rest.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
# A composition's pods: their IPs, for halts, and their statuses, for Degraded (watched, by the
# operator's label, so a failing pod is reported at once).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# kube-runtime's event recorder writes events.k8s.io/v1 Events.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- define "toa-operator.keySecret" -}}
{{- default (printf "%s-key" (include "toa-operator.fullname" .)) .Values.keySecret }}
{{- end }}

{{/* "true" where the API server offers admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy
(every supported release; an offline `helm template` says so only with `--api-versions
admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy`), else empty. */}}
{{- define "toa-operator.admissionPolicyOffered" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}true{{ end }}
{{- end }}
