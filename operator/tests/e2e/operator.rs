//! The operator as a process: `toa-operator` with the chart Deployment's arguments, under the
//! chart's ServiceAccount (a kubeconfig holding its token), so a permission the chart's RBAC lacks
//! fails the suite. Its output is appended to `operator.log`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::chart::Chart;

pub struct Operator {
    child: Option<Child>,
    kubeconfig: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    metrics_port: u16,
    pub starts: u32,
}

impl Operator {
    pub fn new(chart: &Chart, kubeconfig: &Path, log: &Path) -> Self {
        Self {
            child: None,
            kubeconfig: kubeconfig.to_path_buf(),
            log: log.to_path_buf(),
            args: chart.args.clone(),
            env: chart.env.clone(),
            metrics_port: chart.metrics_port,
            starts: 0,
        }
    }

    /// The operator as the chart installs it, under the chart's ServiceAccount (its kubeconfig
    /// written into `root`), logging to `root/operator.log`; not started yet.
    pub async fn under_chart(
        admin: &kube::Client,
        api_port: u16,
        chart: &Chart,
        root: &Path,
    ) -> Self {
        let kubeconfig = crate::cluster::service_account_kubeconfig(
            admin,
            api_port,
            chart,
            &root.join("operator.kubeconfig"),
        )
        .await;
        Self::new(chart, &kubeconfig, &root.join("operator.log"))
    }

    /// Starts it and waits until `/ready` answers.
    pub async fn start(&mut self) {
        assert!(self.child.is_none(), "the operator runs already");
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_toa-operator"))
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // The Deployment's POD_NAME comes from a fieldRef: a name per start, as a new pod has.
            .env("POD_NAME", self.pod_name())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,toa_operator=debug")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("toa-operator starts");
        self.child = Some(child);
        let url = format!("http://127.0.0.1:{}/ready", self.metrics_port);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the operator exited at start: {status}; its log:\n{}",
                    self.tail(40)
                );
            }
            if http
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the operator's /ready did not answer within 30 s; its log:\n{}",
                self.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Another replica of the same operator: the same ServiceAccount, arguments and Lease, with a
    /// `--lease-identity` of its own, `/metrics` on a port of its own and a log of its own
    /// (`operator-<identity>.log`, beside this one's).
    pub fn replica(&self, identity: &str) -> Self {
        let metrics_port = crate::cluster::free_ports(crate::cluster::METRICS_PORTS, 1);
        let mut args: Vec<String> = self
            .args
            .iter()
            .filter(|arg| {
                !arg.starts_with("--metrics-listen") && !arg.starts_with("--lease-identity")
            })
            .cloned()
            .collect();
        assert_eq!(
            args.len() + 1,
            self.args.len(),
            "the chart's arguments set --metrics-listen=…: {:?}",
            self.args
        );
        args.push(format!("--metrics-listen=0.0.0.0:{metrics_port}"));
        args.push(format!("--lease-identity={identity}"));
        Self {
            child: None,
            kubeconfig: self.kubeconfig.clone(),
            log: self.log.with_file_name(format!("operator-{identity}.log")),
            args,
            env: self.env.clone(),
            metrics_port,
            starts: 0,
        }
    }

    /// The Deployment's POD_NAME of the current (or last) start.
    fn pod_name(&self) -> String {
        format!("toa-toa-operator-e2e-{}", self.starts)
    }

    /// Its name in the Lease: `--lease-identity`, else the POD_NAME of the current start.
    pub fn identity(&self) -> String {
        self.args
            .iter()
            .find_map(|arg| arg.strip_prefix("--lease-identity="))
            .map_or_else(|| self.pod_name(), str::to_owned)
    }

    /// The Lease it elects on: (namespace, name), from its arguments.
    pub fn lease(&self) -> (String, String) {
        let arg = |prefix: &str| {
            self.args
                .iter()
                .find_map(|arg| arg.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("no {prefix}… among {:?}", self.args))
                .to_owned()
        };
        (arg("--lease-namespace="), arg("--lease-name="))
    }

    /// SIGKILL, as when its node is lost: nothing finishes and the Lease is not given up.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        child.kill().expect("SIGKILL to the operator");
        child.wait().expect("the killed operator is reaped");
    }

    /// SIGTERM, then waits for it to exit (it finishes its reconciles and gives up its lease).
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: a signal to the process this suite started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "the operator exited {status} on SIGTERM; its log:\n{}",
                    self.tail(40)
                );
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the operator did not stop within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether it still runs (it must not have stopped on its own).
    pub fn check_running(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the operator exited: {status}; its log:\n{}", self.tail(60));
            }
        }
    }

    /// `toa_operator_reconciles_total`, from its `/metrics`.
    pub async fn reconciles(&self) -> u64 {
        self.metric("toa_operator_reconciles_total").await as u64
    }

    /// The sum of a metric's samples named exactly `name` (any labels), from its `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .and_then(|r| r.error_for_status())
            .expect("the operator's /metrics answers")
            .text()
            .await
            .unwrap();
        text.lines()
            .filter_map(|line| {
                let (key, value) = line.rsplit_once(' ')?;
                let key = key.split('{').next()?;
                (key == name).then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// Its process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `lines` lines of its log.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut last: Vec<&str> = text.lines().rev().take(lines).collect();
        last.reverse();
        last.join("\n")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
