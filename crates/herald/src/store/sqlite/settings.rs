//! Named settings and the liveness probe, on SQLite.

use super::*;

#[async_trait]
impl Settings for SqliteStore {
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        self.read(move |c| {
            c.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(map_err)
        })
        .await
    }

    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write(move |c| {
            c.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![key, value],
            )?;
            c.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .map_err(map_err)
        })
        .await
    }

    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write(move |c| {
            c.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map(drop)
            .map_err(map_err)
        })
        .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(map_err))
            .await
    }
}
