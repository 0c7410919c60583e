//! Entities served by the agent (DESIGN 17, seed 003) in local runs, through the local API as a
//! component on the Python SDK sees them: transitions, observations, assignments and deletion on
//! the embedded store; on PostgreSQL (scripts/services' server, or a server of a test's own that
//! it stops, restarts or freezes) the oversell across four processes, the DBA's tables and
//! grants, faults under load and a schema's migration. The in-process concurrency (400
//! reservations on 100) is also checked with seed 003's own code in
//! sdk/typescript/test/examples.test.js.

mod support;

use serde_json::{json, Value};
use support::{call_with, Composition};

const WALLETS: &str = "agent/tests/components/wallets";

fn wallets() -> Composition {
    let composition = Composition::start(&[WALLETS], &[]);
    composition.wait_ready();
    composition
}

/// A call of `billing.wallets.<operation>` with `body`: the status and the answer.
fn call(agent: &Composition, operation: &str, body: Value) -> (u16, Value) {
    let target = format!("billing.wallets.{operation}");
    call_with(&agent.agent, &target, "", &body.to_string())
}

fn reply(agent: &Composition, operation: &str, body: Value) -> Value {
    let (status, answer) = call(agent, operation, body);
    assert_eq!(status, 200, "{operation}: {answer}");
    answer["reply"].clone()
}

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or_default()
}

#[test]
fn a_new_object_gets_an_id_and_a_debit_keyed_by_its_ref_is_taken_once() {
    let agent = wallets();
    let opened = reply(&agent, "transit", json!({"input": {"balance": 100}}));
    let id = opened["id"].as_str().unwrap().to_owned();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert_eq!(
        opened,
        json!({"id": id, "VERSION": 1, "balance": 100, "paid": {}})
    );
    let debit = |amount: u64, reference: &str| {
        let request = json!({"query": {"id": id}, "input": {"amount": amount, "ref": reference}});
        call(&agent, "debit", request)
    };
    // The function returned `{balance}`, not the entry: the caller gets what it returned.
    assert_eq!(
        debit(30, "order-1"),
        (200, json!({"reply": {"balance": 70}}))
    );
    // Asked again for the same order: DISCARD, nothing written.
    assert_eq!(
        debit(30, "order-1"),
        (200, json!({"reply": {"balance": 70}}))
    );
    let (status, refused) = debit(500, "order-2");
    assert_eq!((status, code(&refused)), (200, "INSUFFICIENT_FUNDS"));
    let seen = reply(&agent, "observe", json!({"query": {"id": id}}));
    assert_eq!(
        seen,
        json!({"id": id, "VERSION": 2, "balance": 70, "paid": {"order-1": 30}})
    );
}

#[test]
fn a_transition_that_retries_may_not_call_an_operation_made_once_and_a_key_applies_once() {
    let agent = wallets();
    let open = |balance: u64| {
        let opened = reply(&agent, "transit", json!({"input": {"balance": balance}}));
        opened["id"].as_str().unwrap().to_owned()
    };
    let (from, to) = (open(50), open(0));
    // `credit` declares `once`; a caller's key on it is the store's record: applied once.
    let credit = json!({"query": {"id": to}, "input": {"amount": 10}, "key": "gift-1"});
    assert_eq!(
        reply(&agent, "credit", credit.clone()),
        json!({"balance": 10})
    );
    assert_eq!(reply(&agent, "credit", credit), json!({"balance": 10}));
    let other = json!({"query": {"id": to}, "input": {"amount": 99}, "key": "gift-1"});
    let (status, refused) = call(&agent, "credit", other);
    assert_eq!(
        (status, code(&refused)),
        (400, "RequestContract"),
        "{refused}"
    );
    // `sweep` retries on a lost write, so its call to `credit` is refused before it is sent, the
    // first time, with the seed's message; the program gets it as an exception.
    let swept = reply(
        &agent,
        "sweep",
        json!({"query": {"id": from}, "input": {"to": to}}),
    );
    assert_eq!(
        swept,
        json!({"refused": "UnrepeatableException: 'billing.wallets.credit' is made once, and a \
                            transition retried on a lost write would make it again"})
    );
    let seen = |id: &str| {
        let entry = reply(&agent, "observe", json!({"query": {"id": id}}));
        (entry["balance"].clone(), entry["VERSION"].clone())
    };
    assert_eq!(seen(&from), (json!(50), json!(1)), "nothing written");
    assert_eq!(seen(&to), (json!(10), json!(2)));
    // With a key (the same on every run) the call is applied once by it: let through.
    let keyed = json!({"query": {"id": from}, "input": {"to": to, "key": "sweep-1"}});
    let swept = reply(&agent, "sweep", keyed);
    assert_eq!(
        (swept["balance"].clone(), swept["VERSION"].clone()),
        (json!(0), json!(2))
    );
    assert_eq!(seen(&to), (json!(60), json!(3)));
}

#[test]
fn what_breaks_the_schema_or_names_a_stale_version_stores_nothing() {
    let agent = wallets();
    let id = json!({"id": "w-1"});
    reply(
        &agent,
        "assign",
        json!({"query": id, "input": {"owner": "ann"}}),
    );
    let debit = json!({"query": id, "input": {"amount": 0}});
    let (status, invalid) = call(
        &agent,
        "overdraw",
        json!({"query": id, "input": {"amount": 5}}),
    );
    assert_eq!(
        (status, code(&invalid)),
        (422, "INVALID_ENTRY"),
        "{invalid}"
    );
    let message = invalid["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/balance") && message.contains("minimum of 0"),
        "{message}"
    );
    assert_eq!(
        call(&agent, "debit", debit).0,
        400,
        "amount 0 is out of the input's schema"
    );
    // The caller saw version 0; the object is at 1.
    let stale = json!({"query": {"id": "w-1", "version": 0}, "input": {"balance": 9}});
    let (status, refused) = call(&agent, "transit", stale);
    assert_eq!(
        (status, code(&refused)),
        (412, "PRECONDITION_FAILED"),
        "{refused}"
    );
    let body = json!({"query": id, "input": {"balance": 9}}).to_string();
    let by_header = call_with(
        &agent.agent,
        "billing.wallets.transit",
        "If-Match: \"0\"\r\n",
        &body,
    );
    assert_eq!(
        (by_header.0, code(&by_header.1)),
        (412, "PRECONDITION_FAILED")
    );
    let both = json!({"query": {"id": "w-1", "version": 1}, "input": {}}).to_string();
    let disagree = call_with(
        &agent.agent,
        "billing.wallets.transit",
        "If-Match: 2\r\n",
        &both,
    );
    assert_eq!(disagree.0, 400, "{}", disagree.1);
    let bad = call_with(
        &agent.agent,
        "billing.wallets.transit",
        "If-Match: soon\r\n",
        &body,
    );
    assert!(bad.1.to_string().contains("header `if-match`"), "{}", bad.1);
    let seen = reply(&agent, "observe", json!({"query": id}));
    assert_eq!(
        (seen["VERSION"].clone(), seen["balance"].clone()),
        (json!(1), json!(0))
    );
    // With the right version it is written.
    let fresh = call_with(
        &agent.agent,
        "billing.wallets.transit",
        "If-Match: \"1\"\r\n",
        &body,
    );
    assert_eq!(fresh.1["reply"]["VERSION"], 2, "{}", fresh.1);
}

#[test]
fn observations_assignments_and_a_deletion_a_stale_caller_cannot_undo() {
    let agent = wallets();
    let missing = json!({"query": {"id": "nobody"}});
    assert_eq!(reply(&agent, "observe", missing.clone()), Value::Null);
    assert_eq!(
        reply(&agent, "statement", missing.clone()),
        json!({"known": false})
    );
    let debit = json!({"query": {"id": "nobody"}, "input": {"amount": 1, "ref": "r"}});
    let (status, not_found) = call(&agent, "debit", debit);
    assert_eq!(
        (status, code(&not_found)),
        (404, "NOT_FOUND"),
        "{not_found}"
    );
    // An assignment creates the object it names (seed 001's connect records a new terminal).
    let id = json!({"id": "w-2"});
    let assigned = reply(
        &agent,
        "assign",
        json!({"query": id, "input": {"owner": "bo"}}),
    );
    assert_eq!(
        assigned,
        json!({"id": "w-2", "VERSION": 1, "balance": 0, "paid": {}, "owner": "bo"})
    );
    let opened = reply(
        &agent,
        "open",
        json!({"query": id, "input": {"owner": " cy dee "}}),
    );
    assert_eq!(
        (opened["owner"].clone(), opened["VERSION"].clone()),
        (json!("Cy Dee"), json!(2))
    );
    let statement = reply(&agent, "statement", json!({"query": id}));
    assert_eq!(
        statement,
        json!({"known": true, "balance": 0, "version": 2})
    );
    reply(&agent, "delete", json!({"query": id}));
    assert_eq!(reply(&agent, "observe", json!({"query": id})), Value::Null);
    // Deleted stays deleted for an assignment too (a non-associated entity).
    let (status, gone) = call(
        &agent,
        "assign",
        json!({"query": id, "input": {"owner": "x"}}),
    );
    assert_eq!((status, code(&gone)), (404, "NOT_FOUND"), "{gone}");
    // A caller who saw version 2 cannot write it back; without a version it stays deleted.
    let stale = json!({"query": {"id": "w-2", "version": 2}, "input": {"balance": 5}});
    assert_eq!(
        code(&call(&agent, "transit", stale).1),
        "PRECONDITION_FAILED"
    );
    let again = json!({"query": id, "input": {"balance": 5}});
    assert_eq!(code(&call(&agent, "transit", again).1), "NOT_FOUND");
}

#[test]
fn enumerate_pages_through_2500_objects_by_id() {
    enumerate_pages_through_2500(&wallets());
}

#[test]
fn enumerate_pages_through_2500_objects_by_id_on_postgresql() {
    let (application, context) = stored_context("enumerated");
    let agent = Composition::start(&[WALLETS, "--context", &context], &STORAGE_LOGIN);
    agent.wait_ready();
    enumerate_pages_through_2500(&agent);
    drop(agent);
    psql(&format!("DROP SCHEMA \"toa_{application}\" CASCADE"));
}

/// 2,500 objects made by `assign`, listed back by `enumerate` in three pages of up to 1,000, in
/// the ids' order; a page of 1,001 refused.
fn enumerate_pages_through_2500(agent: &Composition) {
    let ids: Vec<String> = (0..2_500).map(|i| format!("w-{i:04}")).collect();
    for id in &ids {
        reply(
            agent,
            "assign",
            json!({"query": {"id": id}, "input": {"owner": id}}),
        );
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut input = json!({"limit": 1000});
        if let Some(after) = &after {
            input["after"] = json!(after);
        }
        let page = reply(agent, "enumerate", json!({"input": input}));
        pages += 1;
        for item in page["items"].as_array().unwrap() {
            assert_eq!(item["owner"], item["id"], "{item}");
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!((pages, seen), (3, ids));
    let (status, refused) = call(agent, "enumerate", json!({"input": {"limit": 1001}}));
    assert_eq!(status, 400, "{refused}");
}

#[test]
fn bad_queries_are_refused_naming_what_was_wrong_and_the_agent_keeps_serving() {
    let agent = wallets();
    let cases = [
        (
            json!({"query": {"id": "a/b"}}),
            "`query.id`: expected 1 to 64",
        ),
        (
            json!({"query": {"id": "x".repeat(65)}}),
            "`query.id`: expected 1 to 64",
        ),
        (
            json!({"query": {"id": "a", "owner": "b"}}),
            "unknown field `owner`",
        ),
        (
            json!({"query": {"id": "a", "version": -1}}),
            "query.version",
        ),
        (
            json!({"input": {"amount": 1, "ref": "r"}}),
            "`query`: debit works on one object",
        ),
    ];
    for (body, expected) in cases {
        let operation = if body.get("input").is_some() {
            "debit"
        } else {
            "observe"
        };
        let (status, refused) = call(&agent, operation, body);
        assert_eq!(status, 400, "{refused}");
        assert!(
            refused.to_string().contains(expected),
            "{expected}: {refused}"
        );
    }
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let body = format!(r#"{{"query": {{"id": "w"}}, "input": {{"owner": {deep}}}}}"#);
    let (status, refused) = call_with(&agent.agent, "billing.wallets.assign", "", &body);
    assert_eq!(status, 400);
    assert!(refused.to_string().contains("recursion limit"), "{refused}");
    let control = json!({"query": {"id": "w"}, "input": {"owner": "x", "VERSION": 9}});
    let (status, refused) = call(&agent, "assign", control);
    assert_eq!(status, 400);
    assert!(
        refused
            .to_string()
            .contains("`input.VERSION`: id, VERSION, DISCARD and DELETE are not properties"),
        "{refused}"
    );
    // A huge entry: refused before anything is read or run, naming the limit.
    let huge = json!({"query": {"id": "w"}, "input": {"owner": "x".repeat(1 << 20)}});
    let (status, refused) = call(&agent, "assign", huge);
    assert_eq!(
        (status, code(&refused)),
        (413, "PAYLOAD_TOO_LARGE"),
        "{refused}"
    );
    assert!(refused.to_string().contains("1048576"), "{refused}");
    assert_eq!(
        reply(&agent, "observe", json!({"query": {"id": "w"}})),
        Value::Null
    );
}

#[test]
fn an_entity_over_a_broker_without_a_store_is_refused() {
    let (context, _, _queues) = support::broker_context("entities", "amqp://127.0.0.1:5672");
    let context = context.display().to_string();
    let output = support::compose_once(&[WALLETS, "--context", &context], &[]);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        log.contains("`storage`: component billing.wallets declares an entity, and the context names a broker and no store"),
        "{log}"
    );
}

/// The tests' PostgreSQL (scripts/services): the address for a context, and its credentials.
const STORAGE: &str = "storage: postgres://127.0.0.1:5432/toa\n";
const STORAGE_LOGIN: [(&str, &str); 2] = [
    ("TOA_STORAGE_USERNAME", "toa"),
    ("TOA_STORAGE_PASSWORD", "toa"),
];

/// 400 concurrent reservations of 1 on a stock of 100 of `component` (`fulfilment.<name>`), run
/// by four agent processes sharing the broker and the store, the calls spread over their local
/// APIs: every answer, and the object afterwards.
fn oversell(dir: &str, name: &str) -> (Vec<(u16, Value)>, Value) {
    let (context, _, _queues) =
        support::broker_context_with("oversell", "amqp://127.0.0.1:5672", STORAGE);
    let context = context.display().to_string();
    let agents: Vec<Composition> = (0..4)
        .map(|_| Composition::start(&[dir, "--context", &context], &STORAGE_LOGIN))
        .collect();
    agents.iter().for_each(Composition::wait_ready);
    let target = |operation: &str| format!("fulfilment.{name}.{operation}");
    let item = json!({"id": "kettle"});
    let stocked = json!({"query": item, "input": {"available": 100}}).to_string();
    let (status, _) = call_with(&agents[0].agent, &target("transit"), "", &stocked);
    assert_eq!(status, 200);
    let reserve = json!({"query": item, "input": {"quantity": 1}}).to_string();
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..100)
            .map(|n| {
                let (agent, target, reserve) = (&agents[n % 4].agent, target("reserve"), &reserve);
                scope.spawn(move || {
                    (0..4)
                        .map(|_| call_with(agent, &target, "", reserve))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let observe = json!({"query": item}).to_string();
    let (_, after) = call_with(&agents[3].agent, &target("observe"), "", &observe);
    (answers, after["reply"].clone())
}

/// How many answers `which` picks.
fn count(answers: &[(u16, Value)], which: impl Fn(u16, &Value) -> bool) -> usize {
    answers
        .iter()
        .filter(|(status, answer)| which(*status, answer))
        .count()
}

#[test]
fn four_processes_sharing_a_store_sell_a_stock_of_100_exactly_once_each() {
    let (answers, after) = oversell("agent/tests/components/stock-retry", "stock");
    let sold = count(&answers, |status, answer| {
        status == 200 && answer.get("reply").is_some()
    });
    let out_of_stock = count(&answers, |_, answer| code(answer) == "OUT_OF_STOCK");
    assert_eq!(
        (answers.len(), sold, out_of_stock),
        (400, 100, 300),
        "{:?}",
        answers
            .iter()
            .find(|(_, a)| a.get("reply").is_none() && code(a) != "OUT_OF_STOCK")
    );
    assert_eq!(
        after,
        json!({"id": "kettle", "available": 0, "VERSION": 101})
    );
}

#[test]
fn under_concurrency_none_every_lost_write_is_a_conflict_and_none_is_stored_twice() {
    let (answers, after) = oversell("agent/tests/components/stock-none", "hold");
    let sold = count(&answers, |status, answer| {
        status == 200 && answer.get("reply").is_some()
    });
    let conflicts = answers
        .iter()
        .filter(|(status, answer)| (*status, code(answer)) == (409, "CONFLICT"))
        .count();
    let out_of_stock = count(&answers, |_, answer| code(answer) == "OUT_OF_STOCK");
    assert_eq!(
        sold + conflicts + out_of_stock,
        400,
        "every call answered, and only so"
    );
    assert!(
        conflicts > 0,
        "four processes on one object lost no write: no concurrency shown"
    );
    let sold = sold as u64;
    assert_eq!(
        after,
        json!({"id": "kettle", "available": 100 - sold, "VERSION": 1 + sold})
    );
}

#[test]
fn a_role_that_may_not_create_tables_starts_once_a_dba_ran_the_printed_ddl() {
    let application = format!("limited-{}", std::process::id());
    let context = std::env::temp_dir().join(format!("toa-context-{application}.yaml"));
    std::fs::write(&context, format!("name: {application}\n{STORAGE}")).unwrap();
    let context = context.display().to_string();
    let stock = "agent/tests/components/stock-retry";
    let limited = [
        ("TOA_STORAGE_USERNAME", "toa_limited"),
        ("TOA_STORAGE_PASSWORD", "toa"),
    ];
    let refused = support::compose_once(&[stock, "--context", &context], &limited);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        log.contains(
            "cannot make the tables of fulfilment.stock (permission denied for database toa)"
        ),
        "{log}"
    );
    assert!(
        log.contains("`toa-agent storage ddl` prints the statements"),
        "{log}"
    );
    // The DBA: the printed statements, run by the database's owner, and grants.
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .current_dir(support::root())
        .args(["storage", "ddl", "--application", &application, stock])
        .output()
        .unwrap();
    let ddl = String::from_utf8(printed.stdout).unwrap();
    let schema = format!("\"toa_{application}\"");
    assert!(
        ddl.contains(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.\"fulfilment.stock\""
        )),
        "{ddl}"
    );
    assert!(
        ddl.contains("-- Then, for the role the agents log in as"),
        "{ddl}"
    );
    // Granted too little: no USAGE, then no DELETE, which only the hourly purge of records and
    // events needs. Each is refused at start, naming it and the grants that give it.
    psql(&ddl);
    let refused = support::compose_once(&[stock, "--context", &context], &limited);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        log.contains(&format!(
            "the role toa_limited may not use the tables of fulfilment.stock: it lacks USAGE on the schema {schema}"
        )),
        "{log}"
    );
    psql(&format!("GRANT USAGE ON SCHEMA {schema} TO toa_limited; GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO toa_limited"));
    let refused = support::compose_once(&[stock, "--context", &context], &limited);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    let missing = format!(
        "it lacks DELETE on {schema}.toa_once, DELETE on {schema}.toa_outbox; a DBA grants what it needs with: "
    );
    let Some((_, grants)) = log.split_once(&missing) else {
        panic!("{log}")
    };
    // The grants the refusal names are enough.
    let grants = grants.lines().next().unwrap_or_default();
    let grants = &grants[..grants.rfind(';').expect("the grants end with a semicolon") + 1];
    psql(grants);
    let agent = Composition::start(&[stock, "--context", &context], &limited);
    agent.wait_ready();
    let stocked = json!({"query": {"id": "k"}, "input": {"available": 2}}).to_string();
    let (status, answer) = call_with(&agent.agent, "fulfilment.stock.transit", "", &stocked);
    assert_eq!(
        (status, answer["reply"]["VERSION"].clone()),
        (200, json!(1)),
        "{answer}"
    );
    drop(agent);
    // A layout a newer runtime recorded: refused, not written over.
    psql(&format!(
        "UPDATE {schema}.toa_runtime SET value = value + 1"
    ));
    let refused = support::compose_once(&[stock, "--context", &context], &limited);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        log.contains(&format!("the schema {schema} was made by a newer runtime")),
        "{log}"
    );
    psql(&format!("DROP SCHEMA {schema} CASCADE"));
}

/// Runs `sql` on the tests' database as its owner.
fn psql(sql: &str) {
    let ran = std::process::Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "toa",
            "-d",
            "toa",
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-c",
            sql,
        ])
        .env("PGPASSWORD", "toa")
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

#[test]
fn a_store_restarted_answers_unavailable_meanwhile_loses_no_acknowledged_write_and_is_found_again()
{
    let (server, agent) = stock_on_own_server("restarted", "");
    let transit = |id: &str, available: u64| {
        let body = json!({"query": {"id": id}, "input": {"available": available}});
        call_with(
            &agent.agent,
            "fulfilment.stock.transit",
            "",
            &body.to_string(),
        )
    };
    for n in 0..20 {
        assert_eq!(transit(&format!("k-{n}"), n).0, 200);
    }
    server.stop();
    let started = std::time::Instant::now();
    let (status, down) = transit("k-down", 1);
    assert_eq!((status, code(&down)), (503, "UNAVAILABLE"), "{down}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
    server.start_again();
    // The agent finds the server again by itself: no restart, no call of ours but these.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while transit("k-up", 1).0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store was not found again in 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for n in 0..20 {
        let body = json!({"query": {"id": format!("k-{n}")}}).to_string();
        let (_, seen) = call_with(&agent.agent, "fulfilment.stock.observe", "", &body);
        assert_eq!(
            seen["reply"],
            json!({"id": format!("k-{n}"), "available": n, "VERSION": 1})
        );
    }
    assert_eq!(
        transit("k-down", 1).1["reply"]["VERSION"],
        1,
        "the refused write was not stored"
    );
}

/// `fulfilment.stock` on a PostgreSQL of the test's own (`postgres` logging in without a
/// password), its context with `more`, once ready.
fn stock_on_own_server(
    prefix: &str,
    more: &str,
) -> (support::postgres::PostgresServer, Composition) {
    let server = support::postgres::PostgresServer::start();
    let application = format!("{prefix}-{}", std::process::id());
    let context = std::env::temp_dir().join(format!("toa-context-{application}.yaml"));
    let text = format!("name: {application}\nstorage: {}\n{more}", server.address());
    std::fs::write(&context, text).unwrap();
    let context = context.display().to_string();
    let login = [("TOA_STORAGE_USERNAME", "postgres")];
    let agent = Composition::start(
        &["agent/tests/components/stock-retry", "--context", &context],
        &login,
    );
    agent.wait_ready();
    (server, agent)
}

/// Waits for `done`, at most `within`, saying `what` when it never is.
fn wait_for(what: &str, within: std::time::Duration, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_store_restarted_under_load_answers_stored_or_unavailable_and_loses_no_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    let (server, agent) = stock_on_own_server("loaded", "");
    // Eight callers, each writing its own object over and over, `available` counting up: the
    // object afterwards must hold the last write acknowledged, or a later one.
    let (stop, acked, refused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let callers: Vec<_> = (0..8)
        .map(|caller| {
            let (stop, acked, refused) = (stop.clone(), acked.clone(), refused.clone());
            let address = agent.agent.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for n in 1_u64.. {
                    if stop.load(SeqCst) {
                        break;
                    }
                    let body =
                        json!({"query": {"id": format!("c{caller}")}, "input": {"available": n}});
                    let (status, answer) =
                        call_with(&address, "fulfilment.stock.transit", "", &body.to_string());
                    let counter = if status == 200 { &acked } else { &refused };
                    counter.fetch_add(1, SeqCst);
                    answers.push((n, status, answer));
                }
                answers
            })
        })
        .collect();
    let within = std::time::Duration::from_secs(60);
    wait_for("80 writes acknowledged", within, || {
        acked.load(SeqCst) >= 80
    });
    server.stop();
    wait_for("eight writes refused", within, || refused.load(SeqCst) >= 8);
    server.start_again();
    let before = acked.load(SeqCst);
    // The agent finds the server again by itself.
    wait_for("80 writes acknowledged after the restart", within, || {
        acked.load(SeqCst) >= before + 80
    });
    stop.store(true, SeqCst);
    for (caller, answers) in callers.into_iter().map(|c| c.join().unwrap()).enumerate() {
        let id = format!("c{caller}");
        let mut last: Option<(u64, u64)> = None;
        for (n, status, answer) in &answers {
            match (status, code(answer)) {
                (200, _) => {
                    let version = answer["reply"]["VERSION"].as_u64().unwrap();
                    assert_eq!(answer["reply"]["available"], json!(n), "{answer}");
                    // Each acknowledged write a version of its own: none applied twice.
                    assert!(last.is_none_or(|(_, v)| version > v), "{id}: {answers:?}");
                    last = Some((*n, version));
                }
                (503, "UNAVAILABLE") => {}
                _ => panic!("{id}: write {n} answered {status} {answer}"),
            }
        }
        let (n, version) = last.expect("every caller acknowledged");
        let body = json!({"query": {"id": &id}}).to_string();
        let (_, seen) = call_with(&agent.agent, "fulfilment.stock.observe", "", &body);
        let (available, stored) = (&seen["reply"]["available"], &seen["reply"]["VERSION"]);
        assert!(
            available.as_u64().unwrap() >= n,
            "{id}: {seen}, acknowledged {n}"
        );
        assert!(
            stored.as_u64().unwrap() >= version,
            "{id}: {seen}, acknowledged {version}"
        );
        // Never more versions than writes asked for.
        assert!(
            stored.as_u64().unwrap() <= answers.len() as u64,
            "{id}: {seen}"
        );
    }
}

#[test]
fn a_frozen_store_ends_each_call_at_its_deadline_and_serves_again_once_thawed() {
    let (server, agent) = stock_on_own_server("sigstop", "limits:\n  operation: 2000\n");
    let transit = |available: u64| {
        let body = json!({"query": {"id": "k"}, "input": {"available": available}});
        call_with(
            &agent.agent,
            "fulfilment.stock.transit",
            "",
            &body.to_string(),
        )
    };
    assert_eq!(transit(1).0, 200);
    server.freeze();
    // A write, and a read: each ends by its deadline (2 s), not the server's return.
    for target in ["fulfilment.stock.transit", "fulfilment.stock.observe"] {
        let body = json!({"query": {"id": "k"}, "input": {"available": 2}});
        let body = if target.ends_with("observe") {
            json!({"query": {"id": "k"}})
        } else {
            body
        };
        let started = std::time::Instant::now();
        let (status, answer) = call_with(&agent.agent, target, "", &body.to_string());
        let waited = started.elapsed();
        assert_eq!(
            (status, code(&answer)),
            (503, "UNAVAILABLE"),
            "{target}: {answer}"
        );
        assert!(
            waited < std::time::Duration::from_millis(3500),
            "{target}: answered after {waited:?}"
        );
    }
    server.thaw();
    let within = std::time::Duration::from_secs(30);
    wait_for("a write once thawed", within, || transit(3).0 == 200);
    let (_, seen) = call_with(
        &agent.agent,
        "fulfilment.stock.observe",
        "",
        &json!({"query": {"id": "k"}}).to_string(),
    );
    // The frozen write may have been applied after the thaw (its answer was `UNAVAILABLE`, not
    // "not stored"); the last one is.
    assert_eq!(seen["reply"]["available"], json!(3), "{seen}");
}

/// A context of its own on the tests' PostgreSQL: the application's name and the context's path.
fn stored_context(prefix: &str) -> (String, String) {
    let application = format!("{prefix}-{}", std::process::id());
    let context = std::env::temp_dir().join(format!("toa-context-{application}.yaml"));
    std::fs::write(&context, format!("name: {application}\n{STORAGE}")).unwrap();
    (application, context.display().to_string())
}

/// A call of `billing.accounts.<operation>`: the status and the answer.
fn account(agent: &Composition, operation: &str, body: Value) -> (u16, Value) {
    let target = format!("billing.accounts.{operation}");
    call_with(&agent.agent, &target, "", &body.to_string())
}

#[test]
fn a_changed_schema_applies_from_the_next_write_and_enumerate_migrates_what_was_stored() {
    let (application, context) = stored_context("migrated");
    let before = ["agent/tests/components/accounts", "--context", &context];
    let agent = Composition::start(&before, &STORAGE_LOGIN);
    agent.wait_ready();
    // 250 accounts, the first 20 overdrawn (balances -20 to -1).
    for n in 0..250_i64 {
        let body = json!({"query": {"id": format!("a{n:03}")}, "input": {"balance": n - 20}});
        let (status, answer) = account(&agent, "transit", body);
        assert_eq!(status, 200, "{answer}");
    }
    drop(agent);
    let after = ["agent/tests/components/accounts-v2", "--context", &context];
    let agent = Composition::start(&after, &STORAGE_LOGIN);
    agent.wait_ready();
    // Stored before, observed after: `owed` reads as blank's 0, the balance as stored although
    // the schema now refuses it.
    let a005 = json!({"query": {"id": "a005"}});
    let (_, seen) = account(&agent, "observe", a005.clone());
    let before = json!({"id": "a005", "VERSION": 1, "balance": -15, "owed": 0});
    assert_eq!(seen["reply"], before);
    // A write must leave a valid object: one leaving the balance below zero names it.
    let touched = json!({"query": {"id": "a005"}, "input": {"owed": 1}});
    let (status, refused) = account(&agent, "transit", touched);
    assert_eq!(
        (status, code(&refused)),
        (422, "INVALID_ENTRY"),
        "{refused}"
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("(at /balance)"), "{message}");
    assert_eq!(account(&agent, "observe", a005.clone()).1["reply"], before);
    // The migration in the docs: pages of 100 through enumerate, each account written at the
    // version it was read at.
    let migrate = |limit: u64| account(&agent, "migrate", json!({"input": {"limit": limit}}));
    let (status, migrated) = migrate(100);
    assert_eq!(status, 200, "{migrated}");
    assert_eq!(migrated["reply"], json!({"moved": 20, "skipped": 0}));
    let moved = json!({"id": "a005", "VERSION": 2, "balance": 0, "owed": 15});
    assert_eq!(account(&agent, "observe", a005).1["reply"], moved);
    let untouched = json!({"query": {"id": "a100"}});
    let (_, seen) = account(&agent, "observe", untouched);
    assert_eq!(
        seen["reply"],
        json!({"id": "a100", "VERSION": 1, "balance": 80, "owed": 0})
    );
    // A write of one property of an object stored before keeps blank's value of the other.
    let one = json!({"query": {"id": "a101"}, "input": {"balance": 82}});
    let written = json!({"id": "a101", "VERSION": 2, "balance": 82, "owed": 0});
    assert_eq!(account(&agent, "transit", one).1["reply"], written);
    // Run again, it finds nothing left to move.
    assert_eq!(migrate(1000).1["reply"], json!({"moved": 0, "skipped": 0}));
    drop(agent);
    psql(&format!("DROP SCHEMA \"toa_{application}\" CASCADE"));
}
