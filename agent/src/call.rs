//! `toa-agent call`: one call to a running composition, printed as JSON.

use std::process::ExitCode;

/// A call, or with `task` a task (the answer once the broker took it).
pub async fn run(target: &str, request: &str, agent: &str, task: bool) -> ExitCode {
    let Some((component, operation)) = target.rsplit_once('.') else {
        eprintln!("expected COMPONENT.OPERATION, as store.catalog.appraise, got {target:?}");
        return ExitCode::from(super::USAGE);
    };
    // YAML flow syntax accepts JSON and the seeds' `{ input: { customer: 'c1' } }`.
    let body: serde_json::Value = match serde_yaml::from_str(request) {
        Ok(body) => body,
        Err(error) => {
            eprintln!("the request is neither JSON nor YAML: {error}");
            return ExitCode::from(super::USAGE);
        }
    };
    let kind = if task { "task" } else { "call" };
    let url = format!(
        "{}/v1/{kind}/{component}/{operation}",
        agent.trim_end_matches('/')
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    match client.post(&url).json(&body).send().await {
        Ok(response) => {
            let ok = response.status().is_success();
            let text = response.text().await.unwrap_or_default();
            let value: serde_json::Value =
                serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            // One write: the seeds run two calls at once in one terminal (`… &`), and lines
            // written one by one would interleave.
            let printed = serde_json::to_string_pretty(&value).unwrap_or_default() + "\n";
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), printed.as_bytes());
            if ok && value.get("error").is_none() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("no agent answers at {agent}: {error} (is `toa-agent compose` running?)");
            ExitCode::FAILURE
        }
    }
}

/// `toa-agent drain`: asks the agent of a local run to drain and waits until dispose ran.
pub async fn drain(agent: &str) -> ExitCode {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let whom = agent.trim_end_matches('/');
    let request = client.post(format!("{whom}/v1/drain"));
    match request.send().await {
        Ok(response) if response.status().is_success() => ExitCode::SUCCESS,
        Ok(response) => {
            eprintln!("the agent at {whom} answered {}", response.status());
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("no agent answers at {whom}: {error}");
            ExitCode::FAILURE
        }
    }
}
