//! Scheduled backups of the SQLite store (`HERALD_BACKUP_*`): taken on
//! time into the folder, the oldest removed beyond the count, reported in
//! `/metrics` and on the dashboard; a failing one is counted and delivery
//! goes on.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::*;

/// The backup files in `dir`, sorted.
fn backups_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("herald-") && n.ends_with(".db"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_rotate_report_and_never_stop_delivery() {
    let backups = tempfile::tempdir().expect("tempdir");
    // Not made beforehand: scheduled backups make their folder.
    let dir = backups.path().join("herald-backups");
    let dir_text = dir.display().to_string();
    let app = spawn_app(&[
        ("HERALD_BACKUP_DIR", &dir_text),
        ("HERALD_BACKUP_INTERVAL", "150ms"),
        ("HERALD_BACKUP_KEEP", "2"),
    ])
    .await;
    let rx = Receiver::start().await;
    let (app_id, _) = app.app_with_endpoint(&rx.url("/hook"), json!({})).await;
    app.send_message(&app_id, "a.b", json!({"n": 1})).await;

    // Several rounds: never more than two kept.
    let deadline = Instant::now() + PATIENCE;
    let mut seen = std::collections::BTreeSet::new();
    // What a backup killed mid-copy leaves; the next one removes it.
    let partial = dir.join("herald-20200101T000000.000Z.db.partial");
    let mut left_partial = false;
    while seen.len() < 4 {
        assert!(Instant::now() < deadline, "backups seen: {seen:?}");
        if !left_partial && dir.is_dir() {
            std::fs::write(&partial, b"half a copy").expect("write");
            left_partial = true;
        }
        let now = backups_in(&dir);
        assert!(now.len() <= 2, "kept {now:?}");
        seen.extend(now);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!partial.exists(), "a partial backup is removed");
    let kept = backups_in(&dir);
    let copy = rusqlite::Connection::open(dir.join(kept.last().expect("a backup"))).expect("open");
    let messages: i64 = copy
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .expect("count");
    assert_eq!(messages, 1, "the backup holds the message");

    let metrics = app.metrics_text().await;
    let last = metrics
        .lines()
        .find(|l| l.starts_with("herald_backup_last_success_timestamp_seconds "))
        .unwrap_or_else(|| panic!("{metrics}"));
    let at: f64 = last
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(at > 1.7e9, "{last}");
    let browser = logged_in(&app).await;
    let page = browser.get(app.url("/dashboard")).text_answer().await;
    assert!(page.contains("Scheduled backups every"), "{page}");
    assert!(page.contains("last backup"), "{page}");

    // The folder cannot be made (a file has its name): failures are
    // counted, delivery goes on.
    std::fs::remove_dir_all(&dir).expect("remove the folder");
    std::fs::write(&dir, b"not a folder").expect("write");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let metrics = app.metrics_text().await;
        let failed = metrics
            .lines()
            .find(|l| l.starts_with("herald_backup_failures_total "))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0);
        if failed >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no failure counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.send_message(&app_id, "a.b", json!({"n": 2})).await;
    let got = rx.wait_for(2).await;
    assert_eq!(got.len(), 2, "delivery went on");
    app.shutdown().await;
}

#[test]
fn scheduled_backups_are_configured_with_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = |overrides: &[(&str, &str)]| -> String {
        let mut values: std::collections::BTreeMap<String, String> = [
            (
                "HERALD_DATABASE_URL".to_owned(),
                format!("sqlite://{}/h.db", dir.path().display()),
            ),
            ("HERALD_ADMIN_TOKEN".to_owned(), TOKEN.to_owned()),
        ]
        .into();
        for (k, v) in overrides {
            values.insert((*k).to_owned(), (*v).to_owned());
        }
        match herald::config::Config::from_values(&values) {
            Ok(_) => panic!("{overrides:?} must be refused"),
            Err(e) => e.to_string(),
        }
    };
    assert!(err(&[("HERALD_BACKUP_INTERVAL", "1h")]).contains("HERALD_BACKUP_DIR"));
    assert!(err(&[
        ("HERALD_BACKUP_INTERVAL", "soon"),
        ("HERALD_BACKUP_DIR", "/tmp")
    ])
    .contains("HERALD_BACKUP_INTERVAL"));
    assert!(err(&[("HERALD_BACKUP_KEEP", "0")]).contains("HERALD_BACKUP_KEEP"));
    assert!(err(&[
        ("HERALD_BACKUP_INTERVAL", "1h"),
        ("HERALD_BACKUP_DIR", "/tmp"),
        ("HERALD_DATABASE_URL", "postgres://127.0.0.1/x"),
    ])
    .contains("pg_dump"));
}
