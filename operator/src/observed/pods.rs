//! Pure: what the pods' own statuses say is wrong, for the `Degraded` condition. Read from what
//! the operator lists anyway (`status.phase`, `podIP`, `containerStatuses`,
//! `initContainerStatuses`), never from logs, so a message names the pod, the container and the
//! kubelet's reason and exit code.
//!
//! A pod being deleted is left out (it is on its way out). Otherwise, a pod is in trouble when:
//! - it `Failed` (evicted, for instance);
//! - a container waits for a reason other than being created (`CrashLoopBackOff`,
//!   `CreateContainerError`, `ErrImageNeverPull`, …), or ended while the pod runs;
//! - a container runs but is not ready after having restarted (a crash loop between two
//!   back-offs).
//!
//! A container that is merely not ready yet, in a pod that never restarted, is starting, not in
//! trouble: `preflight` may take its minute.

use crate::agent_client::Target;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;
use std::net::IpAddr;

/// The longest a kubelet's termination message is quoted.
const MESSAGE_CHARS: usize = 160;

/// A pod of the composition as the operator sees it from the pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub name: String,
    /// Where its agent's control endpoint listens; `None` until the pod has an IP.
    pub ip: Option<IpAddr>,
    /// Being deleted.
    pub terminating: bool,
    /// In phase `Running` (not Pending, Failed, evicted or Succeeded).
    pub running: bool,
    /// In phase `Failed` (evicted, for instance) or `Succeeded`: its containers ended, and it
    /// stays listed until the pod garbage collector removes it.
    pub finished: bool,
    /// Controlled by a ReplicaSet of the Composition's Deployment (`<composition>-<its
    /// pod-template-hash>`), not merely labelled like its pods.
    pub owned: bool,
    /// What is wrong with it, one sentence each; empty when nothing is.
    pub troubles: Vec<String>,
}

impl Seen {
    /// Where the operator may send a control request: a `Running` pod of the Deployment's
    /// ReplicaSets that is not being deleted and has an IP. A Failed (evicted) pod's IP may already be another pod's, and neither it
    /// nor a pod on its way out takes part in a halt.
    /// Whether it still holds the composition's place: a pod of the Deployment's ReplicaSets
    /// that is being deleted (its containers may still drain; once they ended, the kubelet marks
    /// it finished and removes it) or has not finished. An evicted pod, finished and not being
    /// deleted, stays listed until the pod garbage collector comes: it does not count. A halt is
    /// over once none is left.
    pub fn left(&self) -> bool {
        self.owned && (self.terminating || !self.finished)
    }

    pub fn control(&self) -> Option<Target<'_>> {
        let ip = self
            .ip
            .filter(|_| self.running && !self.terminating && self.owned)?;
        Some(Target {
            name: &self.name,
            ip,
        })
    }
}

/// Reads one pod.
pub fn seen(pod: &Pod) -> Seen {
    let status = pod.status.clone().unwrap_or_default();
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let mut troubles = Vec::new();
    if !terminating {
        if status.phase.as_deref() == Some("Failed") {
            troubles.push(format!(
                "pod Failed: {}: {}",
                status.reason.as_deref().unwrap_or("no reason"),
                quote(status.message.as_deref().unwrap_or("no message"))
            ));
        }
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            // A native sidecar is an init container that keeps running; a finished init
            // container is no trouble.
            .filter(|c| !finished_init(c))
            .chain(status.container_statuses.iter().flatten());
        troubles.extend(containers.filter_map(container_trouble));
    }
    Seen {
        name: pod.name_any(),
        ip: status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()),
        terminating,
        running: status.phase.as_deref() == Some("Running"),
        finished: matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")),
        owned: owned_by_deployment(pod),
        troubles,
    }
}

/// Whether the pod's controller is the ReplicaSet its Deployment made for its template: named
/// after the Composition (the Deployment's name) and the pod's `pod-template-hash`.
fn owned_by_deployment(pod: &Pod) -> bool {
    let labels = pod.labels();
    let (Some(composition), Some(hash)) = (
        labels.get(crate::names::LABEL_COMPOSITION),
        labels.get("pod-template-hash"),
    ) else {
        return false;
    };
    pod.owner_references().iter().any(|owner| {
        owner.controller == Some(true)
            && owner.kind == "ReplicaSet"
            && owner.name == format!("{composition}-{hash}")
    })
}

fn finished_init(container: &ContainerStatus) -> bool {
    container
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

/// What is wrong with one container, if anything.
fn container_trouble(container: &ContainerStatus) -> Option<String> {
    let name = &container.name;
    let state = container.state.clone().unwrap_or_default();
    let waiting_message = state.waiting.as_ref().and_then(|w| w.message.as_deref());
    let last = container
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| {
            format!(
                "; last ended {} (exit code {}){}",
                t.reason.as_deref().unwrap_or("without a reason"),
                t.exit_code,
                t.message
                    .as_deref()
                    // The kubelet often repeats it as the waiting reason's message.
                    .filter(|m| Some(*m) != waiting_message)
                    .map(|m| format!(": {}", quote(m)))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let restarts = match container.restart_count {
        0 => String::new(),
        1 => ", restarted once".to_owned(),
        n => format!(", restarted {n} times"),
    };
    if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or("Waiting");
        if matches!(reason, "ContainerCreating" | "PodInitializing") {
            return None;
        }
        let message = waiting
            .message
            .as_deref()
            .map(|m| format!(": {}", quote(m)))
            .unwrap_or_default();
        return Some(format!(
            "container {name} {reason}{message}{restarts}{last}"
        ));
    }
    if let Some(ended) = &state.terminated {
        return Some(format!(
            "container {name} ended {} (exit code {}){}{restarts}",
            ended.reason.as_deref().unwrap_or("without a reason"),
            ended.exit_code,
            ended
                .message
                .as_deref()
                .map(|m| format!(": {}", quote(m)))
                .unwrap_or_default()
        ));
    }
    if state.running.is_some() && !container.ready && container.restart_count > 0 {
        return Some(format!("container {name} not ready{restarts}{last}"));
    }
    None
}

/// One line, at most [`MESSAGE_CHARS`] characters: the end, where runtimes and tracebacks say
/// what went wrong (`…: exec: "node": executable file not found in $PATH: unknown`).
fn quote(message: &str) -> String {
    let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    let length = line.chars().count();
    if length <= MESSAGE_CHARS {
        line
    } else {
        let end: String = line.chars().skip(length - MESSAGE_CHARS).collect();
        format!("…{end}")
    }
}

#[cfg(test)]
mod tests;
