//! Scheduled backups of the SQLite store (`HERALD_BACKUP_DIR`,
//! `HERALD_BACKUP_INTERVAL`, `HERALD_BACKUP_KEEP`): the serving process
//! takes `herald backup`'s snapshot on schedule into the folder, named by
//! time (`herald-YYYYMMDDTHHMMSS.sssZ.db`), and removes the oldest beyond
//! the count (those names only, never the store). The folder is made when
//! missing. A failure (disk full, folder not writable) is logged and
//! counted (`herald_backup_failures_total`) and never stops delivery: the
//! backup runs on a blocking thread with a read connection of its own. A
//! backup under way at shutdown is abandoned, not counted.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::config::ScheduledBackups;
use crate::store::now_millis;

const PREFIX: &str = "herald-";
const SUFFIX: &str = ".db";
/// The time in a backup's name (UTC, to the millisecond): names sort by it.
const STAMP: &str = "%Y%m%dT%H%M%S%.3fZ";

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
    /// oldest beyond the count. Errors are recorded, not returned; a
    /// backup stopped by `shutdown` is neither.
    pub async fn take_one(&self, store: &Path, shutdown: &CancellationToken) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        let name = format!("{PREFIX}{}{SUFFIX}", chrono::Utc::now().format(STAMP));
        let target = schedule.dir.join(name);
        let (dir, store_path, target_path, keep) = (
            schedule.dir.clone(),
            store.to_path_buf(),
            target.clone(),
            schedule.keep,
        );
        let stop = shutdown.clone();
        let done = tokio::task::spawn_blocking(move || {
            // Made here, not only at start: the folder may be a volume
            // mounted empty, or removed while serving.
            std::fs::create_dir_all(&dir).map_err(|e| {
                crate::store::StoreError::Unavailable(format!(
                    "cannot create {}: {e}",
                    dir.display()
                ))
            })?;
            remove_partials(&dir);
            // Keeps one fewer before the new one is renamed in: the folder
            // never holds more than `keep`.
            let live = store_path.clone();
            crate::store::sqlite::backup::backup_making_room(
                &store_path,
                &target_path,
                move || prune(&dir, keep.saturating_sub(1), &live),
                move || !stop.is_cancelled(),
            )
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
            Ok(Err(_)) if shutdown.is_cancelled() => {
                tracing::info!("scheduled backup stopped: the process is shutting down");
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
            self.take_one(&store, &shutdown).await;
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
/// by time). Only files named exactly as this module names them are
/// touched, and never the store itself (`live`), whatever its name: the
/// folder may be the store's own, and the store may be `herald-….db`.
fn prune(dir: &Path, keep: usize, live: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let live = std::fs::canonicalize(live).unwrap_or_else(|_| live.to_path_buf());
    let mut ours: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_backup_name)
        })
        .filter(|p| std::fs::canonicalize(p).map_or(true, |p| p != live))
        .collect();
    ours.sort();
    let excess = ours.len().saturating_sub(keep);
    for old in ours.into_iter().take(excess) {
        if let Err(e) = std::fs::remove_file(&old) {
            tracing::warn!(file = %old.display(), error = %e, "cannot remove an old backup");
        }
    }
}

/// Removes what a backup killed mid-copy left in `dir` (its `.partial`
/// file and that file's journal): as large as the store, and never
/// renamed. Called before a backup starts, when no copy of this process
/// is under way; only names of this module's backups are touched.
fn remove_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(Result::ok).map(|e| e.path()) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((backup, _)) = name.split_once(".partial") else {
            continue;
        };
        if is_backup_name(backup) {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove a partial backup");
            }
        }
    }
}

/// Whether `name` is a scheduled backup's: `herald-<STAMP>.db`.
fn is_backup_name(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(SUFFIX))
        .is_some_and(|stamp| chrono::NaiveDateTime::parse_from_str(stamp, STAMP).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted, after `files` were made in it and
    /// `act` ran on it.
    fn left_after(files: &[&str], act: impl FnOnce(&Path)) -> Vec<String> {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in files {
            std::fs::write(dir.path().join(name), b"x").expect("write");
        }
        act(dir.path());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        left
    }

    /// A store named like a backup, in the backups' folder, is never
    /// removed; nor is any other file of that form but a real backup.
    #[test]
    fn pruning_removes_only_old_backups_never_the_store() {
        let backups = [
            "herald-20261201T010203.004Z.db",
            "herald-20261202T010203.004Z.db",
            "herald-20261203T010203.004Z.db",
        ];
        let others = [
            "herald-main.db",
            "herald-0.db",
            "herald-main.db-wal",
            "notes.txt",
        ];
        let all: Vec<&str> = backups.iter().chain(others.iter()).copied().collect();
        let left = left_after(&all, |dir| prune(dir, 1, &dir.join("herald-main.db")));
        let mut expected = vec![backups[2].to_owned()];
        expected.extend(others.iter().map(|n| (*n).to_owned()));
        expected.sort();
        assert_eq!(left, expected);
        // Keeping none removes the backups, still not the store.
        let left = left_after(&all, |dir| prune(dir, 0, &dir.join("herald-main.db")));
        let mut others = others.map(str::to_owned);
        others.sort();
        assert_eq!(left, others);
    }

    /// A backup killed mid-copy leaves its `.partial` file (and journal);
    /// the next backup removes them, and nothing else.
    #[test]
    fn partial_backups_are_removed_and_nothing_else() {
        let partials = [
            "herald-20261201T010203.004Z.db.partial",
            "herald-20261201T010203.004Z.db.partial-journal",
        ];
        let others = [
            "herald-20261202T010203.004Z.db",
            "herald-main.db.partial",
            "store.db.partial",
        ];
        let all: Vec<&str> = partials.iter().chain(others.iter()).copied().collect();
        assert_eq!(left_after(&all, remove_partials), others.map(str::to_owned));
    }
}
