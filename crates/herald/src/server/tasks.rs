//! The serving process's background tasks (the dispatcher loop, retention,
//! backups, …), watched: one that panics leaves the process unable to do
//! its work while its API still answers 202 and `/readyz` ready (messages
//! accepted, nothing sent), so the process stops instead, for its service
//! manager to start it again. Nothing is lost by that: a message is
//! answered 202 only once committed, and a claimed delivery's lease brings
//! it back. A task that returns (its work not wanted here, e.g. TLS reload
//! without a certificate file to watch) is simply done.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinError, JoinSet};

#[derive(Default)]
pub struct BackgroundTasks {
    tasks: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl BackgroundTasks {
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let id = self.tasks.spawn(task).id();
        self.names.insert(id, name);
    }

    fn failure(&mut self, id: Id, error: JoinError) -> anyhow::Error {
        let name = self.names.remove(&id).unwrap_or("a background task");
        let why = match error.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned()),
            Err(error) => error.to_string(),
        };
        anyhow::anyhow!("{name} stopped: {why}")
    }

    /// Resolves with the first task that failed (panicked); never while
    /// every task runs or has returned.
    pub async fn failed(&mut self) -> anyhow::Error {
        loop {
            match self.tasks.join_next_with_id().await {
                Some(Ok((id, ()))) => {
                    self.names.remove(&id);
                }
                Some(Err(error)) => {
                    let id = error.id();
                    return self.failure(id, error);
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Waits for every task to end (after shutdown was signalled); the
    /// first failure, if any.
    pub async fn join_all(&mut self) -> anyhow::Result<()> {
        let mut first = None;
        while let Some(ended) = self.tasks.join_next_with_id().await {
            match ended {
                Ok((id, ())) => {
                    self.names.remove(&id);
                }
                Err(error) => {
                    let failure = self.failure(error.id(), error);
                    tracing::error!(error = %failure, "background task failed");
                    first.get_or_insert(failure);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A task that returns is done; one that panics is reported by name.
    #[tokio::test]
    async fn a_panicking_task_is_reported_and_a_returning_one_is_not() {
        let mut tasks = BackgroundTasks::default();
        tasks.spawn("the early return", async {});
        tasks.spawn("the dispatcher", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("claimed more than it holds");
        });
        tasks.spawn("the steady one", std::future::pending());
        let failure = tasks.failed().await.to_string();
        assert_eq!(
            failure,
            "the dispatcher stopped: claimed more than it holds"
        );
    }

    /// While every task runs or has returned, nothing is reported.
    #[tokio::test(start_paused = true)]
    async fn running_and_returned_tasks_are_no_failure() {
        let mut tasks = BackgroundTasks::default();
        tasks.spawn("returns", async {});
        tasks.spawn("runs", std::future::pending());
        let waited = tokio::time::timeout(Duration::from_secs(3600), tasks.failed()).await;
        assert!(waited.is_err(), "reported a failure");
    }

    /// At shutdown every task is waited for, and a failure among them is
    /// returned after all have ended.
    #[tokio::test]
    async fn joining_waits_for_all_and_returns_the_failure() {
        let mut tasks = BackgroundTasks::default();
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ended.clone();
        tasks.spawn("slow", async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        tasks.spawn("broken", async { panic!("boom") });
        let joined = tasks.join_all().await;
        assert!(ended.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(
            joined.map_err(|e| e.to_string()),
            Err("broken stopped: boom".to_owned())
        );
    }
}
