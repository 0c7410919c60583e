//! Two namespaces running one application name on one broker and one Redis do not meet, and an
//! application runs with credentials of its own that reach only its own names: a RabbitMQ user
//! and virtual host, and a Redis ACL user with only the commands the agent uses
//! (docs/composition.md, "Sharing a broker or a Redis").

use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::node::PodView;
use crate::support::{
    apply, composition, count, credentials, ready_pods, wait_no_pods, Suite, PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, services};

/// The Redis commands the agent uses, as docs/composition.md lists them for an ACL user.
pub const REDIS_COMMANDS: &str = "-@all +ping +info +select +get +set +del +exists +incr \
    +pexpire +pttl +time +zadd +zrange +zrem +zremrangebyscore +publish +subscribe \
    +unsubscribe +eval +evalsha +script|load";

/// `application` in the namespace `e2e-apart`, beside the same application in `namespace`
/// whose two pods (`theirs`) hold the Redis's slots and a lock, on the same servers: its one pod
/// owns all 16 slots, takes the lock they hold, and its queue is in its own virtual host, under a
/// name that carries its namespace. It logs in with its own users: RabbitMQ's `e2e-apart` (only
/// its virtual host) and Redis's `e2e-apart` (only `toa:e2e-apart/<application>:*` and the
/// agent's commands), which cannot read the other namespace's keys.
pub async fn apart(
    suite: &Arc<Suite>,
    (namespace, application): (&str, &str),
    (redis, rabbit): (&services::Redis, &services::Rabbit),
    theirs: &[PodView],
) {
    let (apart, name, user) = ("e2e-apart", "apart", "e2e-apart");
    let password = "apart-e2e-password";
    cluster::restricted_namespace(&suite.admin, apart).await;
    for args in [
        vec!["add_vhost", user],
        vec!["add_user", user, password],
        vec!["set_permissions", "-p", user, user, ".*", ".*", ".*"],
    ] {
        rabbit
            .ctl(&args)
            .unwrap_or_else(|e| panic!("rabbitmqctl {args:?}: {e}"));
    }
    let prefix = format!("toa:{apart}/{application}:");
    let rule =
        format!("on >{password} resetkeys ~{prefix}* resetchannels &{prefix}* {REDIS_COMMANDS}");
    let mut acl = vec!["ACL", "SETUSER", user];
    acl.extend(rule.split(' '));
    // redis-cli says a refused command's error on stdout and succeeds.
    let set = redis.cli(&acl).unwrap();
    assert_eq!(set.trim(), "OK", "ACL SETUSER {rule}");
    let secret = json!({
        "amqp-username": user, "amqp-password": password,
        "redis-username": user, "redis-password": password,
    });
    let spec = json!({
        "application": application,
        "context": {
            "atomicity": { "redis": [redis.url()], "interval": 300 },
            "amqp": format!("{}/{user}", rabbit.url()),
        },
        "credentials": credentials(suite, apart, secret).await,
    });
    apply(suite, &composition(apart, name, spec.clone())).await;
    let pod = ready_pods(suite, apart, name, 1).await.remove(0);

    // The slots: all 16 its own, while the other namespace's two pods split them.
    let share = slots(suite, &pod).await;
    assert_eq!(share, (0..16).collect(), "{}'s share", pod.name);
    // The lock `shared`, which the other namespace's first pod holds: taken at once here.
    // Held for 15 s there, it is taken within 5 s here.
    let hold = json!({ "do": "lock", "key": "shared", "hold": 15 });
    suite.harness.ask(&theirs[0].name, hold);
    told(suite, &theirs[0], "shared", Duration::from_secs(10)).await;
    suite.harness.ask(
        &pod.name,
        json!({ "do": "lock", "key": "shared", "hold": 0 }),
    );
    told(suite, &pod, "shared", Duration::from_secs(5)).await;

    // The queues: each under its namespace, this one in its own virtual host.
    let component = crate::support::COMPONENT;
    let queue = format!("toa.{apart}/{application}.{component}");
    let listed = rabbit.queues_in(user).unwrap();
    assert!(listed.contains(&queue), "{listed:?}, not {queue}");
    let theirs_queue = format!("toa.{namespace}/{application}.{component}");
    assert!(rabbit.queues().unwrap().contains(&theirs_queue));
    assert!(!listed.contains(&theirs_queue), "{listed:?}");
    // Its Redis user cannot read the other namespace's keys.
    let other = format!("toa:{namespace}/{application}:{component}:slots:members");
    let denied = redis.cli(&[
        "--user",
        user,
        "--pass",
        password,
        "--no-auth-warning",
        "zrange",
        &other,
        "0",
        "-1",
    ]);
    let denied = denied.unwrap_or_else(|e| e);
    assert!(denied.contains("NOPERM"), "{denied}");

    let mut stopped = composition(apart, name, spec);
    stopped["spec"]["replicas"] = json!(0);
    apply(suite, &stopped).await;
    wait_no_pods(suite, apart, name).await;
}

/// The pod's share of 16 slots, asked through its recorder until it is all of them (right after
/// the start it may still be settling).
async fn slots(suite: &Suite, pod: &PodView) -> BTreeSet<u64> {
    eventually("a share of all 16 slots", PATIENCE, || async {
        let before = count(suite, pod, "slots");
        suite
            .harness
            .ask(&pod.name, json!({ "do": "slots", "total": 16 }));
        let answer = eventually("an answer", Duration::from_secs(10), || async {
            let told = suite.harness.events(&pod.name).into_iter();
            let shares: Vec<_> = told.filter(|e| e.event == "slots").collect();
            let answered = shares.len() > before;
            let last = shares.last().filter(|_| answered);
            last.map(|e| e.details["slots"].clone())
                .ok_or("none".to_owned())
        })
        .await;
        let share: Result<BTreeSet<u64>, _> = serde_json::from_value(answer.clone());
        let share = share.map_err(|_| answer.to_string())?;
        (share.len() == 16)
            .then_some(share.clone())
            .ok_or(format!("{share:?}"))
    })
    .await
}

/// Waits (`within`) for the pod's recorder to tell it locked `key`.
async fn told(suite: &Suite, pod: &PodView, key: &str, within: Duration) {
    let what = format!("{} locked {key}", pod.name);
    eventually(&what, within, || async {
        let events = suite.harness.events(&pod.name);
        let found = events
            .iter()
            .any(|e| e.event == "locked" && e.details["key"] == key);
        found
            .then_some(())
            .ok_or(format!("{:?}", suite.harness.names(&pod.name)))
    })
    .await;
}
