//! The rules of the `restricted` Pod Security Standard (Kubernetes' pod-security.kubernetes.io
//! levels, policy version "latest" as of 1.33), as a check over a pod spec: the unit tests hold
//! every pod spec the operator builds to it in microseconds. Pod Security admission itself,
//! which runs the same rules in a namespace labelled `pod-security.kubernetes.io/enforce:
//! restricted`, admits those pods in the end-to-end suite.

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// Volume types the profile allows.
const VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Each rule the pod spec breaks, naming the field; empty when it meets the profile. (Ephemeral
/// containers, which the operator never adds, are not looked at.)
pub fn violations(pod: &PodSpec) -> Vec<String> {
    let mut found = Vec::new();
    let security = pod.security_context.clone().unwrap_or_default();
    for (field, set) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        if set == Some(true) {
            found.push(format!("spec.{field} is true"));
        }
    }
    for volume in pod.volumes.iter().flatten() {
        let value = serde_json::to_value(volume).unwrap_or_default();
        let kinds: Vec<&String> = value
            .as_object()
            .map(|fields| fields.keys().filter(|key| *key != "name").collect())
            .unwrap_or_default();
        for kind in kinds {
            if !VOLUMES.contains(&kind.as_str()) {
                found.push(format!(
                    "volume {}: type {kind} is not allowed",
                    volume.name
                ));
            }
        }
    }
    if security.run_as_user == Some(0) {
        found.push("spec.securityContext.runAsUser is 0".to_owned());
    }
    let pod_seccomp = security
        .seccomp_profile
        .as_ref()
        .map(|profile| profile.type_.clone());
    if pod_seccomp
        .as_deref()
        .is_some_and(|t| t != "RuntimeDefault" && t != "Localhost")
    {
        found.push(format!(
            "spec.securityContext.seccompProfile.type is {pod_seccomp:?}"
        ));
    }
    for sysctl in security.sysctls.iter().flatten() {
        found.push(format!("sysctl {} is not in the safe set", sysctl.name));
    }
    let containers = pod.init_containers.iter().flatten().chain(&pod.containers);
    for container in containers {
        found.extend(container_violations(
            container,
            security.run_as_non_root == Some(true),
            pod_seccomp.is_some(),
        ));
    }
    found
}

fn container_violations(
    container: &Container,
    pod_non_root: bool,
    pod_seccomp: bool,
) -> Vec<String> {
    let name = &container.name;
    let security = container.security_context.clone().unwrap_or_default();
    let mut found = Vec::new();
    if security.privileged == Some(true) {
        found.push(format!("container {name}: privileged"));
    }
    if security.allow_privilege_escalation != Some(false) {
        found.push(format!(
            "container {name}: allowPrivilegeEscalation is not false"
        ));
    }
    let capabilities = security.capabilities.clone().unwrap_or_default();
    if !capabilities
        .drop
        .iter()
        .flatten()
        .any(|capability| capability == "ALL")
    {
        found.push(format!("container {name}: capabilities do not drop ALL"));
    }
    for added in capabilities.add.iter().flatten() {
        if added != "NET_BIND_SERVICE" {
            found.push(format!("container {name}: adds capability {added}"));
        }
    }
    match security.run_as_non_root {
        Some(false) => found.push(format!("container {name}: runAsNonRoot is false")),
        None if !pod_non_root => found.push(format!("container {name}: runAsNonRoot is not set")),
        _ => {}
    }
    if security.run_as_user == Some(0) {
        found.push(format!("container {name}: runAsUser is 0"));
    }
    match security.seccomp_profile.as_ref().map(|p| p.type_.as_str()) {
        Some("RuntimeDefault" | "Localhost") => {}
        None if pod_seccomp => {}
        other => found.push(format!("container {name}: seccompProfile is {other:?}")),
    }
    if security
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        found.push(format!("container {name}: procMount is not Default"));
    }
    for port in container.ports.iter().flatten() {
        if port.host_port.is_some_and(|p| p != 0) {
            found.push(format!("container {name}: hostPort {:?}", port.host_port));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bare_pod_breaks_the_rules_each_named() {
        let pod: PodSpec = serde_json::from_value(json!({
            "hostNetwork": true,
            "volumes": [{ "name": "h", "hostPath": { "path": "/" } }],
            "containers": [{ "name": "c", "securityContext": { "privileged": true,
                "capabilities": { "add": ["SYS_ADMIN"] }, "runAsUser": 0 } }],
        }))
        .unwrap();
        let found = violations(&pod);
        for expected in [
            "spec.hostNetwork is true",
            "volume h: type hostPath is not allowed",
            "container c: privileged",
            "container c: allowPrivilegeEscalation is not false",
            "container c: capabilities do not drop ALL",
            "container c: adds capability SYS_ADMIN",
            "container c: runAsNonRoot is not set",
            "container c: runAsUser is 0",
            "container c: seccompProfile is None",
        ] {
            assert!(
                found.iter().any(|f| f == expected),
                "{expected} not in {found:?}"
            );
        }
    }

    #[test]
    fn a_pod_set_up_at_pod_and_container_level_passes() {
        let pod: PodSpec = serde_json::from_value(json!({
            "securityContext": { "runAsNonRoot": true, "seccompProfile": { "type": "RuntimeDefault" } },
            "volumes": [{ "name": "s", "secret": { "secretName": "x" } }],
            "containers": [{ "name": "c", "securityContext": { "allowPrivilegeEscalation": false,
                "capabilities": { "drop": ["ALL"] } } }],
        }))
        .unwrap();
        assert_eq!(violations(&pod), Vec::<String>::new());
    }
}
