//! README's curl walkthrough, taken from README.md and run with bash and
//! curl against the real binary, so the README cannot drift from Herald.

use std::process::Stdio;

use crate::helpers::binary::serve;
use crate::helpers::{repo_file, Receiver, PATIENCE, TOKEN};

/// The `sh` block under README's "A first webhook, with curl".
fn walkthrough() -> String {
    sh_block_after(&repo_file("README.md"), "## A first webhook, with curl").to_owned()
}

/// The first `sh` code block of `text` after the heading `heading`.
fn sh_block_after<'t>(text: &'t str, heading: &str) -> &'t str {
    let section = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no section {heading}"));
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("no sh block in {heading}"))
}

#[tokio::test]
async fn the_readme_walkthrough_runs_as_written() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let proc = serve(
        &dir.path().join("h.db"),
        &[
            ("HERALD_ADMIN_TOKEN", TOKEN),
            ("HERALD_ALLOW_PRIVATE_NETWORKS", "true"),
        ],
    )
    .await;
    let script = walkthrough();
    assert!(script.contains("localhost:8080") && script.contains("TOKEN=hrld_"));
    let script = script
        .lines()
        .map(|line| {
            if line.starts_with("TOKEN=") {
                format!("TOKEN={TOKEN}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("localhost:8080", &proc.addr.to_string())
        .replace("https://hooks.acme.example/herald", &rx.url("/herald"));
    let run = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    let out = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the walkthrough finishes")
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the walkthrough failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every command answered: the event type, app, endpoint, message and
    // both reads.
    for expected in [
        r#""name":"invoice.paid""#,
        r#""uid":"acme""#,
        r#""filterTypes":["invoice.paid"]"#,
        r#""eventId":"inv-42""#,
        r#""data":["#,
    ] {
        assert!(stdout.contains(expected), "{expected} not in:\n{stdout}");
    }
    let got = rx.wait_for(1).await;
    assert_eq!(got[0].path, "/herald");
    assert_eq!(got[0].body.as_ref(), br#"{"amount": 4200}"#);
    drop(proc);
}

/// The configuration reference (docs/configuration.md, linked from README)
/// names every setting `config::KEYS` knows and none it does not, so neither
/// can drift from the other.
#[test]
fn the_configuration_table_names_exactly_the_known_settings() {
    let reference = repo_file("docs/configuration.md");
    let mut documented = std::collections::BTreeSet::new();
    for row in reference.lines().filter(|l| l.starts_with("| `HERALD_")) {
        let first_cell = row.split('|').nth(1).unwrap_or_default();
        for name in first_cell.split('`').filter(|s| s.starts_with("HERALD_")) {
            documented.insert(name.to_owned());
        }
    }
    let known: std::collections::BTreeSet<String> = herald::config::KEYS
        .iter()
        .map(|(k, _, _)| (*k).to_owned())
        .collect();
    let undocumented: Vec<_> = known.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&known).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md lacks {undocumented:?} and names settings Herald does not know: {unknown:?}"
    );
}

/// The `HERALD_*` names a text uses (`HERALD_X=`, `HERALD_X:`, `-e HERALD_X`).
fn herald_names(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("HERALD_") && w.len() > "HERALD_".len())
        .map(str::to_owned)
        .collect()
}

/// README's "With Docker" commands build the image the Dockerfile
/// describes and run it as the Dockerfile expects (its port, its volume,
/// settings Herald knows); compose.yaml and .env.example name only
/// settings Herald knows. (deploy/check-image runs the same image in CI.)
#[test]
fn the_docker_commands_and_compose_file_match_the_image() {
    let known: std::collections::BTreeSet<String> = herald::config::KEYS
        .iter()
        .map(|(k, _, _)| (*k).to_owned())
        .collect();
    let readme = repo_file("README.md");
    let block = sh_block_after(&readme, "### With Docker");
    let dockerfile = repo_file("Dockerfile");
    assert!(block.contains("docker build -t herald ."), "{block}");
    let run = block
        .lines()
        .find(|l| l.starts_with("docker run"))
        .expect("a docker run line");
    assert!(run.ends_with(" herald"), "runs the image built: {run}");
    assert!(
        dockerfile.contains("EXPOSE 8080") && run.contains(":8080 "),
        "the port the image listens on: {run}"
    );
    assert!(
        dockerfile.contains("VOLUME [\"/data\"]") && run.contains(":/data "),
        "the image's volume: {run}"
    );
    assert!(dockerfile.contains("HERALD_DATABASE_URL=sqlite:///data/herald.db"));
    for (file, text) in [
        ("README's docker run", run.to_owned()),
        ("Dockerfile", dockerfile.clone()),
        ("compose.yaml", repo_file("compose.yaml")),
        (".env.example", repo_file(".env.example")),
    ] {
        let names = herald_names(&text);
        let unknown: Vec<_> = names.difference(&known).collect();
        assert!(
            unknown.is_empty(),
            "{file} names unknown settings {unknown:?}"
        );
    }
}

/// README's first command, `cargo run --release -- serve`, needs the
/// workspace's default members to hold exactly one binary, Herald's: a
/// second (herald-bench) made cargo ask which to run.
#[test]
fn cargo_run_in_the_workspace_runs_herald() {
    let manifest: toml::Value = toml::from_str(&repo_file("Cargo.toml")).expect("Cargo.toml");
    let workspace = &manifest["workspace"];
    let members = workspace
        .get("default-members")
        .or_else(|| workspace.get("members"))
        .and_then(toml::Value::as_array)
        .expect("members");
    let mut binaries = Vec::new();
    for member in members.iter().filter_map(toml::Value::as_str) {
        let package: toml::Value =
            toml::from_str(&repo_file(&format!("{member}/Cargo.toml"))).expect("member manifest");
        let declared: Vec<String> = package
            .get("bin")
            .and_then(toml::Value::as_array)
            .map(|bins| {
                bins.iter()
                    .filter_map(|b| b.get("name").and_then(toml::Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if !declared.is_empty() {
            binaries.extend(declared);
        } else if root.join(member).join("src/main.rs").exists() {
            binaries.push(member.to_owned());
        }
    }
    assert_eq!(binaries, ["herald"], "binaries `cargo run` chooses from");
    assert!(repo_file("README.md").contains("cargo run --release -- serve"));
}

/// The docs (README, ARCHITECTURE.md, BENCHMARKS.md, `docs/**`) name code
/// by its Rust path (`api::endpoint_health::listed_health`,
/// `engine::fifo_order_holds_across_a_sigkill_of_the_binary`): each such
/// path names a module of the library (or of this test binary) that
/// defines its first item, and every further part (a method, a variant, a
/// field) is defined somewhere in the sources, so a rename or a move
/// fails here instead of leaving a map that sends readers nowhere.
#[test]
fn the_docs_name_only_code_that_exists() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let library = repo.join("crates/herald/src");
    let tests = repo.join("crates/herald/tests/it");
    let mut docs = vec![
        repo.join("README.md"),
        repo.join("ARCHITECTURE.md"),
        repo.join("BENCHMARKS.md"),
    ];
    docs.extend(rust_or_markdown_files(&repo.join("docs"), "md"));
    let every_source: String = [&library, &tests]
        .iter()
        .flat_map(|dir| rust_or_markdown_files(dir, "rs"))
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{doc:?}: {e}"));
        for (n, line) in text.lines().enumerate() {
            for quoted in line.split('`').skip(1).step_by(2) {
                let Some(parts) = rust_path(quoted) else {
                    continue;
                };
                // A path that names no module of either is not a code
                // reference (`herald::…` crates, `sqlx::…`).
                let found: Vec<_> = [&library, &tests]
                    .iter()
                    .filter_map(|root| module_files(root, &parts))
                    .collect();
                if found.is_empty() {
                    continue;
                }
                checked += 1;
                let exists = found.iter().any(|(files, rest)| {
                    // The modules `on_both_stores!` makes around a test.
                    let rest: Vec<&str> = rest
                        .iter()
                        .copied()
                        .filter(|p| !["sqlite", "postgres", "postgres_only"].contains(p))
                        .collect();
                    let module: String = files
                        .iter()
                        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
                        .collect();
                    rest.first().is_none_or(|first| defines(&module, first))
                        && rest.iter().skip(1).all(|part| defines(&every_source, part))
                });
                if !exists {
                    wrong.push(format!("{}:{}: `{quoted}`", doc.display(), n + 1));
                }
            }
        }
    }
    // Guards the reading itself: the docs name dozens of paths.
    assert!(checked > 20, "only {checked} code paths read in the docs");
    assert!(
        wrong.is_empty(),
        "the docs name code that is not there:\n{}",
        wrong.join("\n")
    );
}

/// `a::b::c` (an optional `crate::` and trailing `()` left out) split in
/// its parts, or `None` for anything else in backticks.
fn rust_path(quoted: &str) -> Option<Vec<&str>> {
    let path = quoted.strip_prefix("crate::").unwrap_or(quoted);
    let path = path.strip_suffix("()").unwrap_or(path);
    let parts: Vec<&str> = path.split("::").collect();
    let is_ident = |p: &&str| {
        p.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let first_is_module = parts[0].chars().all(|c| c.is_ascii_lowercase() || c == '_');
    (parts.len() > 1 && first_is_module && parts.iter().all(is_ident)).then_some(parts)
}

/// The files of the deepest module `parts` names under `root` (a file
/// `x.rs` with its folder `x/`, or a folder), and the parts left after it.
fn module_files<'p>(
    root: &std::path::Path,
    parts: &'p [&'p str],
) -> Option<(Vec<std::path::PathBuf>, &'p [&'p str])> {
    let mut dir = root.to_path_buf();
    let mut files = None;
    for (i, part) in parts.iter().enumerate() {
        let file = dir.join(format!("{part}.rs"));
        let folder = dir.join(part);
        if !file.is_file() && !folder.is_dir() {
            return files.map(|f| (f, &parts[i..]));
        }
        let mut these = rust_or_markdown_files(&folder, "rs");
        if file.is_file() {
            these.push(file);
        }
        files = Some(these);
        dir = folder;
    }
    files.map(|f| (f, &parts[parts.len()..]))
}

/// Whether `source` defines `name`: an item, an enum variant or a field.
fn defines(source: &str, name: &str) -> bool {
    let followed_by_boundary = |at: usize| {
        source[at..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    };
    let item = [
        "fn ",
        "struct ",
        "enum ",
        "const ",
        "static ",
        "trait ",
        "type ",
        "mod ",
        "macro_rules! ",
    ]
    .iter()
    .any(|kind| {
        let needle = format!("{kind}{name}");
        source
            .match_indices(&needle)
            .any(|(at, _)| followed_by_boundary(at + needle.len()))
    });
    item || source.lines().any(|line| {
        let line = line.trim_start().trim_start_matches("pub ");
        line.strip_prefix(name)
            .is_some_and(|rest| matches!(rest.chars().next(), Some(',' | '(' | ' ' | ':' | '{')))
    })
}

/// The files ending in `.{extension}` below `dir`, at any depth.
fn rust_or_markdown_files(dir: &std::path::Path, extension: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_or_markdown_files(&path, extension));
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
    out
}
