//! The one PostgreSQL fixture: the server's URL and the skip rule, a
//! throw-away schema per test dropped whether the test passed or not, a
//! store opened on it, and `on_both_stores!`, which runs a test on a
//! fresh SQLite store and on such a schema.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use herald::server::Role;
use herald::store::postgres::PostgresStore;
use herald::store::Store;

use super::{spawn_with_role, TestApp};

const POSTGRES_URL_VAR: &str = "HERALD_TEST_POSTGRES_URL";

/// The server named by `HERALD_TEST_POSTGRES_URL`, or `None` after saying
/// `SKIPPED (…): <test>` on stderr (`.ci/run` always sets it).
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            // Written to the real stderr, not through eprintln!, which the
            // test harness captures and hides for passing tests.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED ({POSTGRES_URL_VAR} unset): {test}"
            );
            None
        }
    }
}

/// Runs `test`, then `cleanup`, then lets a panic of the test go on.
async fn then_cleanup<T, C>(test: T, cleanup: C)
where
    T: Future<Output = ()>,
    C: Future<Output = ()>,
{
    let outcome = std::panic::AssertUnwindSafe(test).catch_unwind().await;
    cleanup.await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A throw-away schema on the test server (a clone names the same schema:
/// dropping either drops it).
#[derive(Clone)]
pub struct PgSchema {
    pub url: String,
    pub schema: String,
}

impl PgSchema {
    /// `None` (after saying SKIPPED on stderr) when no server is configured.
    pub fn new(test: &str) -> Option<PgSchema> {
        let url = postgres_url(test)?;
        Some(PgSchema {
            url,
            schema: format!("herald_test_{:016x}", rand::random::<u64>()),
        })
    }

    /// Drops the schema and everything in it; a failure is only said.
    pub async fn drop_schema(&self) {
        use sqlx::Connection;
        let dropped = async {
            let mut conn = sqlx::PgConnection::connect(&self.url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await
        }
        .await;
        if let Err(e) = dropped {
            eprintln!("could not drop schema {}: {e}", self.schema);
        }
    }

    /// Runs `test` (on a copy of the schema's name, which an `async move`
    /// block can own), then drops the schema, passed or not.
    pub async fn run<F, Fut>(self, test: F)
    where
        F: FnOnce(PgSchema) -> Fut,
        Fut: Future<Output = ()>,
    {
        then_cleanup(test(self.clone()), self.drop_schema()).await;
    }

    /// A fresh schema for `name`'s test, [`PgSchema::run`]; the test is
    /// skipped (said on stderr) when no server is configured.
    pub async fn for_test<F, Fut>(name: &str, test: F)
    where
        F: FnOnce(PgSchema) -> Fut,
        Fut: Future<Output = ()>,
    {
        if let Some(pg) = PgSchema::new(name) {
            pg.run(test).await;
        }
    }

    /// `HERALD_DATABASE_URL` and `HERALD_DATABASE_SCHEMA` for a Herald on it.
    pub fn env(&self) -> [(&str, &str); 2] {
        [
            ("HERALD_DATABASE_URL", self.url.as_str()),
            ("HERALD_DATABASE_SCHEMA", self.schema.as_str()),
        ]
    }

    /// The store, opened (and migrated) on this schema.
    pub async fn open(&self) -> PostgresStore {
        PostgresStore::open(&self.url, &self.schema)
            .await
            .expect("open postgres")
    }
}

/// A PostgreSQL store open on a throw-away schema.
pub struct PgStore {
    pub store: Arc<PostgresStore>,
    pub url: String,
    pub schema: String,
}

/// `None` (after saying so on stderr) when no server is configured.
pub async fn postgres(test: &str) -> Option<PgStore> {
    let pg = PgSchema::new(test)?;
    let store = pg.open().await;
    Some(PgStore {
        store: Arc::new(store),
        url: pg.url,
        schema: pg.schema,
    })
}

/// A PostgreSQL store of a test's own (as `dyn Store`), with the URL and
/// schema it is in, for connections the test makes beside it.
pub struct OnPostgres {
    pub store: Arc<dyn Store>,
    pub url: String,
    pub schema: String,
}

/// Runs `test` on an [`OnPostgres`], then drops the schema; without a
/// server, says that `name` is skipped.
pub async fn on_postgres<F, Fut>(name: &str, test: F)
where
    F: FnOnce(OnPostgres) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(f) = postgres(name).await else {
        return;
    };
    let (url, schema) = (f.url.clone(), f.schema.clone());
    f.run(|store| test(OnPostgres { store, url, schema })).await
}

impl PgStore {
    /// Runs `test` on the store as `dyn Store`, then drops the schema.
    pub async fn run<F, Fut>(self, test: F)
    where
        F: FnOnce(Arc<dyn Store>) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.run_postgres(|store| {
            let store: Arc<dyn Store> = store;
            test(store)
        })
        .await
    }

    /// Like `run`, with the store's own type (its schema and url are in
    /// `self`, to be copied out before).
    pub async fn run_postgres<F, Fut>(self, test: F)
    where
        F: FnOnce(Arc<PostgresStore>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let store = self.store.clone();
        let schema = PgSchema {
            url: self.url,
            schema: self.schema,
        };
        then_cleanup(test(store), async {
            self.store.close().await;
            schema.drop_schema().await;
        })
        .await;
    }
}

/// Where a test's data lives: a fresh SQLite file, or a throw-away
/// PostgreSQL schema.
pub enum Backend {
    Sqlite,
    Postgres(PgSchema),
}

impl Backend {
    /// The environment that points a Herald at this backend, then `overrides`.
    pub fn with_database<'a>(
        &'a self,
        overrides: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let mut all = Vec::new();
        if let Backend::Postgres(pg) = self {
            all.extend(pg.env());
        }
        all.extend_from_slice(overrides);
        all
    }

    /// `spawn_app` on this backend.
    pub async fn spawn_app(&self, overrides: &[(&str, &str)]) -> TestApp {
        spawn_with_role(&self.with_database(overrides), Role::All).await
    }

    /// `spawn_stepped` on this backend.
    pub async fn spawn_stepped(&self, overrides: &[(&str, &str)]) -> TestApp {
        spawn_with_role(&self.with_database(overrides), Role::Api).await
    }

    /// Runs `test` on a fresh store of this backend (SQLite: in a
    /// temporary folder), then drops the PostgreSQL schema, passed or not.
    pub async fn run_on_store<F, Fut>(self, test: F)
    where
        F: FnOnce(Arc<dyn Store>) -> Fut,
        Fut: Future<Output = ()>,
    {
        match self {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let url = format!("sqlite://{}", dir.path().join("store.db").display());
                let store = herald::store::sqlite::SqliteStore::open(&url)
                    .await
                    .expect("open sqlite");
                test(Arc::new(store)).await;
            }
            Backend::Postgres(pg) => {
                let store = pg.open().await;
                PgStore {
                    store: Arc::new(store),
                    url: pg.url,
                    schema: pg.schema,
                }
                .run(test)
                .await;
            }
        }
    }
}

/// Defines, for each test named, one test on SQLite (in a module
/// `sqlite`) and one on PostgreSQL (`postgres`, skipped without
/// `HERALD_TEST_POSTGRES_URL`; its schema is dropped whether the test
/// passed or not).
///
/// - `on_both_stores!(a, b)`: `async fn a(backend: &Backend)`, which
///   starts Herald on it (`backend.spawn_app(…)`) or reads its settings;
/// - `on_both_stores!(store: a, b)`: `async fn a(store: Arc<dyn Store>)`,
///   on a fresh store opened directly (the conformance suite);
/// - `on_both_stores!(Fixture => a, b)`: `async fn a(db: Fixture)`, with
///   the test's own fixture made by `Fixture::sqlite()` and
///   `Fixture::postgres(test_name) -> Option<Fixture>`.
///
/// And for what only PostgreSQL has (locks between processes, LISTEN), in
/// a module `postgres_only`, skipped likewise and its schema dropped:
/// - `on_both_stores!(postgres: a, b)`: `async fn a(pg: PgSchema)`;
/// - `on_both_stores!(postgres_store: a, b)`: `async fn a(pg: OnPostgres)`,
///   a store opened on the schema, with the schema's URL and name.
#[macro_export]
macro_rules! on_both_stores {
    (postgres: $($test:ident),* $(,)?) => {
        $crate::on_both_stores!(@postgres_only $crate::helpers::PgSchema::for_test; $($test),*);
    };
    (postgres_store: $($test:ident),* $(,)?) => {
        $crate::on_both_stores!(@postgres_only $crate::helpers::postgres::on_postgres; $($test),*);
    };
    // `$run(name, test)` makes the fixture, runs the test, cleans up.
    (@postgres_only $run:path; $($test:ident),*) => {
        mod postgres_only {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let name = concat!(module_path!(), "::", stringify!($test));
                    $run(name, super::$test).await;
                }
            )*
        }
    };
    ($fixture:ident => $($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::$fixture::sqlite()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let name = concat!(module_path!(), "::", stringify!($test));
                    let Some(db) = super::$fixture::postgres(name) else {
                        return;
                    };
                    super::$test(db).await;
                }
            )*
        }
    };
    (store: $($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    $crate::helpers::Backend::Sqlite.run_on_store(super::$test).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let name = concat!(module_path!(), "::", stringify!($test));
                    let Some(pg) = $crate::helpers::PgSchema::new(name) else {
                        return;
                    };
                    $crate::helpers::Backend::Postgres(pg).run_on_store(super::$test).await;
                }
            )*
        }
    };
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(&$crate::helpers::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let name = concat!(module_path!(), "::", stringify!($test));
                    let Some(pg) = $crate::helpers::PgSchema::new(name) else {
                        return;
                    };
                    pg.run(|pg| async move {
                        super::$test(&$crate::helpers::Backend::Postgres(pg)).await
                    })
                    .await;
                }
            )*
        }
    };
}
