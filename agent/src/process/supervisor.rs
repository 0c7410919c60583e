//! The process's phase and what changes it: the halt and resume the operator asks for (through
//! [`crate::control::endpoint`]), and the drain. Pulses run only while the process runs.
//!
//! Phases: `starting` (the lifecycle runs) → `running` ⇄ `pausing` → `paused` ⇄ `resuming`, and
//! `draining` at the end. The status is read without waiting for a halt or resume in progress:
//! the phase lives in a plain mutex apart from the lock that puts the changes in order.
//!
//! A halt asked for while the process starts is kept: once the lifecycle is done the process
//! pauses at once (pulses never start). A `pause` that fails in one component runs `resume` on
//! every component whose `pause` succeeded, starts the pulses again and reports the failure
//! (phase `running`, `failure` naming the halt), so the operator calls the halt off; the same halt
//! is not tried again. A `resume` that fails leaves the process paused, reporting the failure; the
//! operator asks again.
//!
//! The outboxes' relays (events their committer did not publish) run as the pulses do: stopped
//! at `pause`, started again at `resume`. Events of writes the process commits while paused (calls
//! call a halt off) are still published by their committer.

use crate::calls::activity::Activity;
use crate::calls::router::Calls;
use crate::control::endpoint::{ActionError, Reply, Supervisor};
use crate::process::lifecycle::{self, Member};
use std::sync::Arc;
use std::time::Duration;
use toa_context::control::{Failure, Phase as Reported, Status};
use toa_context::RunCommand;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Starting,
    Running,
    Pausing { halt: String },
    Paused { halt: String },
    Resuming { halt: String },
    Draining,
}

pub struct Process {
    instance: String,
    activity: Arc<Activity>,
    /// What the status reports; written while `work` is held, read without it.
    view: std::sync::Mutex<View>,
    /// Puts halts, resumes, the start's end and the drain in order.
    work: tokio::sync::Mutex<Work>,
}

#[derive(Clone)]
struct View {
    phase: Phase,
    /// A halt asked for while starting.
    pending: Option<String>,
    failure: Option<Failure>,
}

#[derive(Default)]
struct Work {
    members: Vec<Member>,
    calls: Option<Arc<Calls>>,
    pulses: Vec<JoinHandle<()>>,
}

impl Process {
    /// A process that is starting: it answers status and takes a halt for later.
    pub fn new(instance: String, activity: Arc<Activity>) -> Arc<Self> {
        Arc::new(Self {
            instance,
            activity,
            view: std::sync::Mutex::new(View {
                phase: Phase::Starting,
                pending: None,
                failure: None,
            }),
            work: tokio::sync::Mutex::default(),
        })
    }

    /// The lifecycle is done: pauses at once for a halt asked for meanwhile, else runs (pulses
    /// start).
    pub async fn started(&self, members: Vec<Member>, calls: Arc<Calls>) {
        let mut work = self.work.lock().await;
        work.members = members;
        work.calls = Some(calls);
        let pending = self.view.lock().expect("view").pending.take();
        match pending {
            Some(halt) => {
                tracing::info!(%halt, "a halt was asked for while starting: pausing");
                let _ = self.pause(&mut work, halt).await;
            }
            None => {
                work.pulses = start_pulses(&work);
                self.set(|view| view.phase = Phase::Running);
            }
        }
    }

    /// Pauses for `halt`: stops pulses, runs `pause`. Idempotent by halt id.
    pub async fn halt(&self, halt: String) -> Result<Status, ActionError> {
        // A halt already under way answers at once, not after it.
        if self.view().phase == (Phase::Pausing { halt: halt.clone() }) {
            return Ok(self.status());
        }
        let mut work = self.work.lock().await;
        let view = self.view();
        if let Some(failure) = view
            .failure
            .filter(|f| f.halt == halt && f.command == "pause")
        {
            return Err(ActionError::PauseFailed {
                halt,
                message: failure.message,
            });
        }
        match view.phase {
            Phase::Draining => return Err(ActionError::Draining),
            Phase::Starting => self.set(|view| view.pending = Some(halt)),
            Phase::Paused { halt: current } if current == halt => {}
            Phase::Paused { .. } | Phase::Pausing { .. } | Phase::Resuming { .. } => {
                // Already paused for an earlier halt: this one counts calls from now.
                self.activity.reset();
                self.set(|view| view.phase = Phase::Paused { halt });
            }
            Phase::Running => self.pause(&mut work, halt).await?,
        }
        Ok(self.status())
    }

    /// Resumes from `halt`: runs `resume`, starts pulses. Idempotent.
    pub async fn resume(&self, halt: String) -> Result<Status, ActionError> {
        if self.view().phase == (Phase::Resuming { halt: halt.clone() }) {
            return Ok(self.status());
        }
        let mut work = self.work.lock().await;
        match self.view().phase {
            Phase::Running => {}
            Phase::Starting => self.set(|view| {
                if view.pending.as_deref() == Some(&halt) {
                    view.pending = None;
                }
            }),
            Phase::Draining => return Err(ActionError::Draining),
            Phase::Paused { halt: current } if current != halt => {
                return Err(ActionError::OtherHalt { current, halt })
            }
            Phase::Paused { .. } | Phase::Pausing { .. } | Phase::Resuming { .. } => {
                self.set(|view| view.phase = Phase::Resuming { halt: halt.clone() });
                let results = lifecycle::each(&work.members, RunCommand::Resume).await;
                if let Some(message) = failures(&results) {
                    tracing::error!(%halt, %message, "resume failed: still paused");
                    self.set(|view| {
                        view.phase = Phase::Paused { halt: halt.clone() };
                        view.failure = Some(Failure {
                            halt: halt.clone(),
                            command: "resume".into(),
                            message: message.clone(),
                        });
                    });
                    return Err(ActionError::Command(message));
                }
                work.pulses = start_pulses(&work);
                self.set(|view| {
                    view.phase = Phase::Running;
                    view.failure = None;
                });
                tracing::info!(%halt, "resumed");
            }
        }
        Ok(self.status())
    }

    /// Stops pulses and marks the drain (after a halt or resume under way); what follows
    /// (dispose) is the caller's.
    pub async fn drain(&self) {
        let mut work = self.work.lock().await;
        for pulse in work.pulses.drain(..) {
            pulse.abort();
        }
        self.set(|view| view.phase = Phase::Draining);
    }

    /// Stops pulses and runs `pause` on every member; on a failure, undoes it (see the module).
    async fn pause(&self, work: &mut Work, halt: String) -> Result<(), ActionError> {
        self.set(|view| view.phase = Phase::Pausing { halt: halt.clone() });
        for pulse in work.pulses.drain(..) {
            pulse.abort();
        }
        let results = lifecycle::each(&work.members, RunCommand::Pause).await;
        let Some(message) = failures(&results) else {
            self.activity.reset();
            self.set(|view| {
                view.phase = Phase::Paused { halt: halt.clone() };
                view.failure = None;
            });
            tracing::info!(%halt, "paused");
            return Ok(());
        };
        // Back to running: whoever paused resumes, and the pulses start again.
        let paused: Vec<Member> = results
            .iter()
            .filter(|(_, result)| result.is_ok())
            .map(|(index, _)| work.members[*index].clone())
            .collect();
        for (_, result) in lifecycle::each(&paused, RunCommand::Resume).await {
            if let Err(error) = result {
                tracing::error!(%error, "resume after a failed pause failed too");
            }
        }
        work.pulses = start_pulses(work);
        tracing::error!(%halt, %message, "pause failed: running again");
        self.set(|view| {
            view.phase = Phase::Running;
            view.failure = Some(Failure {
                halt: halt.clone(),
                command: "pause".into(),
                message: message.clone(),
            });
        });
        Err(ActionError::Command(message))
    }

    fn view(&self) -> View {
        self.view.lock().expect("view").clone()
    }

    fn set(&self, change: impl FnOnce(&mut View)) {
        change(&mut self.view.lock().expect("view"));
    }

    pub fn status(&self) -> Status {
        let view = self.view();
        let (phase, halt) = match view.phase {
            Phase::Starting => (Reported::Starting, view.pending),
            Phase::Running => (Reported::Running, None),
            Phase::Pausing { halt } => (Reported::Pausing, Some(halt)),
            Phase::Paused { halt } => (Reported::Paused, Some(halt)),
            Phase::Resuming { halt } => (Reported::Resuming, Some(halt)),
            Phase::Draining => (Reported::Draining, None),
        };
        Status {
            phase,
            halt,
            instance: self.instance.clone(),
            calls: self.activity.counts(),
            failure: view.failure,
            key: None,
        }
    }
}

/// The failures among `results`, as one message; `None` when all succeeded.
fn failures(results: &[(usize, Result<(), crate::component::ComponentError>)]) -> Option<String> {
    let messages: Vec<String> = results
        .iter()
        .filter_map(|(_, result)| result.as_ref().err().map(ToString::to_string))
        .collect();
    (!messages.is_empty()).then(|| messages.join("; "))
}

impl Supervisor for Process {
    fn halt(self: Arc<Self>, halt: String) -> Reply {
        Box::pin(async move { Process::halt(&self, halt).await })
    }

    fn resume(self: Arc<Self>, halt: String) -> Reply {
        Box::pin(async move { Process::resume(&self, halt).await })
    }

    fn status(&self) -> Status {
        Process::status(self)
    }
}

/// Each pulse calls its operation on this replica every interval, and each outbox's relay runs.
/// A relay is not a call: the pause cuts it short (a claim cut there is relayed after its
/// lease), so a halt has nothing of it to wait for.
fn start_pulses(work: &Work) -> Vec<JoinHandle<()>> {
    let Some(calls) = &work.calls else {
        return Vec::new();
    };
    let outboxes = work
        .members
        .iter()
        .filter_map(|m| m.objects.as_ref().and_then(|o| o.outbox()));
    let mut tasks: Vec<JoinHandle<()>> = outboxes
        .map(|outbox| tokio::spawn(outbox.clone().relay()))
        .collect();
    for member in &work.members {
        for (operation, interval) in &member.component.manifest.pulses {
            let (calls, component, operation) = (
                calls.clone(),
                member.component.name.clone(),
                operation.clone(),
            );
            let period = Duration::from_millis(*interval);
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let request = crate::calls::contract::Request {
                        input: serde_json::Value::Null,
                        instance: None,
                        timeout: None,
                        key: None,
                        query: None,
                        receipt: None,
                    };
                    if let Err(error) = calls
                        .call(&component, &operation, request, false, None)
                        .await
                    {
                        tracing::warn!(%component, %operation, %error, "pulse failed");
                    }
                }
            }));
        }
    }
    tasks
}
