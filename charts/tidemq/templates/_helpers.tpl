{{/* Chart name (nameOverride or the chart's). */}}
{{- define "tidemq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: fullnameOverride, or <release>-<name> unless the release name already contains it. */}}
{{- define "tidemq.fullname" -}}
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

{{- define "tidemq.operatorName" -}}
{{- printf "%s-operator" (include "tidemq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "tidemq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "tidemq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tidemq
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "tidemq.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tidemq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tidemq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tidemq.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tidemq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's master key Secret (operator/tidemq_operator/clusterkey.py): created by the operator, mounted here. */}}
{{- define "tidemq.clusterKeySecret" -}}
{{- default (printf "%s-cluster-key" (include "tidemq.operatorName" .) | trunc 63 | trimSuffix "-") .Values.operator.clusterKey.secretName }}
{{- end }}

{{/* The operator's leader election Lease (operator/tidemq_operator/leader.py), in the release namespace. */}}
{{- define "tidemq.leaderLease" -}}
{{- default (include "tidemq.operatorName" .) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{/* Namespaces the operator watches when not cluster-wide. */}}
{{- define "tidemq.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- join "," .Values.operator.watchNamespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* The rules the operator needs in a namespace (or cluster-wide). Only what it uses:
     - tidemq.io resources: kopf lists and watches them and patches them (annotations, finalizers,
       status through the status subresource); blockOwnerDeletion on owner references of the
       Cluster's workloads needs update on clusters/finalizers;
     - the Cluster's workloads (operator/tidemq_operator/workloads.py, applied by handlers._apply_objects):
       StatefulSets are read, created and patched; Services, ConfigMaps and PodDisruptionBudgets are
       created and patched;
     - Secrets: each managed Cluster's key Secret (operator/tidemq_operator/clusterkey.py) is created once; the
       operator never reads, lists or patches a Secret;
     - replicated broker groups: pods listed, the brokers' ServiceAccount, Role and RoleBinding
       created and patched, and the Lease verbs those grant (see the rule's comment);
     - Events: kopf posts handler progress and the operator's warnings.
     The leader election's Lease and the CRDs have their own Roles (templates/rbac.yaml). */}}
{{- define "tidemq.operatorRules" -}}
# Exactly what the operator uses (tests/operator/test_operator_integration.py records its API
# requests and compares): kopf lists/watches the custom resources and patches them and their status;
# each pass reads its object back first (get: operator/tidemq_operator/serial.py).
- apiGroups: ["tidemq.io"]
  resources: ["clusters", "topics", "consumergroups"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["tidemq.io"]
  resources: ["clusters/status", "topics/status", "consumergroups/status"]
  verbs: ["patch"]
# Owned workloads carry blockOwnerDeletion: the API server then requires update on the owner's
# finalizers subresource (admission plugin OwnerReferencesPermissionEnforcement).
- apiGroups: ["tidemq.io"]
  resources: ["clusters/finalizers"]
  verbs: ["update"]
# Scale-in (spec.brokers.groups lowered, operator/tidemq_operator/scaleinops.py): the Cluster's
# broker StatefulSets are listed on every pass; a drained retiring group's StatefulSet, ConfigMap
# and Service are deleted, and with brokers.deleteClaim its PVCs (listed by the group's labels).
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "delete"]
# Budgets are listed on every pass and one no longer desired is deleted (a pod two budgets select
# cannot be evicted): operator/tidemq_operator/budgets.py; a retired broker group's goes with it.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "create", "patch", "delete"]
# Replicated broker groups (spec.brokers.replicas > 1, operator/tidemq_operator/replication.py):
# the operator lists a group's pods (readiness, revision, IP) and patches its StatefulSet's
# partition to roll it; it creates the brokers' ServiceAccount, and a Role + RoleBinding granting
# them the election's Leases. Kubernetes lets a Role grant only what its creator holds (RBAC
# escalation prevention; the alternative, the escalate/bind verbs, would let it grant anything),
# so the operator holds those Lease verbs too; it never calls them itself.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- if .Values.operator.clusterKey.enabled }}
# Each managed Cluster's key Secret: created once, never read back or patched (name-server write protection).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
