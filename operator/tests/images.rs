//! The images the end-to-end suite builds (`scripts/images`) agree with the production
//! Dockerfiles' final stages: the binary at the same path, the same user, entrypoint and command.
//! The suite runs the one; users run the other.

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// What a Dockerfile's final stage says: (binary path, user, entrypoint, cmd).
fn final_stage(dockerfile: &str) -> (String, String, serde_json::Value, serde_json::Value) {
    let text = std::fs::read_to_string(repo().join(dockerfile)).unwrap();
    let stage = text
        .rsplit_once("\nFROM ")
        .expect("a multi-stage Dockerfile")
        .1;
    let mut path = String::new();
    let mut user = String::new();
    let (mut entrypoint, mut cmd) = (serde_json::Value::Null, serde_json::Value::Null);
    for line in stage.lines() {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        match instruction {
            "COPY" => path = rest.split_whitespace().last().unwrap().to_owned(),
            "USER" => user = rest.trim().to_owned(),
            "ENTRYPOINT" => entrypoint = serde_json::from_str(rest).unwrap(),
            "CMD" => cmd = serde_json::from_str(rest).unwrap(),
            _ => {}
        }
    }
    (path, user, entrypoint, cmd)
}

#[test]
fn the_suites_images_agree_with_the_dockerfiles() {
    let output = Command::new(repo().join("scripts/images"))
        .arg("describe")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let described: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(described.len(), 2, "{described:?}");
    for (image, dockerfile) in described
        .iter()
        .zip(["agent/Dockerfile", "operator/Dockerfile"])
    {
        let (path, user, entrypoint, cmd) = final_stage(dockerfile);
        assert_eq!(image["path"], path.as_str(), "{dockerfile}");
        assert_eq!(image["user"], user.as_str(), "{dockerfile}");
        assert_eq!(image["entrypoint"], entrypoint, "{dockerfile}");
        assert_eq!(image["cmd"], cmd, "{dockerfile}");
    }
}
