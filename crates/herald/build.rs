// sqlx::migrate!() embeds the PostgreSQL migrations at compile time: a new
// migration file must rebuild the crate even when no Rust source changed.
// `herald --version` names the commit it was built from (HERALD_GIT_COMMIT,
// "unknown" outside a git checkout, as in a container build context that
// leaves `.git` out).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs/heads");
    println!("cargo:rerun-if-env-changed=HERALD_GIT_COMMIT");
    let commit = std::env::var("HERALD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=HERALD_GIT_COMMIT={commit}");
}
