//! The coordination primitives through the Rust API, in one process: the seed's three examples
//! (lock, slots, meter) with the embedded default, or through Redis when `TOA_ATOMICITY_REDIS` is
//! set.
//!
//!   cargo run -p toa-agent --example primitives
//!   TOA_ATOMICITY_REDIS=redis://127.0.0.1:6379 TOA_ATOMICITY_INTERVAL=500 \
//!     cargo run -p toa-agent --example primitives

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use toa_agent::{Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Context, Credentials, ProcessVars};

#[tokio::main]
async fn main() -> ExitCode {
    toa_context::logs::LogArgs::default().init();
    let (atomicity, credentials) = if std::env::var_os("TOA_ATOMICITY_REDIS").is_some() {
        let mut vars: std::collections::HashMap<String, String> = std::env::vars().collect();
        vars.entry("TOA_APPLICATION".into())
            .or_insert_with(|| "demo".into());
        match Context::from_vars(&vars).and_then(|c| {
            Credentials::from_vars(&ProcessVars, "TOA_REDIS").map(|cred| (c.atomicity, cred))
        }) {
            Ok(settings) => settings,
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::from(64);
            }
        }
    } else {
        (None, Credentials::default())
    };
    let backend = match &atomicity {
        Some(a) => format!(
            "Redis at {}",
            a.redis
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "the embedded in-process default".to_owned(),
    };
    println!("coordinating through {backend}\n");
    let metrics = Metrics::new();
    let atom = |component: &str| {
        Atom::start(
            AtomConfig {
                scope: Scope::new("demo", component),
                mode: Mode::Local,
                atomicity: atomicity.clone(),
                credentials: credentials.clone(),
                roots: Default::default(),
                instance: format!("demo-{}", std::process::id()),
                // One process: the in-process default, apart from any local group.
                group: None,
            },
            metrics.clone(),
        )
        .map(Arc::new)
    };
    let (orders, notifications, catalog) = match (
        atom("store.orders"),
        atom("notifications"),
        atom("store.catalog"),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };

    println!(
        "lock: three settlements ask for the key 'settlement' at once; they run one after another"
    );
    let settlements: Vec<_> = (1..=3)
        .map(|n| {
            let orders = orders.clone();
            tokio::spawn(async move {
                orders
                    .lock("settlement", |signal| async move {
                        println!(
                            "  settlement {n} holds the lock (fencing token {})",
                            signal.token()
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        println!("  settlement {n} done");
                    })
                    .await
            })
        })
        .collect();
    for settlement in settlements {
        let failure = match settlement.await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        eprintln!("lock failed: {failure}");
        return ExitCode::FAILURE;
    }

    println!("\nslots: the mail queue has 16 partitions");
    let listening = notifications.onassigned(|assignment| match assignment {
        Some(a) => println!(
            "  onassigned: this replica is number {} of {} (epoch {})",
            a.i, a.n, a.epoch
        ),
        None => println!("  onassigned: this replica owns nothing for now"),
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while notifications.slots(16).is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match notifications.slots(16) {
        Some(slots) => println!("  slots(16) = {slots:?}: this replica drains these partitions"),
        None => println!("  slots(16) = none: owns nothing (yet)"),
    }
    drop(listening);

    println!(
        "\nmeter: ten appraisals a minute per customer, each worth 6000 ms of a 60000 ms window"
    );
    for call in 1..=11 {
        match catalog.meter(["appraise:c1"], &[6000]).await {
            Ok(debts) if debts[0] > 60_000 => println!(
                "  call {call:>2}: debt {} ms -> TOO_MANY_REQUESTS",
                debts[0]
            ),
            Ok(debts) => println!("  call {call:>2}: debt {} ms -> appraised", debts[0]),
            Err(error) => {
                eprintln!("meter failed: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    for atom in [&orders, &notifications, &catalog] {
        atom.shutdown().await;
    }
    ExitCode::SUCCESS
}
