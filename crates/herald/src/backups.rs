//! Scheduled backups of the SQLite store (`HERALD_BACKUP_DIR`,
//! `HERALD_BACKUP_INTERVAL`, `HERALD_BACKUP_KEEP`): the serving process
//! takes `herald backup`'s snapshot on schedule into the folder, named by
//! time (`herald-YYYYMMDDTHHMMSSZ.db`), and removes the oldest beyond the
//! count. A failure (disk full, folder gone) is logged and counted
//! (`herald_backup_failures_total`) and never stops delivery: the backup
//! runs on a blocking thread with a read connection of its own.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::config::ScheduledBackups;
use crate::store::now_millis;

const PREFIX: &str = "herald-";
const SUFFIX: &str = ".db";

/// What the dashboard shows of the schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupState {
    /// When the last backup succeeded (ms since the epoch), and its file.
    pub last_success: Option<(i64, PathBuf)>,
    /// Failures since the process started, and the last one's error.
    pub failures: u64,
    pub last_error: Option<String>,
}

/// The schedule's state, shared with the dashboard.
#[derive(Debug, Default)]
pub struct Backups {
    pub schedule: Option<ScheduledBackups>,
    state: Mutex<BackupState>,
}

impl Backups {
    pub fn new(schedule: Option<ScheduledBackups>) -> Self {
        Backups {
            schedule,
            state: Mutex::new(BackupState::default()),
        }
    }

    pub fn state(&self) -> BackupState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes one backup of the store at `store` now, then removes the
    /// oldest beyond the count. Errors are recorded, not returned.
    pub async fn take_one(&self, store: &Path) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        let name = format!(
            "{PREFIX}{}{SUFFIX}",
            chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
        );
        let target = schedule.dir.join(name);
        let (dir, store_path, target_path, keep) = (
            schedule.dir.clone(),
            store.to_path_buf(),
            target.clone(),
            schedule.keep,
        );
        let done = tokio::task::spawn_blocking(move || {
            // Keeps one fewer before the new one is renamed in: the folder
            // never holds more than `keep`.
            crate::store::sqlite::backup::backup_making_room(&store_path, &target_path, move || {
                prune(&dir, keep.saturating_sub(1))
            })
        })
        .await;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match done {
            Ok(Ok(summary)) => {
                let at = now_millis();
                tracing::info!(file = %target.display(), %summary, "scheduled backup taken");
                crate::metrics::backup_succeeded(at);
                state.last_success = Some((at, target));
            }
            Ok(Err(e)) => failed(&mut state, e.to_string()),
            Err(e) => failed(&mut state, format!("the backup task failed: {e}")),
        }
    }

    /// Takes a backup every `schedule.every` until `shutdown`.
    pub async fn run(self: std::sync::Arc<Self>, store: PathBuf, shutdown: CancellationToken) {
        let Some(every) = self.schedule.as_ref().map(|s| s.every) else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => return,
            }
            self.take_one(&store).await;
        }
    }
}

fn failed(state: &mut BackupState, error: String) {
    tracing::warn!(%error, "scheduled backup failed; delivery goes on");
    crate::metrics::backup_failed();
    state.failures += 1;
    state.last_error = Some(error);
}

/// Removes the oldest scheduled backups in `dir` beyond `keep` (names sort
/// by time). Only files named as this module names them are touched.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut ours: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(SUFFIX))
        })
        .collect();
    ours.sort();
    let excess = ours.len().saturating_sub(keep);
    for old in ours.into_iter().take(excess) {
        if let Err(e) = std::fs::remove_file(&old) {
            tracing::warn!(file = %old.display(), error = %e, "cannot remove an old backup");
        }
    }
}
