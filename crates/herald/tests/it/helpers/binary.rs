//! The real `herald` binary, started one way: `herald()` (a clean
//! environment: nothing from the developer's shell), `serve()` (on a
//! SQLite file, waiting for `/healthz`) and `run()` (a one-shot command).

use std::net::SocketAddr;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{closed_port, wait_healthy, PATIENCE};

pub fn herald() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    // Start from a clean slate: no HERALD_* from the developer's shell.
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_LOG", "warn").kill_on_drop(true);
    cmd
}

pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub first_line: String,
}

/// `herald serve` on 127.0.0.1:`port` over the SQLite store `db`, to be
/// given more settings and started.
pub fn serve_command(db: &std::path::Path, port: u16) -> Command {
    let mut cmd = herald();
    cmd.arg("serve")
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        .env("HERALD_DATABASE_URL", format!("sqlite://{}", db.display()));
    cmd
}

/// Starts `herald serve` and waits (bounded) until /healthz answers.
pub async fn serve(db: &std::path::Path, envs: &[(&str, &str)]) -> Proc {
    let port = closed_port().await;
    let mut cmd = serve_command(db, port);
    cmd.stdout(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("herald starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first_line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .expect("herald prints within the patience")
        .expect("read stdout")
        .unwrap_or_default();
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    wait_healthy(addr).await;
    Proc {
        child,
        addr,
        first_line,
    }
}

/// Runs `cmd` to its end (within the patience); the test fails, showing
/// what it printed, unless it succeeds. Returns its stdout.
pub async fn succeeds(cmd: &mut Command) -> String {
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("herald ends within the patience")
        .expect("herald runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `herald <args>` with `envs`: (exit code, stdout, stderr).
pub async fn run(args: &[&str], envs: &[(&str, String)]) -> (Option<i32>, String, String) {
    let mut cmd = herald();
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("herald ends within the patience")
        .expect("herald runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
