//! The controller: watches Compositions and what they own, and reconciles each one. Wiring only:
//! what to apply comes from [`crate::desired`] (the shared declarations ConfigMap's rules from
//! [`crate::declarations`]), the halt's next step from [`crate::halt`], the conditions from
//! [`crate::status`]; the requests are in [`crate::kube_io`] and [`crate::agent_client`].
//!
//! A reconcile, in order:
//! 1. if this replica does not hold the lease, nothing (asked again later);
//! 2. validate the spec; refused → `Ready=False`, `InvalidSpec`, and nothing else is touched;
//!    a generation not yet settled has its Deployment tried (a dry run) before anything is
//!    written, pods the API server refuses being `InvalidSpec` too;
//! 3. apply the ConfigMap of manifests and this Composition's part of the namespace's shared
//!    declarations (kept by [`crate::declarations`]), the control Secret (tokens derived from the
//!    operator's key, [`crate::key_ring`]; never read back) and the NetworkPolicy;
//! 4. list the pods (their statuses make `Degraded`) and ask each agent for its status (2 s at
//!    most each, all at once);
//! 5. do the halt's one next step (record, halt pods, resume pods);
//! 6. apply the Deployment (0 replicas once a halt stopped the composition), with the drain key
//!    the existing one holds (a new one at first);
//! 7. write the status when it changed.

use crate::agent_client::{self, AgentControl, Keys};
use crate::crd::{conditions, reasons, Composition, Stored, Undecodable};
use crate::declarations;
use crate::desired::{self, Owner, Settings};
use crate::events::Events;
use crate::halt::{self, Decision, Observation, Record, Report, Step};
use crate::key_ring::KeyRing;
use crate::kube_io;
use crate::metrics::Metrics;
use crate::names;
use crate::observed::ownership;
use crate::observed::pods::Seen;
use crate::observed::rollout::{self, Rollout};
use crate::status::{self, Observed};
use crate::validate::budget::Budget;
use crate::validate::Valid;
use crate::{CompositionStatus, Error};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{predicates, reflector, watcher, Controller, Predicate, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How often a composition is looked at when nothing happens (drift, agents' reports).
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often a composition is looked at while a halt runs or an agent does not answer: calls
/// during a halt are only seen by asking.
pub const HALT_POLL: Duration = Duration::from_secs(5);
/// How soon a composition is looked at again after its pods were told to halt or resume, and
/// while it scales down for a halt: the next step waits on the agents and the kubelet, which take
/// about that long, not on a window (the benchmark: a 2-pod halt took 17.6 s at `HALT_POLL`).
pub const HALT_STEP: Duration = Duration::from_secs(1);
/// How long a replica that does not hold the lease waits before it looks again.
pub const NOT_LEADER: Duration = Duration::from_secs(15);
/// The first and the longest delay after a failed reconcile; doubled on each failure in a row.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The label selector of the objects whose changes reconcile their Composition: what the
/// operator applies for one Composition, labelled with it (see [`names::labels`]). The
/// namespace's shared `toa-declarations` ConfigMap has no composition label and is left out:
/// every Composition of the namespace owns it, so each change to it reconciled them all, and N
/// Compositions applied at once made about N² reconciles (found by the benchmark on a real API
/// server: 100 Compositions took 68 s to get their Deployments).
pub const OWNED: &str = "app.kubernetes.io/managed-by=toa-operator,toa.io/composition";

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub agents: Arc<dyn AgentControl>,
    pub metrics: Metrics,
    /// `true` while this replica holds the lease.
    pub leader: watch::Receiver<bool>,
    /// The operator's key, once read.
    pub keys: watch::Receiver<Option<KeyRing>>,
    /// The namespaces watched (a namespaced install); empty: every namespace.
    pub watch_namespaces: Vec<String>,
    /// Kubernetes events on the Compositions (none published in tests).
    pub events: Events,
    /// The clock, injected so tests fix the time.
    pub now: fn() -> Timestamp,
    /// Failures in a row per Composition, for the backoff.
    failures: Mutex<HashMap<ObjectRef<Stored>, u32>>,
    /// One writer at a time per namespace for the shared declarations ConfigMap.
    declarations: declarations::Writers,
    /// The spec checks' pool and time budget.
    budget: Budget,
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        agents: Arc<dyn AgentControl>,
        metrics: Metrics,
        leader: watch::Receiver<bool>,
        keys: watch::Receiver<Option<KeyRing>>,
    ) -> Self {
        Self {
            client,
            settings,
            agents,
            metrics,
            leader,
            keys,
            watch_namespaces: Vec::new(),
            events: Events::default(),
            now: Timestamp::now,
            failures: Mutex::default(),
            declarations: declarations::Writers::default(),
            budget: Budget::default(),
        }
    }
}

/// Runs the controller until `shutdown` completes (reconciles under way finish first).
pub async fn run(
    context: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.shared();
    if context.watch_namespaces.is_empty() {
        run_in(context, None, shutdown).await;
        return;
    }
    // One controller per namespace: a watch is of one namespace or of all of them, and a
    // namespaced install may read only its own.
    let controllers = context
        .watch_namespaces
        .clone()
        .into_iter()
        .map(|namespace| run_in(context.clone(), Some(namespace), shutdown.clone()));
    futures::future::join_all(controllers).await;
}

/// The API of `K` in `namespace`, or in all of them.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// The controller of `namespace`'s Compositions (every namespace's with `None`).
async fn run_in(
    context: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = context.client.clone();
    let namespace = namespace.as_deref();
    // Each decoded on its own ([`Stored`]): one that cannot be fails neither list nor watch.
    let compositions = scoped::<Stored>(&client, namespace);
    // Reconcile everything when this replica becomes the leader: it skipped them until now.
    let mut leader = context.leader.clone();
    let became_leader = async_stream_leader(&mut leader);
    // Owned objects are watched by the operator's label only: watching every Secret and
    // ConfigMap of the cluster would cost memory and need wider RBAC than the operator uses.
    let owned = || watcher::Config::default().labels(OWNED);
    let (store, writer) = reflector::store();
    context.metrics.watch(store.clone());
    Controller::for_stream(changes(compositions, writer), store)
        .owns(scoped::<Deployment>(&client, namespace), owned())
        .owns(scoped::<ConfigMap>(&client, namespace), owned())
        // Secrets are not watched: a watch needs `list` on every Secret in the cluster, which
        // is reading them all. A deleted control Secret is written again by the next reconcile.
        // A pod in trouble (crash loop, cannot start, evicted) reconciles its Composition at
        // once, so `Degraded` says so within seconds; other pod changes are seen by the next
        // reconcile (a rollout or a Degraded composition is looked at every 5 s anyway), which
        // keeps a rollout of many pods from reconciling on each of their status changes.
        .watches(scoped::<Pod>(&client, namespace), owned(), |pod: Pod| {
            if crate::observed::pods::seen(&pod).troubles.is_empty() {
                return None;
            }
            let composition = pod.labels().get(names::LABEL_COMPOSITION)?.clone();
            Some(ObjectRef::new(&composition).within(&pod.namespace()?))
        })
        .reconcile_all_on(futures::stream::select(
            became_leader,
            key_changes(context.keys.clone()),
        ))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            // Successes are logged by `reconcile`, which knows whether it did anything.
            if let Err(error) = result {
                tracing::warn!(%error, "reconcile failed");
            }
        })
        .await;
}

/// The Compositions to reconcile, cached in `writer`'s store. A Composition is reconciled when its
/// spec (generation) or annotations (the halt record) change, not when only its status does: the
/// status is this operator's own writing, and every status write reconciled the Composition once
/// more (about half of all reconciles while 100 Compositions rolled out, in the benchmark). Owned
/// objects' changes, requeues and the leader's start still reconcile.
fn changes(
    compositions: Api<Stored>,
    writer: reflector::store::Writer<Stored>,
) -> impl futures::Stream<Item = Result<Stored, watcher::Error>> + Send + 'static {
    watcher(compositions, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            (predicates::generation as fn(&Stored) -> Option<u64>)
                .combine(predicates::annotations as fn(&Stored) -> Option<u64>),
            Default::default(),
        )
}

/// A stream that yields once each time `leader` turns `true`.
fn async_stream_leader(
    leader: &mut watch::Receiver<bool>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    let leader = leader.clone();
    futures::stream::unfold((leader, false), |(mut leader, mut was)| async move {
        loop {
            let now = *leader.borrow_and_update();
            if now && !was {
                return Some(((), (leader, true)));
            }
            was = now;
            leader.changed().await.ok()?;
        }
    })
}

/// A stream that yields each time the operator's key is read anew: at the first read (the
/// reconciles that found no key run again at once) and at each rotation (every Composition's
/// Secret gets the new tokens at once, not at its next resync).
fn key_changes(
    mut keys: watch::Receiver<Option<KeyRing>>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    keys.mark_unchanged();
    futures::stream::unfold(keys, |mut keys| async move {
        loop {
            keys.changed().await.ok()?;
            let had = keys.borrow_and_update().is_some();
            if had {
                return Some(((), keys));
            }
        }
    })
}

/// Backs off per Composition: 5 s, 10 s, 20 s … up to 5 min, reset by a success.
pub fn error_policy(composition: Arc<Stored>, error: &Error, context: Arc<Context>) -> Action {
    context.metrics.error(error.metric_label());
    let key = ObjectRef::from_obj(composition.as_ref());
    let mut failures = context.failures.lock().unwrap_or_else(|e| e.into_inner());
    let count = failures.entry(key).or_insert(0);
    *count = count.saturating_add(1);
    let delay = BACKOFF_FIRST
        .saturating_mul(2u32.saturating_pow(*count - 1))
        .min(BACKOFF_MAX);
    tracing::warn!(
        composition = %composition.name_any(),
        namespace = composition.namespace().unwrap_or_default(),
        %error,
        retry_in_s = delay.as_secs(),
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Brings one Composition's objects, halt and status in line with its spec; one whose spec
/// cannot be decoded only has its status say so.
pub async fn reconcile(stored: Arc<Stored>, context: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(stored.as_ref());
    if !*context.leader.borrow() {
        tracing::debug!(composition = %key, "not the leader: skipped");
        return Ok(Action::requeue(NOT_LEADER));
    }
    let _measure = context.metrics.reconcile();
    let action = match stored.decode() {
        Ok(composition) => reconcile_inner(&composition, &context).await?,
        Err(undecodable) => refuse_undecodable(&stored, &context, &undecodable).await?,
    };
    tracing::debug!(composition = %key, "reconciled");
    context
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key);
    Ok(action)
}

/// A Composition whose spec cannot be decoded: `InvalidSpec` saying why, in its status (which
/// the patch's answer, a [`Stored`], can carry), and nothing else touched.
async fn refuse_undecodable(
    stored: &Stored,
    context: &Context,
    undecodable: &Undecodable,
) -> Result<Action, Error> {
    let name = stored.name_any();
    let namespace = stored
        .namespace()
        .ok_or_else(|| desired::NotStored(name.clone()))?;
    tracing::warn!(composition = %name, %namespace, error = %undecodable, "spec refused");
    let compositions = Api::<Stored>::namespaced(context.client.clone(), &namespace);
    let message = undecodable.to_string();
    let refusal = (reasons::INVALID_SPEC, message.as_str());
    let now = (context.now)();
    let why = (reasons::INVALID_SPEC, "Reconcile");
    let on = stored.object_ref(&());
    context.events.warning(&on, why, message.clone(), now).await;
    refuse(stored, &compositions, refusal, now).await
}

/// A spec the checks refused: `InvalidSpec` in its status and a Warning event, nothing else
/// touched.
async fn refuse_invalid(
    context: &Context,
    composition: &Composition,
    compositions: &Api<Stored>,
    invalid: &crate::InvalidSpec,
) -> Result<Action, Error> {
    let now = (context.now)();
    let why = (reasons::INVALID_SPEC, "Reconcile");
    let on = composition.object_ref(&());
    context
        .events
        .warning(&on, why, invalid.0.clone(), now)
        .await;
    let refusal = (reasons::INVALID_SPEC, invalid.0.as_str());
    refuse(&Stored::from(composition), compositions, refusal, now).await
}

/// The reconcile proper, on the leader: steps 2 to 7 of the module's list.
async fn reconcile_inner(composition: &Composition, context: &Context) -> Result<Action, Error> {
    let name = composition.name_any();
    let namespace = composition
        .namespace()
        .ok_or_else(|| desired::NotStored(name.clone()))?;
    let client = &context.client;
    let compositions = Api::<Stored>::namespaced(client.clone(), &namespace);
    let now = (context.now)();
    let valid = match context.budget.check(&composition.spec).await? {
        Ok(valid) => valid,
        Err(invalid) => return refuse_invalid(context, composition, &compositions, &invalid).await,
    };
    let owner = Owner::of(composition)?;
    if context.keys.borrow().is_none() {
        // Without the key nothing is written: a half-configured composition helps no one.
        return Err(Error::NoKey);
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let existing = deployments.get_opt(&name).await?;
    let configured = configure(context, (composition, &valid), &owner, existing.as_ref()).await;
    let keys = report_conflict(configured, context, composition, &compositions, now).await;
    let (keys, drain) = match refused_or(keys, context, composition, &compositions).await? {
        Ok(configured) => configured,
        Err(refused) => return Ok(refused),
    };
    let pods = kube_io::pods(&Api::<Pod>::namespaced(client.clone(), &namespace), &name).await?;
    let halt = Halting {
        context,
        composition,
        compositions: &compositions,
        pods: &pods,
        keys: &keys,
    };
    let (decision, record) = halt.run(&valid, now).await?;
    let replicas = halt::replicas(valid.replicas, composition.spec.halted, record.as_ref());
    let deployment = deployment(context, composition, &owner, &valid, &drain, replicas);
    let applied = apply_deployment(&deployments, &deployment).await;
    let applied = match refused_or(applied, context, composition, &compositions).await? {
        Ok(applied) => applied,
        Err(refused) => return Ok(refused),
    };
    let refused = rollout::replica_failure(&applied);
    let observed = Observed {
        generation: composition.metadata.generation,
        invalid: None,
        rollout: Some(Rollout::of(&applied)),
        refused: refused.as_deref(),
        replicas,
        halt: Some(&decision),
        pods: &pods,
        now,
    };
    let written = (composition.name_any(), composition.status.as_ref());
    let status = write_status(&compositions, written, &observed).await?;
    warn_degraded(context, composition, &status, now).await;
    Ok(next(&decision, &status, now))
}

/// `result`, or, when it is the spec's refusal ([`Error::InvalidSpec`]), that refusal said
/// ([`refuse_invalid`]) and the reconcile's end.
async fn refused_or<T>(
    result: Result<T, Error>,
    context: &Context,
    composition: &Composition,
    compositions: &Api<Stored>,
) -> Result<Result<T, Action>, Error> {
    match result {
        Err(Error::InvalidSpec(invalid)) => Ok(Err(refuse_invalid(
            context,
            composition,
            compositions,
            &invalid,
        )
        .await?)),
        result => result.map(Ok),
    }
}

/// The API server's refusal of the pods (422) as the spec's: what the spec adds to them
/// (`spec.pod`, resources, env) is checked by the server in full, and its words say what.
fn pods_refused(error: kube::Error) -> Error {
    match error {
        kube::Error::Api(refusal) if refusal.code == 422 => Error::InvalidSpec(crate::InvalidSpec(
            format!("the API server refuses the pods: {}", refusal.message),
        )),
        error => error.into(),
    }
}

/// Whether the API server took this generation's pods already: `Ready` observed it, and not as
/// a refusal (a Conflict stops a reconcile before its pods are tried, so it settles nothing).
/// Until then each reconcile asks the server first ([`configure`]). The key is the generation:
/// an operator upgrade that changes the pods of a settled one has them checked by the real
/// apply only, after the ConfigMaps are written (the refusal is then ours, not the spec's).
fn settled(composition: &Composition) -> bool {
    composition
        .condition(conditions::READY)
        .is_some_and(|ready| {
            ready.observed_generation == composition.metadata.generation
                && ![reasons::INVALID_SPEC, reasons::CONFLICT].contains(&ready.reason.as_str())
        })
}

/// `configured` as it is, but a [`Error::Conflict`] said first, in the status and a Warning
/// event; it is then tried again with the backoff (someone may rename or delete the object).
async fn report_conflict<T>(
    configured: Result<T, Error>,
    context: &Context,
    composition: &Composition,
    compositions: &Api<Stored>,
    now: Timestamp,
) -> Result<T, Error> {
    let Err(Error::Conflict(message)) = configured else {
        return configured;
    };
    let refusal = (reasons::CONFLICT, message.as_str());
    refuse(&Stored::from(composition), compositions, refusal, now).await?;
    let on = composition.object_ref(&());
    let why = (reasons::CONFLICT, "Reconcile");
    context.events.warning(&on, why, message.clone(), now).await;
    Err(Error::Conflict(message))
}

/// Applies the Deployment; pods the API server refuses are the spec's refusal.
async fn apply_deployment(
    api: &Api<Deployment>,
    deployment: &Deployment,
) -> Result<Deployment, Error> {
    kube_io::apply(api, deployment).await.map_err(pods_refused)
}

/// The pods' drain key: the existing Deployment's, or a new one for a new Deployment. One for a
/// whole reconcile, so the dry run tries the pods the apply sends.
fn drain_key(existing: Option<&Deployment>) -> String {
    existing
        .and_then(rollout::drain_key_of)
        .unwrap_or_else(rollout::new_drain_key)
}

/// The Deployment to apply, with the replicas the halt leaves.
fn deployment(
    context: &Context,
    composition: &Composition,
    owner: &Owner,
    valid: &Valid,
    drain: &str,
    replicas: i32,
) -> Deployment {
    desired::deployment(
        owner,
        composition,
        valid,
        &context.settings,
        drain,
        replicas,
    )
}

/// A spec refused at reconcile time: its status says so, and what runs is left as it was (no
/// apply, no halt step).
async fn refuse(
    composition: &Stored,
    compositions: &Api<Stored>,
    (reason, message): (&'static str, &str),
    now: Timestamp,
) -> Result<Action, Error> {
    let observed = Observed {
        generation: composition.metadata.generation,
        invalid: Some((reason, message)),
        rollout: None,
        refused: None,
        // A refused spec's conditions say nothing of replicas.
        replicas: 0,
        halt: None,
        pods: &[],
        now,
    };
    let written = (composition.name_any(), composition.status());
    write_status(compositions, written, &observed).await?;
    Ok(Action::requeue(RESYNC))
}

/// The status `observed` makes of the Composition's (its name, and its status as read), written
/// when it changed.
async fn write_status(
    compositions: &Api<Stored>,
    (name, previous): (String, Option<&CompositionStatus>),
    observed: &Observed<'_>,
) -> Result<CompositionStatus, Error> {
    let mut status = status::status(observed, previous);
    if observed.rollout.is_some() {
        // With the counts: a refused spec keeps both as they were.
        status.selector = Some(names::selector_text(&name));
    }
    if status::changed(previous, &status) {
        kube_io::patch_status(compositions, &name, &status).await?;
    }
    Ok(status)
}

/// Applies what the pods read (the ConfigMap of manifests, this Composition's part of the
/// namespace's declarations, the control Secret), and around them the NetworkPolicy and the
/// PodDisruptionBudget, and returns the control tokens, derived from the operator's key, and the
/// pods' drain key ([`drain_key`]). Each object is applied only if it is the Composition's own
/// ([`ownership`]), the Deployment (read already) included: one of another owner's stops
/// everything, before any rollout. A spec not yet [`settled`] has its Deployment tried first (a
/// dry run): pods the API server refuses are `InvalidSpec` before anything the running pods read
/// is written.
async fn configure(
    context: &Context,
    (composition, valid): (&Composition, &Valid),
    owner: &Owner,
    existing: Option<&Deployment>,
) -> Result<(Keys, String), Error> {
    let ring = context.keys.borrow().clone().ok_or(Error::NoKey)?;
    let uid = owner.reference.uid.as_str();
    let keys = ring.keys_for(uid);
    if let Some(why) = existing.and_then(|d| ownership::foreign("Deployment", &d.metadata, uid)) {
        return Err(Error::Conflict(why));
    }
    let drain = drain_key(existing);
    if !settled(composition) {
        let deployments = Api::<Deployment>::namespaced(context.client.clone(), &owner.namespace);
        let replicas = existing
            .and_then(|d| d.spec.as_ref()?.replicas)
            .unwrap_or(0);
        let trial = deployment(context, composition, owner, valid, &drain, replicas);
        kube_io::apply_dry_run(&deployments, &trial)
            .await
            .map_err(pods_refused)?;
    }
    let config_maps = Api::<ConfigMap>::namespaced(context.client.clone(), &owner.namespace);
    let components = desired::components(owner, composition);
    kube_io::apply_own(&config_maps, &components, uid).await?;
    declarations::reconcile(&config_maps, &context.declarations, composition, owner).await?;
    if rollout::tokens_due(existing) {
        let secrets = Api::<Secret>::namespaced(context.client.clone(), &owner.namespace);
        let secret = desired::control_secret(owner, &keys);
        kube_io::write_own_secret(&secrets, &secret, uid).await?;
    }
    if let Some(from) = &context.settings.control_from {
        let policies = Api::<NetworkPolicy>::namespaced(context.client.clone(), &owner.namespace);
        let policy = desired::network_policy(owner, from, &context.settings.egress);
        kube_io::apply_own(&policies, &policy, uid).await?;
    }
    if let Some(budget) = desired::disruption_budget(owner, valid) {
        let budgets =
            Api::<PodDisruptionBudget>::namespaced(context.client.clone(), &owner.namespace);
        kube_io::apply_own(&budgets, &budget, uid).await?;
    }
    Ok((keys, drain))
}

/// The halt record the Composition's annotation holds; an unreadable one is ignored (logged).
fn halt_record(composition: &Composition) -> Option<Record> {
    let text = composition.annotations().get(halt::ANNOTATION)?;
    match Record::parse(text) {
        Ok(record) => Some(record),
        Err(error) => {
            tracing::warn!(composition = %composition.name_any(), %error, "ignoring the halt record");
            None
        }
    }
}

/// When to look at the composition again, after `decision` and the `status` it led to.
fn next(decision: &Decision, status: &CompositionStatus, now: Timestamp) -> Action {
    match decision.step {
        // Pods being deleted change nothing the operator watches as they go: look again soon,
        // or `Halted` would wait for the resync.
        Step::Nothing if decision.phase == halt::Phase::ScalingDown => Action::requeue(HALT_STEP),
        Step::Nothing if decision.unreachable.is_empty() && !status_pending(status) => {
            Action::requeue(RESYNC)
        }
        Step::WaitUntil(at) => {
            let wait = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
            Action::requeue(wait.clamp(Duration::from_secs(1), HALT_POLL))
        }
        Step::Halt { .. } | Step::Resume(_) => Action::requeue(HALT_STEP),
        _ => Action::requeue(HALT_POLL),
    }
}

/// Whether a rollout is still under way or a pod is in trouble, so the composition is looked at
/// again soon (the owned Deployment's changes also trigger reconciles, pods' do not).
fn status_pending(status: &CompositionStatus) -> bool {
    status.conditions.iter().any(|condition| {
        (condition.type_ == crate::crd::conditions::PROGRESSING
            || condition.type_ == crate::crd::conditions::DEGRADED)
            && condition.status == "True"
    })
}

/// Each pod's report, asked of all agents at once; each request gives up after 2 s. Only pods
/// that can be asked ([`Seen::control`]: running, not being deleted, with an IP) take part in
/// the halt: a pod without an IP runs no agent yet, and an evicted one never answers again.
async fn reports(context: &Context, pods: &[Seen], keys: &Keys) -> Vec<halt::Pod> {
    let asks = pods
        .iter()
        .filter_map(|pod| Some((pod, pod.control()?)))
        .map(|(pod, target)| async move {
            let report = match context.agents.status(target, keys).await {
                Ok(status) => Report::Status(status),
                Err(error) => Report::Unreachable(error.to_string()),
            };
            halt::Pod {
                name: pod.name.clone(),
                report,
            }
        });
    futures::future::join_all(asks).await
}

/// A composition's halt, in one reconcile: its pods' reports surveyed, the decision taken, its
/// one step done.
struct Halting<'a> {
    context: &'a Context,
    composition: &'a Composition,
    compositions: &'a Api<Stored>,
    pods: &'a [Seen],
    keys: &'a Keys,
}

impl Halting<'_> {
    /// The decision, and the record as it stands after its step.
    async fn run(
        &self,
        valid: &Valid,
        now: Timestamp,
    ) -> Result<(Decision, Option<Record>), Error> {
        let record = halt_record(self.composition);
        let reports = reports(self.context, self.pods, self.keys).await;
        let decision = halt::decide(&Observation {
            halted: self.composition.spec.halted,
            timing: valid.halt,
            record: record.as_ref(),
            pods: &reports,
            left: self.pods.iter().filter(|pod| pod.left()).count(),
            now,
        });
        let record = self.step(&decision, record).await?;
        Ok((decision, record))
    }

    /// Does the halt's one step; returns the record as it stands afterwards.
    async fn step(
        &self,
        decision: &Decision,
        record: Option<Record>,
    ) -> Result<Option<Record>, Error> {
        let (context, composition) = (self.context, self.composition);
        let name = composition.name_any();
        match &decision.step {
            Step::Record(new) => {
                kube_io::record_halt(self.compositions, &name, Some(new)).await?;
                let (note, on) = (format!("halt {new}"), composition.object_ref(&()));
                let why = (decision.phase.reason(), "Halt");
                if decision.phase == halt::Phase::CalledOff {
                    let now = (context.now)();
                    context.events.warning(&on, why, note, now).await;
                } else {
                    context.events.normal(&on, why, note).await;
                }
                Ok(Some(new.clone()))
            }
            Step::Clear => {
                kube_io::record_halt(self.compositions, &name, None).await?;
                let note = "the halt record is removed".to_owned();
                let on = composition.object_ref(&());
                context.events.normal(&on, ("HaltOver", "Halt"), note).await;
                Ok(None)
            }
            Step::Halt { id, pods } => {
                let asks = pods.iter().map(|pod| (pod.as_str(), id.as_str()));
                self.send(asks, "halt", |target, id| {
                    context.agents.halt(target, self.keys, id)
                })
                .await;
                Ok(record)
            }
            Step::Resume(pods) => {
                let asks = pods.iter().map(|(pod, id)| (pod.as_str(), id.as_str()));
                self.send(asks, "resume", |target, id| {
                    context.agents.resume(target, self.keys, id)
                })
                .await;
                Ok(record)
            }
            Step::WaitUntil(_) | Step::Nothing => Ok(record),
        }
    }

    /// Sends each pod with a control endpoint its request (`halt` or `resume`, for its halt id)
    /// at once; one not taken is logged, and the next reconcile sees where the pod is.
    async fn send<'s>(
        &'s self,
        asks: impl Iterator<Item = (&'s str, &'s str)>,
        what: &str,
        request: impl Fn(agent_client::Target<'s>, &'s str) -> agent_client::Reply<'s>,
    ) {
        let sends = asks.filter_map(|(pod, id)| {
            let reply = request(self.target(pod)?, id);
            Some(async move { (pod, reply.await) })
        });
        for (pod, result) in futures::future::join_all(sends).await {
            if let Err(error) = result {
                let composition = self.composition.name_any();
                tracing::warn!(%composition, pod, %error, "{what} not taken");
            }
        }
    }

    fn target(&self, pod: &str) -> Option<agent_client::Target<'_>> {
        self.pods
            .iter()
            .find(|p| p.name == pod)
            .and_then(Seen::control)
    }
}

/// A Warning for pods that fail or that admission refuses, with the `Degraded` condition's
/// words (agents not answering are left to the status: they come and go with rollouts).
async fn warn_degraded(
    context: &Context,
    composition: &Composition,
    status: &CompositionStatus,
    now: Timestamp,
) {
    let failing = [reasons::PODS_FAILING, reasons::PODS_REFUSED];
    let degraded = status.conditions.iter().find(|c| {
        c.type_ == crate::crd::conditions::DEGRADED
            && c.status == "True"
            && failing.contains(&c.reason.as_str())
    });
    if let Some(degraded) = degraded {
        let why = (degraded.reason.as_str(), "Reconcile");
        let on = composition.object_ref(&());
        let note = degraded.message.clone();
        context.events.warning(&on, why, note, now).await;
    }
}

#[cfg(test)]
mod tests;
