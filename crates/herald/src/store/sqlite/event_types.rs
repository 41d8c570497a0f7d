//! The event-type catalogue on SQLite.

use super::*;

#[async_trait]
impl EventTypes for SqliteStore {
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        let et = et.clone();
        self.write(move |c| {
            let n = c
                .execute(
                    "INSERT INTO event_types (name, description, archived, deprecated, schemas, feature_flag, \
                     group_name, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                     ON CONFLICT DO NOTHING",
                    params![
                        et.name,
                        et.description,
                        et.archived,
                        et.deprecated,
                        et.schemas,
                        et.feature_flag,
                        et.group_name,
                        et.created_at,
                        et.updated_at
                    ],
                )?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "an event type named `{}` already exists",
                    et.name
                )));
            }
            Ok(())
        })
        .await
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let name = name.to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT * FROM event_types WHERE name = ?1")?;
            Ok(rows(&mut stmt, params![name], |r| event_type_from_row(r))?.pop())
        })
        .await
    }

    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>> {
        let sql = if include_archived {
            "SELECT * FROM event_types WHERE 1 = 1"
        } else {
            "SELECT * FROM event_types WHERE archived = 0"
        };
        let page = page.clone();
        self.read(move |c| {
            page_of(c, sql, "name", Vec::new(), &page, |r| {
                event_type_from_row(r)
            })
        })
        .await
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let et = et.clone();
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE event_types SET description = ?1, archived = ?2, deprecated = ?3, schemas = ?4, \
                     feature_flag = ?5, group_name = ?6, updated_at = ?7 WHERE name = ?8",
                    params![
                        et.description,
                        et.archived,
                        et.deprecated,
                        et.schemas,
                        et.feature_flag,
                        et.group_name,
                        et.updated_at,
                        et.name
                    ],
                )?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write(move |c| {
            let n = c.execute("DELETE FROM event_types WHERE name = ?1", params![name])?;
            Ok(n == 1)
        })
        .await
    }

    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>> {
        let list = to_json(&names)?;
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT value FROM json_each(?1) WHERE value NOT IN (SELECT name FROM event_types)",
            )?;
            let found = stmt.query_map(params![list], |r| r.get::<_, String>(0))?;
            found.collect::<Result<Vec<_>, _>>().map_err(map_err)
        })
        .await
    }
}
