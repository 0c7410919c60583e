//! The `render` command as a user runs it: stdout, stderr and the exit code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory holding an application: context.toa.yaml and the component `store.orders`.
fn application(name: &str, context: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("toa-render-command-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("orders")).unwrap();
    std::fs::write(dir.join("context.toa.yaml"), context).unwrap();
    std::fs::write(
        dir.join("orders/manifest.toa.yaml"),
        "name: orders\nnamespace: store\nprogram: [python3, orders.py]\n",
    )
    .unwrap();
    dir
}

fn toa_operator(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toa-operator"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn prints_a_composition_and_exits_0() {
    let dir = application(
        "ok",
        "name: shop\natomicity@production:\n  redis: [redis://a, redis://b, redis://c]\n",
    );
    let output = toa_operator(
        &dir,
        &[
            "render",
            "-e",
            "production",
            "--image",
            "shop:1",
            "--component",
            "orders",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let yaml = text(&output.stdout);
    assert!(yaml.contains("kind: Composition"), "{yaml}");
    assert!(yaml.contains("name: store.orders"), "{yaml}");
    assert!(yaml.contains("- redis://c:6379"), "{yaml}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_even_number_of_addresses_exits_64_with_the_message() {
    let dir = application(
        "even",
        "name: shop\natomicity:\n  redis: [redis://a, redis://b]\n",
    );
    let output = toa_operator(
        &dir,
        &[
            "render",
            "-e",
            "production",
            "--image",
            "shop:1",
            "--component",
            "orders",
        ],
    );
    assert_eq!(output.status.code(), Some(64));
    assert_eq!(output.stdout, b"");
    assert_eq!(
        text(&output.stderr),
        "toa-operator render: context.toa.yaml: Atomicity takes an odd number of addresses, 2 given.\n"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    let dir = application("usage", "name: shop\n");
    let output = toa_operator(&dir, &["render", "-e", "production", "--image", "shop:1"]);
    assert_eq!(output.status.code(), Some(64));
    assert!(
        text(&output.stderr).contains("--component <DIR>"),
        "{}",
        text(&output.stderr)
    );

    let output = toa_operator(&dir, &["render", "--help"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).contains("--environment <ENV>"));
    std::fs::remove_dir_all(dir).unwrap();
}
