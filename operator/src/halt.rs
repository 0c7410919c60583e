//! Pure: the halt of DESIGN decision 8 as a state machine. [`decide`] takes what the operator
//! knows (the spec's `halted`, the halt recorded on the Composition, each pod's report from its
//! agent, the time) and returns the phase and the one next step; the controller does that step and
//! asks again. No I/O, so every transition is a plain test.
//!
//! The halt's state lives in one annotation on the Composition, [`ANNOTATION`]
//! (`toa.io/halt: "<id>@<start>"`, then `"<id>@<start> stopped"` or
//! `"<id>@<start> called-off@<when> busy: <pod>: <why>; …"`), so an operator that restarts, or another replica that
//! becomes the leader, continues the same halt. The agents' reports are the truth about each pod.
//!
//! The course of a halt while `spec.halted` is `true`:
//! 1. Requested: no record yet → record a new halt (id and start).
//! 2. Pausing: a running pod is sent `halt`; so is a pod that is starting (once: it reports the
//!    halt back and pauses for it as soon as its lifecycle is done; until then it is waited for,
//!    within `grace`). Pods in `pausing`/`resuming` are waited for. New pods count as quiet from
//!    their pause on. A pod whose `pause` failed for this halt calls it off at once, naming it
//!    (its agent has resumed whatever had paused).
//! 3. QuietWatch: every pod is paused for this halt; the composition has been quiet since the
//!    later of the halt's start and the last call any pod reports (made or received, its start
//!    or end); a pod with a call in flight is busy now.
//! 4. Quiet for `quietWindow`, within `grace` of the start → record `stopped`; the Deployment goes
//!    to 0 replicas (ScalingDown, then Halted once no pod is left).
//! 5. Not quiet within `grace` → record `called-off`, and every pod paused for the halt is sent
//!    `resume` (CalledOff). After a further `grace` a new halt starts, since `spec.halted` still
//!    asks for one.
//!
//! `spec.halted: false` with a record → Resuming: pods paused for any halt are resumed, then the
//! record is removed (a stopped composition simply starts again, running `preflight` anew).

use crate::validate::Halt;
use k8s_openapi::jiff::Timestamp;
use std::fmt;
use std::time::Duration;

/// The annotation on the Composition that records the current halt.
pub const ANNOTATION: &str = "toa.io/halt";

/// What a pod's agent reports on `GET /control/status`: the contract both sides share.
pub use toa_context::control::{
    Calls, Failure as AgentFailure, Phase as AgentPhase, Status as AgentStatus,
};

/// One pod as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub report: Report,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Status(AgentStatus),
    /// The control endpoint did not answer in time, or answered with an error: why.
    Unreachable(String),
}

/// The halt recorded on the Composition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub started: Timestamp,
    pub outcome: Outcome,
    /// When called off: each busy pod with why, as the `Halted` message names them. Kept in the
    /// record so every later reconcile writes the same message, whatever status it last read.
    pub busy: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Pausing or watching for quiet.
    InProgress,
    /// Quiet long enough: the composition is scaled to zero.
    Stopped,
    /// Not quiet within grace, at this time: pods resume.
    CalledOff(Timestamp),
}

impl Record {
    /// A new halt starting `now`; its id is derived from the time, unique per composition.
    pub fn start(now: Timestamp) -> Self {
        Self {
            id: format!("h{}", now.as_millisecond()),
            started: now,
            outcome: Outcome::InProgress,
            busy: Vec::new(),
        }
    }

    pub fn with(&self, outcome: Outcome) -> Self {
        Self {
            outcome,
            busy: Vec::new(),
            ..self.clone()
        }
    }

    /// Called off at `at`, with the busy pods.
    pub fn called_off(&self, at: Timestamp, busy: Vec<String>) -> Self {
        Self {
            outcome: Outcome::CalledOff(at),
            busy,
            ..self.clone()
        }
    }

    /// Reads the annotation's value.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = || {
            format!(
                "`{ANNOTATION}`: expected \"<id>@<RFC 3339 time>\", optionally followed by \" stopped\" or \" called-off@<RFC 3339 time>\", got {text:?}"
            )
        };
        let (text, busy) = match text.split_once(BUSY) {
            Some((text, busy)) => (text, busy.split("; ").map(str::to_owned).collect()),
            None => (text, Vec::new()),
        };
        let (head, tail) = match text.split_once(' ') {
            Some((head, tail)) => (head, Some(tail)),
            None => (text, None),
        };
        let (id, started) = head.split_once('@').ok_or_else(expected)?;
        let started: Timestamp = started.parse().map_err(|_| expected())?;
        if id.is_empty() {
            return Err(expected());
        }
        let outcome = match tail {
            None => Outcome::InProgress,
            Some("stopped") => Outcome::Stopped,
            Some(tail) => match tail.strip_prefix("called-off@") {
                Some(at) => Outcome::CalledOff(at.parse().map_err(|_| expected())?),
                None => return Err(expected()),
            },
        };
        if !busy.is_empty() && !matches!(outcome, Outcome::CalledOff(_)) {
            return Err(expected());
        }
        Ok(Self {
            id: id.to_owned(),
            started,
            outcome,
            busy,
        })
    }
}

/// Where the busy pods start in the annotation's value.
const BUSY: &str = " busy: ";

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.started)?;
        match self.outcome {
            Outcome::InProgress => Ok(()),
            Outcome::Stopped => f.write_str(" stopped"),
            Outcome::CalledOff(at) => write!(f, " called-off@{at}"),
        }?;
        if self.busy.is_empty() {
            return Ok(());
        }
        write!(f, "{BUSY}{}", self.busy.join("; "))
    }
}

/// Where a halt stands; the `Halted` condition's reason names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No halt asked for, none recorded.
    Running,
    Requested,
    Pausing,
    QuietWatch,
    ScalingDown,
    Halted,
    CalledOff,
    Resuming,
}

impl Phase {
    /// The condition reason for the phase.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Requested => "HaltRequested",
            Self::Pausing => "Pausing",
            Self::QuietWatch => "QuietWatch",
            Self::ScalingDown => "ScalingDown",
            Self::Halted => "Halted",
            Self::CalledOff => "HaltCalledOff",
            Self::Resuming => "Resuming",
        }
    }
}

/// The one next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write this record into the annotation.
    Record(Record),
    /// Remove the annotation.
    Clear,
    /// Send `halt` with this id to these pods.
    Halt {
        id: String,
        pods: Vec<String>,
    },
    /// Send `resume` to each pod with the halt it is paused for.
    Resume(Vec<(String, String)>),
    /// Nothing to do before this time (unless something changes).
    WaitUntil(Timestamp),
    Nothing,
}

/// What [`decide`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub phase: Phase,
    pub step: Step,
    /// Pods whose agent did not answer, with why: for the `Degraded` condition.
    pub unreachable: Vec<(String, String)>,
    /// When a halt is called off: each pod that kept the composition from being quiet, with
    /// why (`"shop-1: 12 calls since the pause"`), for the `Halted` condition's message. Empty
    /// otherwise.
    pub busy: Vec<String>,
}

/// What the operator knows about a composition's halt.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// `spec.halted`.
    pub halted: bool,
    pub timing: Halt,
    pub record: Option<&'a Record>,
    /// The reports of the pods that take part in a halt (running, not being deleted).
    pub pods: &'a [Pod],
    /// How many of the composition's pods may still run processes ([`crate::observed::pods::Seen::left`]),
    /// those being deleted included: a halt is over only when none is (a terminating pod still
    /// runs its drain and `dispose`); an evicted pod, which stays listed, does not count.
    pub left: usize,
    pub now: Timestamp,
}

/// The phase and the next step; see the module's documentation for the course of a halt.
pub fn decide(observation: &Observation<'_>) -> Decision {
    let Observation {
        halted,
        timing,
        record,
        pods,
        left,
        now,
    } = *observation;
    let unreachable: Vec<(String, String)> = pods
        .iter()
        .filter_map(|pod| match &pod.report {
            Report::Unreachable(why) => Some((pod.name.clone(), why.clone())),
            Report::Status(_) => None,
        })
        .collect();
    let decision = |phase, step| Decision {
        phase,
        step,
        unreachable: unreachable.clone(),
        busy: Vec::new(),
    };
    let Some(record) = record else {
        if halted {
            return decision(Phase::Requested, Step::Record(Record::start(now)));
        }
        return decision(Phase::Running, resume_or(pods, Step::Nothing));
    };
    if !halted {
        return decision(Phase::Resuming, resume_or(pods, Step::Clear));
    }
    match record.outcome {
        Outcome::Stopped => {
            // Pods still listed are on their way out; their agents drain on SIGTERM.
            let phase = if left == 0 {
                Phase::Halted
            } else {
                Phase::ScalingDown
            };
            decision(phase, Step::Nothing)
        }
        Outcome::CalledOff(at) => called_off(record, at, timing, pods, now, decision),
        Outcome::InProgress => in_progress(record, timing, pods, now, decision),
    }
}

/// A called-off halt: its pods resumed, then, a grace later, tried again.
fn called_off(
    record: &Record,
    at: Timestamp,
    timing: Halt,
    pods: &[Pod],
    now: Timestamp,
    decision: impl Fn(Phase, Step) -> Decision,
) -> Decision {
    // Every reconcile of a called-off halt names the same busy pods (from the record).
    let called_off = |step| Decision {
        busy: record.busy.clone(),
        ..decision(Phase::CalledOff, step)
    };
    let stale = stale(pods, None);
    if !stale.is_empty() {
        return called_off(Step::Resume(stale));
    }
    let retry = add(at, timing.grace);
    if now >= retry {
        decision(Phase::Requested, Step::Record(Record::start(now)))
    } else {
        called_off(Step::WaitUntil(retry))
    }
}

/// Pods paused for a halt other than `active`, with that halt: they are resumed first, so no
/// process stays paused for a halt nobody pursues any more.
fn stale(pods: &[Pod], active: Option<&str>) -> Vec<(String, String)> {
    statuses(pods)
        .filter(|(_, status)| status.phase == AgentPhase::Paused)
        .filter_map(|(name, status)| {
            let halt = status.halt.clone().unwrap_or_default();
            (Some(halt.as_str()) != active).then(|| (name.to_owned(), halt))
        })
        .collect()
}

/// Resuming the pods paused for any halt when there are some, else `otherwise`.
fn resume_or(pods: &[Pod], otherwise: Step) -> Step {
    let stale = stale(pods, None);
    if stale.is_empty() {
        otherwise
    } else {
        Step::Resume(stale)
    }
}

/// A halt under way: survey the pods' reports, then act on what they say.
fn in_progress(
    record: &Record,
    timing: Halt,
    pods: &[Pod],
    now: Timestamp,
    decision: impl Fn(Phase, Step) -> Decision,
) -> Decision {
    let stale = stale(pods, Some(&record.id));
    if !stale.is_empty() {
        return decision(Phase::Pausing, Step::Resume(stale));
    }
    let survey = Survey::of(record, timing, pods, now);
    if survey.all_paused && survey.quiet_until <= now && survey.quiet_until <= survey.deadline {
        return decision(
            Phase::ScalingDown,
            Step::Record(record.with(Outcome::Stopped)),
        );
    }
    if !survey.failed.is_empty() {
        return Decision {
            busy: survey.failed.clone(),
            ..decision(
                Phase::CalledOff,
                Step::Record(record.called_off(now, survey.failed)),
            )
        };
    }
    if now >= survey.deadline {
        let busy = busy(pods, |status| paused_for(status, &record.id));
        return Decision {
            busy: busy.clone(),
            ..decision(Phase::CalledOff, Step::Record(record.called_off(now, busy)))
        };
    }
    if !survey.to_halt.is_empty() {
        let id = record.id.clone();
        return decision(
            Phase::Pausing,
            Step::Halt {
                id,
                pods: survey.to_halt,
            },
        );
    }
    if survey.all_paused {
        let until = survey.quiet_until.min(survey.deadline);
        decision(Phase::QuietWatch, Step::WaitUntil(until))
    } else {
        // Some pod is unreachable or in a phase of its own: ask again soon, and no later than
        // the deadline.
        decision(Phase::Pausing, Step::WaitUntil(survey.deadline))
    }
}

/// What the pods' reports say of a halt under way.
struct Survey {
    /// Pods that could not pause for this halt, with why: they are not asked again, the halt is
    /// called off.
    failed: Vec<String>,
    /// Pods to send the halt: running ones, and a starting one once (it pauses when it is up).
    to_halt: Vec<String>,
    /// Every pod paused for this halt (or draining).
    all_paused: bool,
    /// When the halt is called off unless quiet by then.
    deadline: Timestamp,
    /// When the paused pods have been quiet for the window.
    quiet_until: Timestamp,
}

impl Survey {
    fn of(record: &Record, timing: Halt, pods: &[Pod], now: Timestamp) -> Self {
        let failed = statuses(pods)
            .filter_map(|(name, status)| {
                let failure = status.failure.as_ref()?;
                (failure.halt == record.id && failure.command == "pause").then(|| {
                    // `; ` separates the pods in the record.
                    let message = failure.message.replace(';', ",");
                    format!("{name}: pause failed: {}", shorten(&message, FAILURE_CHARS))
                })
            })
            .collect();
        let to_halt = statuses(pods)
            .filter(|(_, status)| match status.phase {
                AgentPhase::Running => true,
                AgentPhase::Starting => status.halt.as_deref() != Some(&record.id),
                _ => false,
            })
            .map(|(name, _)| name.to_owned())
            .collect();
        let all_paused = pods.iter().all(|pod| match &pod.report {
            Report::Status(status) => {
                paused_for(status, &record.id) || status.phase == AgentPhase::Draining
            }
            Report::Unreachable(_) => false,
        });
        Self {
            failed,
            to_halt,
            all_paused,
            deadline: add(record.started, timing.grace),
            quiet_until: add(quiet_since(record, pods, now), timing.quiet_window),
        }
    }
}

/// Paused for the halt `id`.
fn paused_for(status: &AgentStatus, id: &str) -> bool {
    status.phase == AgentPhase::Paused && status.halt.as_deref() == Some(id)
}

/// Quiet since the later of the start and the last call any paused pod reports; a pod that
/// counts calls but gives no time is taken as busy now.
fn quiet_since(record: &Record, pods: &[Pod], now: Timestamp) -> Timestamp {
    statuses(pods)
        .filter(|(_, status)| paused_for(status, &record.id))
        .map(|(_, status)| match status.calls {
            // A call still running: busy now, whatever the window.
            Calls { in_flight: 1.., .. } => now,
            Calls {
                since_pause: 0,
                last_at_ms: None,
                ..
            } => record.started,
            Calls {
                last_at_ms: Some(ms),
                ..
            } => i64::try_from(ms)
                .ok()
                .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                .unwrap_or(now),
            Calls {
                last_at_ms: None, ..
            } => now,
        })
        .fold(record.started, Ord::max)
}

/// The pods that kept a halt from being quiet, each with why: calls since its pause, not
/// paused for the halt, or not answering.
fn busy(pods: &[Pod], paused_here: impl Fn(&AgentStatus) -> bool) -> Vec<String> {
    pods.iter()
        .filter_map(|pod| {
            let why = match &pod.report {
                Report::Unreachable(_) => "its agent does not answer".to_owned(),
                Report::Status(status) if status.phase == AgentPhase::Draining => return None,
                Report::Status(status) if !paused_here(status) => {
                    format!("not paused for the halt ({:?})", status.phase).to_lowercase()
                }
                Report::Status(status) if status.calls.in_flight > 0 => {
                    format!("{} calls in flight", status.calls.in_flight)
                }
                Report::Status(status) if status.calls.since_pause > 0 => {
                    format!("{} calls since the pause", status.calls.since_pause)
                }
                Report::Status(_) => return None,
            };
            Some(format!("{}: {why}", pod.name))
        })
        .collect()
}

/// The longest agent's message a halt record keeps per pod.
const FAILURE_CHARS: usize = 200;

/// `text` cut to `chars` characters, with an ellipsis when cut.
fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The replicas the Deployment should have: none once a halt has stopped the composition.
pub fn replicas(spec_replicas: i32, halted: bool, record: Option<&Record>) -> i32 {
    match record {
        Some(Record {
            outcome: Outcome::Stopped,
            ..
        }) if halted => 0,
        _ => spec_replicas,
    }
}

fn statuses(pods: &[Pod]) -> impl Iterator<Item = (&str, &AgentStatus)> {
    pods.iter().filter_map(|pod| match &pod.report {
        Report::Status(status) => Some((pod.name.as_str(), status)),
        Report::Unreachable(_) => None,
    })
}

/// `at + duration`, at the end of time rather than overflowing.
pub fn add(at: Timestamp, duration: Duration) -> Timestamp {
    let ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    Timestamp::from_millisecond(at.as_millisecond().saturating_add(ms)).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests;
