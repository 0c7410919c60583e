use super::*;

fn parse(yaml: &str) -> Result<Context, ContextError> {
    Context::parse(yaml, &Environment::local())
}

fn refused(yaml: &str) -> String {
    parse(yaml).unwrap_err().to_string()
}

#[test]
fn reads_the_example_context_of_the_repository() {
    let yaml = include_str!("../../../context.toa.yaml");
    let local = Context::parse(yaml, &Environment::local()).unwrap();
    assert_eq!((local.atomicity, local.amqp), (None, None));
    let dev = Context::parse(yaml, &Environment::parse("dev").unwrap()).unwrap();
    assert_eq!(dev.atomicity.unwrap().redis.len(), 1);
    let production = Context::parse(yaml, &Environment::parse("production").unwrap()).unwrap();
    let atomicity = production.atomicity.unwrap();
    assert_eq!(atomicity.redis.len(), 3);
    assert_eq!(atomicity.interval, Duration::from_millis(5000));
}

#[test]
fn defaults() {
    let context = parse("name: shop\natomicity:\n  redis: redis://localhost\n").unwrap();
    let atomicity = context.atomicity.unwrap();
    assert_eq!(atomicity.interval, DEFAULT_INTERVAL);
    assert_eq!(atomicity.ttl, DEFAULT_TTL);
    assert_eq!(context.addressed.timeout, DEFAULT_ADDRESSED_TIMEOUT);
    assert_eq!(context.amqp, None);
    assert_eq!(parse("name: shop\n").unwrap().atomicity, None);
}

#[test]
fn an_even_number_of_addresses_is_refused_with_the_count() {
    assert_eq!(
        refused("name: a\natomicity:\n  redis: [redis://a, redis://b]\n"),
        "Atomicity takes an odd number of addresses, 2 given."
    );
    assert_eq!(
        refused("name: a\natomicity:\n  redis: [redis://a, redis://b, redis://c, redis://d]\n"),
        "Atomicity takes an odd number of addresses, 4 given."
    );
}

#[test]
fn refused_annotations_name_the_key_and_what_was_expected() {
    let cases = [
        ("name: a\nfoo: 1\n", "`foo`: unknown key; expected one of: name, atomicity, addressed, amqp, storage, limits, configuration"),
        ("name: a\nlimits:\n  queue: 0\n", "`limits.queue`: expected a whole number from 1 to 4294967295, got 0"),
        ("name: a\nlimits:\n  deliveries: many\n", "`limits.deliveries`: expected a positive whole number, got many"),
        ("name: a\nlimits:\n  drain: -1\n", "`limits.drain`: expected a positive whole number of milliseconds, got -1"),
        ("name: a\nlimits:\n  run_command: 5\n", "`limits.run_command`: unknown key; expected one of: operation, runCommand, drain, queue, deliveries, idempotency, once, events, inflight, message"),
        ("name: a\natomicity:\n  redis: redis://a\n  intervl: 5\n", "`atomicity.intervl`: unknown key; expected one of: redis, interval, ttl"),
        ("name: a\natomicity:\n  redis: redis://a\n  interval: 0\n", "`atomicity.interval`: expected a positive whole number of milliseconds, got 0"),
        ("name: a\natomicity:\n  redis: redis://a\n  interval: -5\n", "`atomicity.interval`: expected a positive whole number of milliseconds, got -5"),
        ("name: a\natomicity:\n  redis: redis://a\n  ttl: 1.5\n", "`atomicity.ttl`: expected a positive whole number of milliseconds, got 1.5"),
        ("name: a\naddressed:\n  timeout: 0\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got 0"),
        ("name: a\naddressed:\n  timeout: -100\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got -100"),
        ("name: a\natomicity:\n  redis: redis://a\n  ttl: -1\n", "`atomicity.ttl`: expected a positive whole number of milliseconds, got -1"),
        ("name: a\naddressed:\n  timeout: soon\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got soon"),
        ("name: a\nlimits:\n  once: 315360000001\n", "`limits.once`: expected at most 315360000000 milliseconds (ten years), got 315360000001"),
        ("name: a\nlimits:\n  operation: 18446744073709551615\n", "`limits.operation`: expected at most 315360000000 milliseconds (ten years), got 18446744073709551615"),
        ("name: a\natomicity:\n  interval: 5\n", "`atomicity.redis`: expected one address or a list of them"),
        ("name: a\natomicity:\n  redis: [redis://a, 5, redis://c]\n", "`atomicity.redis[1]`: expected an address, got 5"),
        ("name: a\natomicity:\n  redis: [redis://a, redis://a, redis://c]\n", "`atomicity.redis[1]`: expected independent servers, redis://a:6379 is listed twice"),
        ("name: a\natomicity:\n  redis: localhost\n", "`atomicity.redis`: expected an address like redis://host:6379, got \"localhost\""),
        ("name: a\namqp: [x]\n", "`amqp`: expected an address, got - x"),
        ("name: Shop\n", "`name`: expected 1 to 63 lowercase letters, digits or '-', got \"Shop\""),
        ("atomicity: {redis: redis://a}\n", "`name`: expected the application's name"),
    ];
    for (yaml, message) in cases {
        assert_eq!(refused(yaml), message, "{yaml}");
    }
    assert!(refused("name: [").starts_with("context is not valid YAML"));
}

#[test]
fn credentials_in_an_address_are_refused_and_not_repeated() {
    let message = refused("name: a\natomicity:\n  redis: redis://admin:s3cret@redis:6379\n");
    assert!(message.contains("carries credentials"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

#[test]
fn environment_variables_give_the_same_settings() {
    let vars: HashMap<String, String> = [
        ("TOA_APPLICATION", "shop"),
        ("TOA_ATOMICITY_REDIS", "redis://a, redis://b,redis://c"),
        ("TOA_ATOMICITY_INTERVAL", "250"),
        ("TOA_ADDRESSED_TIMEOUT", "100"),
        ("TOA_AMQP", "amqp://broker"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let context = Context::from_vars(&vars).unwrap();
    let atomicity = context.atomicity.unwrap();
    assert_eq!(atomicity.redis.len(), 3);
    assert_eq!(atomicity.interval, Duration::from_millis(250));
    assert_eq!(atomicity.ttl, DEFAULT_TTL);
    assert_eq!(context.addressed.timeout, Duration::from_millis(100));
    assert_eq!(context.amqp.unwrap().host, "broker");

    let mut even = vars.clone();
    even.insert("TOA_ATOMICITY_REDIS".into(), "redis://a,redis://b".into());
    assert_eq!(
        Context::from_vars(&even).unwrap_err().to_string(),
        "Atomicity takes an odd number of addresses, 2 given."
    );
    let mut zero = vars.clone();
    zero.insert("TOA_ATOMICITY_TTL".into(), "0".into());
    assert_eq!(
        Context::from_vars(&zero).unwrap_err().to_string(),
        "`TOA_ATOMICITY_TTL`: expected a positive whole number of milliseconds, got 0"
    );
}

#[test]
fn limits_are_read_with_their_defaults() {
    let context = parse("name: a\n").unwrap();
    assert_eq!(context.limits, Limits::default());
    assert_eq!(context.limits.stop(), Duration::from_secs(90));
    let context =
        parse("name: a\nlimits:\n  operation: 1500\n  runCommand: 2000\n  drain: 3000\n  queue: 10\n  deliveries: 2\n  inflight: 8\n  message: 1024\n")
            .unwrap();
    assert_eq!(
        context.limits,
        Limits {
            operation: Duration::from_millis(1500),
            run_command: Duration::from_secs(2),
            drain: Duration::from_secs(3),
            queue: 10,
            deliveries: 2,
            idempotency: Duration::from_secs(600),
            once: Duration::from_secs(7 * 24 * 3600),
            events: Duration::from_secs(24 * 3600),
            inflight: 8,
            message: 1024,
        }
    );
    assert_eq!(context.limits.stop(), Duration::from_secs(10));
    // The longest a millisecond setting takes: ten years (one more is refused, above).
    let longest = parse("name: a\nlimits:\n  once: 315360000000\n").unwrap();
    assert_eq!(
        longest.limits.once,
        Duration::from_secs(10 * 365 * 24 * 3600)
    );
}

#[test]
fn a_context_reads_back_from_the_variables_it_writes() {
    let documents = [
        "name: a\n",
        "name: shop\natomicity:\n  redis: [redis://r0, redis://r1:6380/2, redis://r2]\n  interval: 700\n  ttl: 9000\naddressed:\n  timeout: 1234\namqp: amqp://broker:5673/vh\nlimits:\n  operation: 5\n  runCommand: 6\n  drain: 7\n  queue: 8\n  deliveries: 9\n  idempotency: 10\n  once: 11\n",
    ];
    for document in documents {
        let context = parse(document).unwrap();
        let vars: HashMap<String, String> = context
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(Context::from_vars(&vars).unwrap(), context, "{document}");
    }
}

mod generated {
    use super::*;
    use proptest::prelude::*;

    fn millis() -> impl Strategy<Value = Duration> {
        (1u64..10_000_000).prop_map(Duration::from_millis)
    }

    fn context() -> impl Strategy<Value = Context> {
        let name = "[a-z][a-z0-9-]{0,20}";
        let host = "[a-z][a-z0-9]{0,8}";
        let redis = prop::sample::select(vec![1usize, 3, 5])
            .prop_flat_map(move |n| prop::collection::btree_set((host, 1u16..u16::MAX), n..=n));
        let atomicity = prop::option::of((redis, millis(), millis()));
        let amqp = prop::option::of((host, 1u16..u16::MAX, "[a-z]{0,6}"));
        let limits = (
            (millis(), millis(), millis(), millis()),
            (1u32.., 1u32.., millis(), millis(), 1u32.., 1u32..),
        );
        (name, atomicity, millis(), amqp, limits).prop_map(
            |(name, atomicity, timeout, amqp, limits)| {
                let atomicity = atomicity.map(|(servers, interval, ttl)| {
                    let redis: Vec<String> = servers
                        .iter()
                        .map(|(host, port)| format!("redis://{host}:{port}"))
                        .collect();
                    Atomicity::new(&redis, Some(interval), Some(ttl)).unwrap()
                });
                let amqp = amqp.map(|(host, port, vhost)| {
                    AmqpAddress::parse(&format!("amqp://{host}:{port}/{vhost}"), "amqp").unwrap()
                });
                let (
                    (operation, run_command, drain, events),
                    (queue, deliveries, idempotency, once, inflight, message),
                ) = limits;
                Context {
                    name,
                    atomicity,
                    addressed: Addressed { timeout },
                    amqp,
                    storage: None,
                    limits: Limits {
                        operation,
                        run_command,
                        drain,
                        queue,
                        deliveries,
                        idempotency,
                        once,
                        events,
                        inflight,
                        message,
                    },
                }
            },
        )
    }

    proptest! {
        #[test]
        fn from_vars_reads_back_what_to_vars_writes(context in context()) {
            let vars: HashMap<String, String> = context
                .to_vars()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            prop_assert_eq!(Context::from_vars(&vars).unwrap(), context);
        }
    }
}

#[test]
fn the_module_table_shows_the_settings() {
    let rows: Vec<Vec<String>> = include_str!("../annotations.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `"))
        .map(|row| row.split('|').map(|cell| cell.trim().to_owned()).collect())
        .collect();
    assert_eq!(rows.len(), SETTINGS.len());
    for (row, setting) in rows.iter().zip(SETTINGS) {
        assert_eq!(row[0], format!("{}`", setting.annotation));
        assert!(
            row[1].starts_with(&format!("`{}`", setting.variable)),
            "{row:?}"
        );
        let default = match setting.if_absent {
            IfAbsent::Required if setting.section().is_none() => "required".to_owned(),
            IfAbsent::Required | IfAbsent::Off => "none: ".to_owned(),
            IfAbsent::Millis(duration) => format!("{} ms", duration.as_millis()),
            IfAbsent::Count(count) => format!("{count} "),
        };
        assert!(row[2].starts_with(&default), "{row:?}: {default}");
    }
}
